//! Arbitrary bytes as a DNS query, over UDP and TCP, through parse,
//! decide and respond against a fixed mesh
//! (`ringway_dataplane::dns::fuzzing::query`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_dataplane::dns::fuzzing::query(data));
