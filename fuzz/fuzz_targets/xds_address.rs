//! Arbitrary bytes as the payload of an xDS `istio.workload.Address`
//! resource: conversion, round trip and upsert into a snapshot
//! (`ringway_controlplane::fuzzing::xds::address`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_controlplane::fuzzing::xds::address(data));
