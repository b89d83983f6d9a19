//! libFuzzer entry for the `shm_segment` target (`fuzz/harness/src/targets/shm_segment.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::shm_segment::run(data);
});
