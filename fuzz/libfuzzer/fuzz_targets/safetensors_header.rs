//! libFuzzer entry for the `safetensors_header` target (`fuzz/harness/src/targets/safetensors_header.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::safetensors_header::run(data);
});
