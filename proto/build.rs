//! Compiles `proto/**/*.proto` without a system `protoc`: `protox` parses the
//! files into a `FileDescriptorSet`, `prost-build` turns the messages into
//! Rust, and `tonic-prost-build` adds gRPC client and server stubs.

use std::path::PathBuf;

/// Root `.proto` files; their imports are pulled in automatically.
const PROTOS: &[&str] = &[
    "istio/workload/workload.proto",
    "istio/security/authorization.proto",
    "istio/ca/ca.proto",
    "envoy/service/discovery/v3/ads.proto",
    "istio/zds/zds.proto",
];

/// Raw-IP `bytes` fields that are cheaper to hand around as `bytes::Bytes`
/// (decoding a `Bytes` buffer slices it instead of copying).
const BYTES_FIELDS: &[&str] = &[
    ".istio.workload.Workload.addresses",
    ".istio.workload.NetworkAddress.address",
    ".istio.security.Address.address",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());

    let fds = protox::compile(PROTOS, [&root])?;
    // protox reports every file it read (our imports too); re-run on edits.
    for file in &fds.file {
        let name = file.name();
        if !name.starts_with("google/protobuf/") {
            println!("cargo:rerun-if-changed={}", root.join(name).display());
        }
    }

    let services = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Leave out the `connect()` helpers so the stubs need no tonic
        // transport; callers build their own `Channel`.
        .build_transport(false)
        .service_generator();

    let mut config = prost_build::Config::new();
    config
        .bytes(BYTES_FIELDS)
        // `impl prost::Name` for every message, so `prost_types::Any::from_msg`
        // and `Any::to_msg` work with the type URLs xDS uses.
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com")
        .service_generator(services);
    config.compile_fds(fds)?;
    Ok(())
}
