//! Arbitrary bytes as the payload of an xDS `istio.security.Authorization`
//! resource: conversion, the unreadable fallback, compile and decide
//! (`ringway_controlplane::fuzzing::xds::authorization`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_controlplane::fuzzing::xds::authorization(data));
