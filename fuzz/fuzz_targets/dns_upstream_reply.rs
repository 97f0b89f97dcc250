//! Arbitrary bytes as an upstream resolver's reply to forwarded queries
//! (`ringway_dataplane::dns::fuzzing::upstream_reply`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ringway_dataplane::dns::fuzzing::upstream_reply(data)
});
