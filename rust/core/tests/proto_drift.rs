//! Guards the checked-in `src/proto/onnx.rs` against drift from `proto/onnx.proto` (copied from the
//! pinned onnx wheel). Set `FASTONNX_REGEN_PROTO=1` to rewrite it after bumping onnx.

use std::path::PathBuf;

#[test]
fn generated_onnx_rs_matches_the_proto() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile([root.join("proto/onnx.proto")], [root.join("proto")])?;
    let out = tempfile::tempdir()?;
    let mut cfg = prost_build::Config::new();
    cfg.out_dir(out.path());
    cfg.compile_fds(fds)?;
    let generated = std::fs::read_to_string(out.path().join("onnx.rs"))?;
    let checked_in_path = root.join("src/proto/onnx.rs");
    if std::env::var_os("FASTONNX_REGEN_PROTO").is_some() {
        std::fs::write(&checked_in_path, &generated)?;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path)?;
    assert!(
        checked_in == generated,
        "src/proto/onnx.rs is stale: run FASTONNX_REGEN_PROTO=1 cargo test -p fastonnx-core --test proto_drift"
    );
    Ok(())
}
