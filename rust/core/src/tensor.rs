//! Tensor bytes: owned (small constants) or borrowed from memory someone else keeps alive (torch storage
//! seen through the buffer protocol), so that weights are never copied on their way to the file.

use std::fmt;

/// Memory owned elsewhere and kept alive by the implementor, readable from any thread.
pub trait ByteSource: Send + Sync {
    fn bytes(&self) -> &[u8];
}

pub enum TensorData {
    Owned(Vec<u8>),
    Borrowed(Box<dyn ByteSource>),
}

impl TensorData {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            TensorData::Owned(v) => v,
            TensorData::Borrowed(b) => b.bytes(),
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_borrowed(&self) -> bool {
        matches!(self, TensorData::Borrowed(_))
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_borrowed() {
            "borrowed"
        } else {
            "owned"
        };
        write!(f, "TensorData({kind}, {} bytes)", self.len())
    }
}

impl Clone for TensorData {
    /// Cloning copies the bytes; only subgraph round trips and tests do it, never the export path.
    fn clone(&self) -> Self {
        TensorData::Owned(self.as_slice().to_vec())
    }
}

/// An initializer or a tensor attribute.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: i32,
    pub dims: Vec<i64>,
    pub data: TensorData,
}

impl Tensor {
    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }
}

/// Checks that `len` bytes hold exactly a tensor of `dtype` and `dims`.
pub fn check_size(what: &str, dtype: i32, dims: &[i64], len: usize) -> crate::Result<()> {
    if let Some(d) = dims.iter().find(|d| **d < 0) {
        return Err(crate::error::graph_err(format!(
            "{what}: negative dimension {d} in shape {dims:?}"
        )));
    }
    let Some(item) = crate::dtype::item_size(dtype) else {
        return Err(crate::error::graph_err(format!(
            "{what}: element type {dtype} ({}) cannot be stored as raw bytes",
            crate::dtype::name(dtype)
        )));
    };
    let numel: i64 = dims.iter().product();
    let expected = numel as u128 * item as u128;
    if expected != len as u128 {
        return Err(crate::error::graph_err(format!(
            "{what}: {len} bytes do not hold a {} tensor of shape {dims:?} ({expected} bytes expected)",
            crate::dtype::name(dtype)
        )));
    }
    Ok(())
}
