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
//!   At the onnxruntime level too: `com.microsoft.GroupQueryAttention` (cache append and attention in
//!   one kernel; commit 1c6951b) ran 0-15% slower than this form on onnxruntime 1.31's CPU kernel
//!   (one thread, past 512-4000), and the prefill 4% slower, so it is not emitted here.
//! - [`shared_cache`]: at the onnxruntime level, in a decoder whose caches the runtime shares with
//!   its present outputs (`Graph::shared_cache_mask`), `GroupQueryAttention` after all: there it
//!   spares the copy of the whole cache each step's Concat makes (any opset; it runs first).
//!   Attention with sinks (GPT-OSS's, [`sink_chain`]) fuses there too, the sinks its `head_sink`.
//! - [`gqa_rotary`]: after the rotary fusions, the query's and key's rotary embedding moves into that
//!   kernel, and once the products are packed it reads the packed query-key-value product.
//!
//! A Llama's rotated 4-D queries stay decomposed below opset 23: the contrib operator takes a 3-D query,
//! and transposing back would cost what the fusion saves. The passes run before the peephole rewrites,
//! which would compose the key's two Transposes into one the matcher does not know.

mod chain;
pub(crate) mod gqa_rotary;
pub(crate) mod grouped;
pub(crate) mod multi_head;
pub(crate) mod open_masks;
pub(crate) mod shared_cache;
mod sink_chain;
pub(crate) mod standard;
