//! Compile `proto/modal_api.proto` with protox (a protobuf compiler in
//! Rust: no system `protoc` needed) and generate the tonic client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/modal_api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    // The descriptor itself, for the test that checks it against Modal's.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("modal_api.descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
