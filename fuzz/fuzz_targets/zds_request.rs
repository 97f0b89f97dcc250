//! Arbitrary bytes as packets from the node agent (ZDS), with
//! descriptors and truncation, through the client's request handling
//! (`ringway_controlplane::fuzzing::zds::requests`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_controlplane::fuzzing::zds::requests(data));
