//! libFuzzer entry for the `proto_convert` target (`fuzz/harness/src/targets/proto_convert.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = sluice_fuzz::targets::proto_convert::run(data);
});
