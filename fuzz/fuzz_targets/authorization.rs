//! Policies, a workload and connections drawn from the bytes, decided by
//! the compiled evaluator on two snapshots and by the reference
//! (`ringway_controlplane::fuzzing::authz::decide_all`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_controlplane::fuzzing::authz::decide_all(data));
