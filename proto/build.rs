//! Generates the expertd v1 client and server into `OUT_DIR`. The proto is parsed by `protox`
//! (pure Rust), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "expertd/v1/expert.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec plus a scan of each `MoeLayerRequest` before it is decoded.
        .codec_path("crate::codec::CheckedCodec")
        .compile_fds(fds)?;
    Ok(())
}
