//! Arbitrary bytes as a LOCAL_XDS config file through the loader
//! (`ringway_controlplane::fuzzing::local::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_controlplane::fuzzing::local::config(data));
