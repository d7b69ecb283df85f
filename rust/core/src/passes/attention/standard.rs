//! The attention chain (see [`super::chain`]) fused into ONNX's `Attention` (standard from opset 23):
//! `Attention(q, k, v, mask | bias, scale = scale)`. The closed rows' Where goes: Attention's
//! specification (opset 23, with the errata onnx 1.23 documents) gives a zero output row where every
//! key is masked, as torch does; so does a Where whose flag folded to all-false constants, and a
//! boolean mask folded to all-true constants (no padding) is dropped. Keys and values repeated per
//! query-head group are fed unrepeated: Attention maps query head i to key/value head i // group, the
//! same order.

use super::chain::match_chain;
use crate::graph::Graph;
use crate::passes::matching::float_attr;
use crate::passes::rewrite::{fuse, Rewrite};

/// Fuses every attention chain into `Attention`; returns how many it fused.
pub(crate) fn fuse_attention(g: &mut Graph) -> usize {
    fuse(g, &["Softmax"], match_chain, |_, c| {
        let mut inputs = vec![c.q, c.k, c.v];
        inputs.extend(c.mask);
        let attrs = vec![float_attr("scale", c.scale)];
        let rewrite = Rewrite::replace(c.last, "Attention", "", inputs, attrs);
        Some(rewrite.removing(c.dead))
    })
}
