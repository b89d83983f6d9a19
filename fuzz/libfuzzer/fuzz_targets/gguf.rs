//! libFuzzer entry for the `gguf` target (`fuzz/harness/src/targets/gguf.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::gguf::run(data);
});
