//! fastonnx's core: the graph builder (names, types, constants, initializers borrowed from their
//! owner's memory), optimization passes and the streaming ONNX writer. No Python here: the
//! `fastonnx-python` crate wraps this in one pyclass.

pub mod dtype;
pub mod error;
pub mod functions;
pub mod graph;
pub mod hook;
pub mod infer;
pub mod model;
pub mod names;
pub mod passes;
pub mod permute;
pub mod prefetch;
pub mod proto;
pub mod scopes;
pub mod temp;
pub mod tensor;
pub mod writer;

#[cfg(test)]
mod testing;

pub use error::{Error, Result};
pub use graph::{AttrValue, Attribute, Dim, Graph, Node, TiedKey, ValueType};
pub use model::{Function, Model};
pub use scopes::{Scope, SharedScopes};
pub use tensor::{ByteSource, Fetch, Permutation, Tensor, TensorData};
