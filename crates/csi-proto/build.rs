//! Compiles the vendored CSI protocol definition without a `protoc` binary:
//! `protox` parses the .proto into a descriptor set, `tonic-prost-build` generates
//! the prost messages and the tonic client and server stubs from it, which encode with
//! `CsiCodec` (smaller buffers than tonic's default).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/csi.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::CsiCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
