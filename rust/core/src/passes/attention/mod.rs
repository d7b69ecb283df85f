//! Scaled dot-product attention, as the converter decomposes it (see [`chain`]), in four passes that
//! share one matcher:
//!
//! - [`standard`]: from opset 23, the chain becomes the standard `Attention` operator (both levels).
//! - [`multi_head`]: below opset 23, at the onnxruntime level, chains whose heads are split from 3-D
//!   projections (BERT, ViT) become `com.microsoft.MultiHeadAttention`.
//! - [`open_masks`]: below opset 23, the Wheres of an all-true constant mask and of an all-false
//!   constant closed-rows flag are removed from the chains left (models without padding, ViT).
//! - [`grouped`]: below opset 23, chains reading keys and values repeated per query-head group read
//!   them unrepeated, the group's query heads stacked along the rows (no Expand of the KV cache).
//!
//! A Llama's rotated 4-D queries stay decomposed below opset 23: the contrib operator takes a 3-D query,
//! and transposing back would cost what the fusion saves. The three run before the peephole rewrites,
//! which would compose the key's two Transposes into one the matcher does not know.

mod chain;
pub(crate) mod group_query;
pub(crate) mod grouped;
pub(crate) mod multi_head;
pub(crate) mod open_masks;
pub(crate) mod standard;

/// A Transpose's `perm` attribute.
pub(super) fn perm(p: &[i64]) -> crate::graph::Attribute {
    crate::graph::Attribute {
        name: "perm".into(),
        value: crate::graph::AttrValue::Ints(p.to_vec()),
    }
}
