//! RMS normalization, as models write it by hand (Llama, Mistral, Qwen, Gemma…), fused into one node:
//!
//! ```text
//! ms  = ReduceMean(x * x  |  Pow(x, 2), axes = [last], keepdims = 1)
//! inv = Reciprocal(Sqrt(ms + eps))        y = x * inv        out = y * w
//!   or  y = x / Sqrt(ms + eps)
//! ```
//!
//! becomes `RMSNormalization(x, w)` (standard from opset 23) or, at the onnxruntime level, its
//! `SimplifiedLayerNormalization(x, w)` (any opset). onnxruntime's own session optimizer does not
//! recognise this form (it looks for Pow and Div), so the fused node is what makes it one kernel.
//! Only float32 chains are fused: lower precisions go through Casts whose rounding the fused kernels
//! would change.

use std::collections::HashSet;

use super::matching::{
    f32_scalar, is_float, is_op, other, rank, reduces_last_axis, sole_reader, Index,
};
use super::{retain_nodes, Level};
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph};

/// The standard RMSNormalization operator's first opset.
const RMS_NORMALIZATION_OPSET: i64 = 23;

struct Chain {
    x: String,
    eps: f32,
    weight: String,
    /// nodes replaced by the fused one (the final weight Mul is rewritten in place)
    dead: Vec<usize>,
    last: usize,
}

/// Fuses every RMS-norm chain the level and opset allow; returns how many it fused.
pub fn fuse_rms_norm(g: &mut Graph, level: Level, opset: i64) -> usize {
    let op = match level {
        Level::None => return 0,
        Level::OnnxRuntime => "SimplifiedLayerNormalization",
        Level::Default if opset >= RMS_NORMALIZATION_OPSET => "RMSNormalization",
        Level::Default => return 0,
    };
    let index = Index::new(g);
    let chains: Vec<Chain> = (0..g.nodes.len())
        .filter(|&i| is_op(&g.nodes[i], "ReduceMean"))
        .filter_map(|i| match_chain(g, &index, i))
        .collect();
    let mut dead = HashSet::new();
    for c in &chains {
        let n = &mut g.nodes[c.last];
        n.op_type = op.to_owned();
        n.domain.clear();
        n.inputs = vec![c.x.clone(), c.weight.clone()];
        n.attrs = vec![
            Attribute {
                name: "axis".into(),
                value: AttrValue::Int(-1),
            },
            Attribute {
                name: "epsilon".into(),
                value: AttrValue::Float(c.eps),
            },
            Attribute {
                name: "stash_type".into(),
                value: AttrValue::Int(1),
            },
        ];
        dead.extend(c.dead.iter().copied());
    }
    retain_nodes(g, |i| !dead.contains(&i));
    chains.len()
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
    let w = g.initializer(&weight)?;
    let last_dim = g.value_type(&x)?.shape.as_ref()?.last()?.clone();
    if w.dtype != dtype::FLOAT || w.dims.len() != 1 || last_dim != Dim::Fixed(w.dims[0]) {
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
