//! Arbitrary bytes as a SOCKS5 client's greeting and request, read as
//! the server reads them
//! (`ringway_dataplane::proxy::fuzzing::socks5`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_dataplane::proxy::fuzzing::socks5(data));
