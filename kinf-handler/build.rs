//! Generates the gRPC code (Kinference's `Handler` service and the subset of Envoy's
//! external-processing protocol) from `proto/`, with `protox` (a pure-Rust protobuf compiler:
//! no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not when it is compiled: a target directory shared by
    // checkouts at different paths (scripts/test.sh caches one) reuses the compiled script.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let files = [
        "kinference/handler/v1/handler.proto",
        "envoy/service/ext_proc/v3/external_processor.proto",
    ];
    let fds = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        // Decode errors are INVALID_ARGUMENT, not INTERNAL (src/grpc/codec.rs).
        .codec_path("crate::grpc::codec::Codec")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
