//! libFuzzer entry for the `http_params` target (`fuzz/harness/src/targets/http_params.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::http_params::run(data);
});
