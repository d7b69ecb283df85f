//! The ONNX protobuf types, generated once by prost from `proto/onnx.proto` (see tests/proto_drift.rs).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod onnx {
    include!("onnx.rs");
}
