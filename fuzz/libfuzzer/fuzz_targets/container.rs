//! libFuzzer entry for the `container` target (`fuzz/harness/src/targets/container.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::container::run(data);
});
