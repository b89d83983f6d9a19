//! libFuzzer entry for the `shm_ring` target (`fuzz/harness/src/targets/shm_ring.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::shm_ring::run(data);
});
