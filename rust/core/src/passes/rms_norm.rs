//! RMS normalization, as models write it by hand (Llama, Mistral, Qwen, Gemma…), fused into one node:
//!
//! ```text
//! ms  = ReduceMean(x * x  |  Pow(x, 2), axes = [last], keepdims = 1)
//! inv = Reciprocal(Sqrt(ms + eps))        y = x * inv        out = y * w
//!   or  y = x / Sqrt(ms + eps)
//! ```
//!
//! becomes `RMSNormalization(x, w)` (standard from opset 23) or onnxruntime's
//! `SimplifiedLayerNormalization(x, w)` (any opset; the pipeline says which where). onnxruntime's own
//! session optimizer does not recognise this form (it looks for Pow and Div), so the fused node is
//! what makes it one kernel.
//! Only float32 chains are fused: lower precisions go through Casts whose rounding the fused kernels
//! would change.

use super::matching::{
    f32_scalar, float_attr, int_attr, is_float, is_op, other, rank, reduces_last_axis, sole_reader,
    Index,
};
use super::rewrite::{fuse, Rewrite};
use crate::dtype;
use crate::graph::{Dim, Graph};

struct Chain {
    x: String,
    eps: f32,
    weight: String,
    /// nodes replaced by the fused one (the final weight Mul is rewritten in place)
    dead: Vec<usize>,
    last: usize,
}

/// RMS norms → the standard `RMSNormalization` (opset 23 on); returns how many it fused.
pub(crate) fn fuse_standard(g: &mut Graph) -> usize {
    fuse_as(g, "RMSNormalization")
}

/// RMS norms → onnxruntime's `SimplifiedLayerNormalization` (any opset); returns how many it fused.
pub(crate) fn fuse_contrib(g: &mut Graph) -> usize {
    fuse_as(g, "SimplifiedLayerNormalization")
}

fn fuse_as(g: &mut Graph, op: &str) -> usize {
    // onnxruntime registers SimplifiedLayerNormalization in the default domain
    fuse(g, &["ReduceMean"], match_chain, |_, c| {
        let attrs = vec![
            int_attr("axis", -1),
            float_attr("epsilon", c.eps),
            int_attr("stash_type", 1),
        ];
        let rewrite = Rewrite::replace(c.last, op, "", vec![c.x, c.weight], attrs);
        Some(rewrite.removing(c.dead))
    })
}

fn match_chain(g: &Graph, ix: &Index, mean_at: usize) -> Option<Chain> {
    let mean = &g.nodes[mean_at];
    // x * x or Pow(x, 2)
    let sq_at = *ix.prod.get(mean.inputs.first()?)?;
    let sq = &g.nodes[sq_at];
    let x = match (sq.op_type.as_str(), sq.inputs.as_slice()) {
        ("Mul", [a, b]) if a == b && sq.domain.is_empty() => a.clone(),
        ("Pow", [a, p]) if sq.domain.is_empty() && f32_scalar(g, p)? == 2.0 => a.clone(),
        _ => return None,
    };
    if ix.reads.get(&sq.outputs[0]) != Some(&1) || !is_float(g, &x) {
        return None;
    }
    let x_rank = rank(g, &x)?;
    if x_rank == 0 || !reduces_last_axis(g, mean, x_rank) {
        return None;
    }
    // + eps
    let (add_at, add) = sole_reader(g, ix, &mean.outputs[0])?;
    if !is_op(add, "Add") {
        return None;
    }
    let eps = f32_scalar(g, other(add, &mean.outputs[0])?)?;
    // Sqrt, then Reciprocal and Mul by x, or Div of x
    let (sqrt_at, sqrt) = sole_reader(g, ix, &add.outputs[0])?;
    if !is_op(sqrt, "Sqrt") {
        return None;
    }
    let (next_at, next) = sole_reader(g, ix, &sqrt.outputs[0])?;
    let mut dead = vec![sq_at, mean_at, add_at, sqrt_at];
    let normed_at = if is_op(next, "Reciprocal") {
        let (mul_at, mul) = sole_reader(g, ix, &next.outputs[0])?;
        if !is_op(mul, "Mul") || other(mul, &next.outputs[0])? != x {
            return None;
        }
        dead.extend([next_at, mul_at]);
        mul_at
    } else if is_op(next, "Div") && next.inputs == [x.clone(), sqrt.outputs[0].clone()] {
        dead.push(next_at);
        next_at
    } else {
        return None;
    };
    // * weight (1-D, the normalized axis' length)
    let normed = &g.nodes[normed_at].outputs[0];
    let (last, scale) = sole_reader(g, ix, normed)?;
    if !is_op(scale, "Mul") {
        return None;
    }
    let weight = other(scale, normed)?.to_owned();
    // a weight, or a value of its type (a local function's weight input)
    let (w_dtype, w_dims) = if let Some(w) = g.initializer(&weight) {
        (w.dtype, w.dims.iter().map(|&d| Dim::Fixed(d)).collect())
    } else {
        let t = g.value_type(&weight)?;
        (t.dtype?, t.shape.clone()?)
    };
    let last_dim = g.value_type(&x)?.shape.as_ref()?.last()?.clone();
    if w_dtype != dtype::FLOAT
        || w_dims.len() != 1
        || !matches!(last_dim, Dim::Fixed(_))
        || last_dim != w_dims[0]
    {
        return None;
    }
    Some(Chain {
        x,
        eps,
        weight,
        dead,
        last,
    })
}
