//! LayerNorm written out elementwise (by hand in a model, or by a decomposition), fused back into one
//! `LayerNormalization` node (standard from opset 17). Only float32 chains are fused.
//!
//! ```text
//! m = ReduceMean(x, axes = [last], keepdims = 1)      d = x - m
//! v = ReduceMean(Pow(d, 2) | d * d, same axes)        r = Sqrt(v + eps)
//! n = d / r  |  d * Reciprocal(r)                     [n * gamma]  [+ beta]
//! (or d's RMS norm, when the RMS-norm fusion took the inner part first: RMSNormalization(d, gamma) or
//!  SimplifiedLayerNormalization(d, gamma), then [+ beta])
//! -> LayerNormalization(x, gamma | ones, [beta], axis = -1, epsilon = eps)
//! ```
//!
//! The last node of the chain is rewritten in place (its output keeps its name); the other nodes are
//! dropped. Every value inside a chain must be read only by the chain (d by its square and its
//! division), and every constant must be one element of at most x's rank, so the fused node's output
//! has the shape the chain's had.

use super::matching::{
    f32_scalar, float_attr, int_attr, is_float, is_op, other, output, rank, reduces_last_axis,
    scalar, sole_producer, sole_reader, Index,
};
use super::rewrite::{fuse, Rewrite};
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph};

/// One matched chain: the node `last` becomes the LayerNormalization, the nodes in `dead` go.
struct LayerNorm {
    last: usize,
    dead: Vec<usize>,
    /// x, then gamma and beta when the chain has them
    inputs: Vec<String>,
    eps: f32,
    /// a chain without gamma: a ones scale of this length is inserted as the second input
    ones: Option<i64>,
}

/// Fuses every decomposed LayerNorm (opset 17 on); returns how many it fused.
pub(crate) fn fuse_layer_norm(g: &mut Graph) -> usize {
    // onnxruntime registers SimplifiedLayerNormalization in the default domain
    let anchors = [
        "ReduceMean",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
    ];
    let find = |g: &Graph, ix: &Index, i: usize| {
        let found = if is_op(&g.nodes[i], "ReduceMean") {
            match_layer_norm(g, ix, i)
        } else {
            match_layer_norm_of_rms(g, ix, i)
        };
        // the fused node takes the last node's place, so it must have the one output
        found.filter(|f| output(&g.nodes[f.last]).is_some())
    };
    fuse(g, &anchors, find, |g, f| {
        let mut inputs = f.inputs;
        if let Some(len) = f.ones {
            let bytes = (0..len).flat_map(|_| 1.0f32.to_le_bytes()).collect();
            // cannot fail: the length is a shape dimension, so the byte count matches it
            let ones = g
                .add_constant("layer_norm_ones", dtype::FLOAT, vec![len], bytes)
                .ok()?;
            inputs.insert(1, ones);
        }
        let attrs = vec![
            int_attr("axis", -1),
            float_attr("epsilon", f.eps),
            int_attr("stash_type", 1),
        ];
        let rewrite = Rewrite::replace(f.last, "LayerNormalization", "", inputs, attrs);
        Some(rewrite.removing(f.dead))
    })
}

/// The last dimension of x, when fixed and not empty.
fn last_dim(g: &Graph, x: &str) -> Option<i64> {
    match g.value_type(x)?.shape.as_ref()?.last()? {
        Dim::Fixed(d) if *d > 0 => Some(*d),
        _ => None,
    }
}

/// A 1-D float32 tensor as long as x's last dimension (a LayerNorm scale or bias): a weight, or a
/// value of that type (a local function's weight input).
fn is_affine(g: &Graph, name: &str, last: i64) -> bool {
    match g.initializer(name) {
        Some(t) => t.dtype == dtype::FLOAT && t.dims == [last],
        None => g.value_type(name).is_some_and(|t| {
            t.dtype == Some(dtype::FLOAT) && t.shape.as_deref() == Some(&[Dim::Fixed(last)])
        }),
    }
}

/// `d = x - m` with `m = ReduceMean(x)` over the last axis.
struct Centered {
    x: String,
    m: String,
    sub: usize,
    mean: usize,
}

fn centered(g: &Graph, ix: &Index, d: &str) -> Option<Centered> {
    let sub = *ix.prod.get(d)?;
    let node = &g.nodes[sub];
    let [x, m] = node.inputs.as_slice() else {
        return None;
    };
    if !is_op(node, "Sub") || !is_float(g, x) {
        return None;
    }
    let mean = *ix.prod.get(m)?;
    let mean_node = &g.nodes[mean];
    let x_rank = rank(g, x)?;
    if !is_op(mean_node, "ReduceMean")
        || mean_node.inputs.first() != Some(x)
        || x_rank == 0
        || !reduces_last_axis(g, mean_node, x_rank)
    {
        return None;
    }
    Some(Centered {
        x: x.clone(),
        m: m.clone(),
        sub,
        mean,
    })
}

/// After the normalized value `n` (produced by `n_at`): optional `* gamma`, then optional `+ beta`.
/// Returns (gamma, beta, the last node, the nodes before it).
fn affine_tail(
    g: &Graph,
    ix: &Index,
    n_at: usize,
    last: i64,
) -> (Option<String>, Option<String>, usize, Vec<usize>) {
    let mut at = n_at;
    let mut before = Vec::new();
    let mut gamma = None;
    let mut beta = None;
    for (op, slot) in [("Mul", &mut gamma), ("Add", &mut beta)] {
        let Some(out) = output(&g.nodes[at]) else {
            break;
        };
        let Some((next_at, next)) = sole_reader(g, ix, out) else {
            break;
        };
        let Some(c) = other(next, out).filter(|c| is_op(next, op) && is_affine(g, c, last)) else {
            continue;
        };
        *slot = Some(c.to_owned());
        before.push(at);
        at = next_at;
    }
    (gamma, beta, at, before)
}

fn layer_norm(
    x: String,
    gamma: Option<String>,
    beta: Option<String>,
    eps: f32,
    last: i64,
) -> LayerNorm {
    let ones = gamma.is_none().then_some(last);
    LayerNorm {
        last: 0,
        dead: Vec::new(),
        inputs: [Some(x), gamma, beta].into_iter().flatten().collect(),
        eps,
        ones,
    }
}

/// The decomposed form, found from its variance ReduceMean. `x - m` may be one value read by the
/// square and the division, or computed twice (as `(x - u).pow(2)` and `(x - u) / ...` in a model's
/// code are, until CSE merges them later).
fn match_layer_norm(g: &Graph, ix: &Index, var_at: usize) -> Option<LayerNorm> {
    let var = &g.nodes[var_at];
    // the square of d: Pow(d, 2) or d * d
    let (sq_at, sq) = sole_producer(g, ix, var.inputs.first()?)?;
    let (d, d_reads_by_sq) = match (sq.op_type.as_str(), sq.inputs.as_slice()) {
        ("Mul", [a, b]) if a == b && sq.domain.is_empty() => (a.clone(), 2),
        ("Pow", [a, p]) if sq.domain.is_empty() && f32_scalar(g, p) == Some(2.0) => (a.clone(), 1),
        _ => return None,
    };
    let c = centered(g, ix, &d)?;
    let x = c.x;
    let x_rank = rank(g, &x)?;
    let last = last_dim(g, &x)?;
    if !reduces_last_axis(g, var, x_rank) {
        return None;
    }
    // + eps, Sqrt
    let v = output(var)?;
    let (add_at, add) = sole_reader(g, ix, v)?;
    if !is_op(add, "Add") {
        return None;
    }
    let eps = scalar(g, other(add, v)?, Some(x_rank))?;
    let (sqrt_at, sqrt) = sole_reader(g, ix, output(add)?)?;
    if !is_op(sqrt, "Sqrt") {
        return None;
    }
    // d / r, or d * Reciprocal(r)
    let r = output(sqrt)?;
    let (next_at, next) = sole_reader(g, ix, r)?;
    let mut dead = vec![c.mean, c.sub, sq_at, var_at, add_at, sqrt_at];
    let (n_at, numerator) = match (next.op_type.as_str(), next.inputs.as_slice()) {
        ("Div", [num, den]) if next.domain.is_empty() && den == r => (next_at, num.as_str()),
        ("Reciprocal", _) if next.domain.is_empty() => {
            let rr = output(next)?;
            let (mul_at, mul) = sole_reader(g, ix, rr)?;
            if !is_op(mul, "Mul") {
                return None;
            }
            dead.push(next_at);
            (mul_at, other(mul, rr)?)
        }
        _ => return None,
    };
    // the centered values and the mean are read by the chain only (and are no graph outputs)
    if numerator == d {
        if ix.reads.get(&d) != Some(&(d_reads_by_sq + 1)) || ix.reads.get(&c.m) != Some(&1) {
            return None;
        }
    } else {
        let c2 = centered(g, ix, numerator)?;
        if c2.x != x
            || c2.mean != c.mean
            || ix.reads.get(&d) != Some(&d_reads_by_sq)
            || ix.reads.get(numerator) != Some(&1)
            || ix.reads.get(&c.m) != Some(&2)
        {
            return None;
        }
        dead.push(c2.sub);
    }
    let (gamma, beta, last_at, before) = affine_tail(g, ix, n_at, last);
    dead.extend(before);
    Some(LayerNorm {
        last: last_at,
        dead,
        ..layer_norm(x, gamma, beta, eps, last)
    })
}

/// The form left when the RMS-norm fusion took `d / Sqrt(mean(d^2) + eps) * gamma` first: an RMS norm
/// of a centered value is a LayerNorm.
fn match_layer_norm_of_rms(g: &Graph, ix: &Index, rms_at: usize) -> Option<LayerNorm> {
    let rms = &g.nodes[rms_at];
    let [d, gamma] = rms.inputs.as_slice() else {
        return None;
    };
    if ix.reads.get(d) != Some(&1) {
        return None;
    }
    let Centered { x, m, sub, mean } = centered(g, ix, d)?;
    if ix.reads.get(&m) != Some(&1) {
        return None;
    }
    let x_rank = rank(g, &x)? as i64;
    let last = last_dim(g, &x)?;
    let axis = match rms.attr("axis") {
        Some(AttrValue::Int(a)) => *a,
        None => -1,
        _ => return None,
    };
    let stash = match rms.attr("stash_type") {
        Some(AttrValue::Int(s)) => *s,
        None => 1,
        _ => return None,
    };
    let eps = match rms.attr("epsilon") {
        Some(AttrValue::Float(e)) => *e,
        None => 1e-5,
        _ => return None,
    };
    if (axis != -1 && axis != x_rank - 1) || stash != 1 || !is_affine(g, gamma, last) {
        return None;
    }
    let dead = vec![mean, sub];
    // only a bias can follow: a second scale would have been the RMS fusion's weight
    let out = output(rms)?;
    let tail = sole_reader(g, ix, out).and_then(|(add_at, add)| {
        let b = other(add, out)?;
        (is_op(add, "Add") && is_affine(g, b, last)).then(|| (add_at, b.to_owned()))
    });
    let (last_at, beta, dead) = match tail {
        Some((add_at, b)) => (add_at, Some(b), [dead, vec![rms_at]].concat()),
        None => (rms_at, None, dead),
    };
    Some(LayerNorm {
        last: last_at,
        dead,
        ..layer_norm(x, Some(gamma.clone()), beta, eps, last)
    })
}
