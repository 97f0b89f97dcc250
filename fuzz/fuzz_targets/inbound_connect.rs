//! Arbitrary bytes as one inbound HBONE CONNECT stream: validation,
//! target, upstream, authorization and the PROXY header
//! (`ringway_dataplane::app::fuzzing::inbound_connect`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_dataplane::app::fuzzing::inbound_connect(data));
