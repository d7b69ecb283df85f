//! LayerNorm, GELU and SiLU written out elementwise (by hand in a model, or by a decomposition), fused
//! back into one node. Only float32 chains are fused.
//!
//! ```text
//! LayerNorm (opset >= 17):
//!   m = ReduceMean(x, axes = [last], keepdims = 1)      d = x - m
//!   v = ReduceMean(Pow(d, 2) | d * d, same axes)        r = Sqrt(v + eps)
//!   n = d / r  |  d * Reciprocal(r)                     [n * gamma]  [+ beta]
//!   (or d's RMS norm, when fuse_rms_norm took the inner part first: RMSNormalization(d, gamma) or
//!    SimplifiedLayerNormalization(d, gamma), then [+ beta])
//!   -> LayerNormalization(x, gamma | ones, [beta], axis = -1, epsilon = eps)
//!
//! GELU, erf form:  0.5 * x * (1 + Erf(x * 1/sqrt(2) | x / sqrt(2)))
//! GELU, tanh form: 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * (Pow(x, 3) | x * x * x))))
//!   (any association of the outer product, any operand order)
//!   -> Gelu(x, approximate = "none" | "tanh") from opset 20; below it, at the onnxruntime level,
//!      com.microsoft Gelu | FastGelu; otherwise left alone
//!
//! SiLU: x * Sigmoid(x)  ->  com.microsoft QuickGelu(x, alpha = 1) at the onnxruntime level, any opset
//!   (the kernel onnxruntime's own session optimizer would fuse it into: the file holds one node and
//!   the session has less to do). Left alone at the standard level: the standard Swish (opset 24) ran
//!   0.73-0.84x as fast as the Mul and Sigmoid in onnxruntime 1.31, which inlines its function body
//!   and then misses its QuickGelu fusion, and an opset-25 or 26 model holding Swish does not load.
//! ```
//!
//! The last node of each chain is rewritten in place (its output keeps its name); the other nodes are
//! dropped. Every value inside a chain must be read only by the chain (d by its square and its
//! division), and every constant must be one element of at most x's rank, so the fused node's output
//! has the shape the chain's had.

use std::collections::HashSet;

use super::matching::{
    f32_scalar, is_float, is_op, other, rank, reduces_last_axis, sole_producer, sole_producer_op,
    sole_reader, Index,
};
use super::{retain_nodes, Level, MS_DOMAIN};
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node};

/// The first opsets of the standard LayerNormalization and Gelu operators.
const LAYER_NORM_OPSET: i64 = 17;
const GELU_OPSET: i64 = 20;

const SQRT_2: f64 = std::f64::consts::SQRT_2;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// sqrt(2 / pi), the tanh approximation's scale
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_CUBE: f64 = 0.044715;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    LayerNorm,
    Gelu,
    Silu,
}

/// One matched chain: the node `last` becomes `op_type(inputs)`, the nodes in `dead` go.
struct Fusion {
    kind: Kind,
    last: usize,
    dead: Vec<usize>,
    op_type: &'static str,
    domain: &'static str,
    inputs: Vec<String>,
    attrs: Vec<Attribute>,
    /// a LayerNorm without gamma: a ones scale of this length is inserted as the second input
    ones: Option<i64>,
}

/// How GELU is emitted at a level and opset (None: left unfused).
fn gelu_ops(level: Level, opset: i64) -> Option<(&'static str, &'static str, &'static str)> {
    // (domain, erf op, tanh op); the standard op carries the form in an attribute
    match level {
        Level::None => None,
        _ if opset >= GELU_OPSET => Some(("", "Gelu", "Gelu")),
        Level::OnnxRuntime => Some((MS_DOMAIN, "Gelu", "FastGelu")),
        Level::Default => None,
    }
}

/// Fuses the decomposed LayerNorm, GELU and SiLU chains the level and opset allow; returns how many
/// of each it fused.
pub fn fuse_decomposed(g: &mut Graph, level: Level, opset: i64) -> (usize, usize, usize) {
    if level == Level::None {
        return (0, 0, 0);
    }
    let layer_norm = opset >= LAYER_NORM_OPSET;
    let gelu = gelu_ops(level, opset);
    let silu = level == Level::OnnxRuntime;
    if !layer_norm && gelu.is_none() && !silu {
        return (0, 0, 0);
    }
    let ix = Index::new(g);
    let mut fusions = Vec::new();
    // a node belongs to at most one fusion (the chains are disjoint by construction; this keeps it so)
    let mut claimed = HashSet::new();
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let found = match (n.op_type.as_str(), n.domain.as_str()) {
            ("ReduceMean", "") if layer_norm => match_layer_norm(g, &ix, i),
            // onnxruntime registers SimplifiedLayerNormalization in the default domain
            ("RMSNormalization" | "SimplifiedLayerNormalization", "") if layer_norm => {
                match_layer_norm_of_rms(g, &ix, i)
            }
            ("Erf", "") => gelu.and_then(|ops| match_gelu_erf(g, &ix, i, ops)),
            ("Tanh", "") => gelu.and_then(|ops| match_gelu_tanh(g, &ix, i, ops)),
            ("Sigmoid", "") if silu => match_silu(g, &ix, i),
            _ => None,
        };
        let Some(f) = found else { continue };
        // the fused node takes the last node's place, so it must have the one output
        if output(&g.nodes[f.last]).is_none()
            || f.dead.iter().chain([&f.last]).any(|n| claimed.contains(n))
        {
            continue;
        }
        claimed.extend(f.dead.iter().copied());
        claimed.insert(f.last);
        fusions.push(f);
    }
    let mut counts = (0, 0, 0);
    let mut dead = HashSet::new();
    for f in fusions {
        let mut inputs = f.inputs;
        if let Some(len) = f.ones {
            let bytes = (0..len).flat_map(|_| 1.0f32.to_le_bytes()).collect();
            // cannot fail: the length is a shape dimension, so the byte count matches it
            let Ok(ones) = g.add_constant("layer_norm_ones", dtype::FLOAT, vec![len], bytes) else {
                continue;
            };
            inputs.insert(1, ones);
        }
        let n = &mut g.nodes[f.last];
        n.op_type = f.op_type.to_owned();
        n.domain = f.domain.to_owned();
        n.inputs = inputs;
        n.attrs = f.attrs;
        dead.extend(f.dead);
        match f.kind {
            Kind::LayerNorm => counts.0 += 1,
            Kind::Gelu => counts.1 += 1,
            Kind::Silu => counts.2 += 1,
        }
    }
    retain_nodes(g, |i| !dead.contains(&i));
    counts
}

fn int_attr(name: &str, v: i64) -> Attribute {
    Attribute {
        name: name.into(),
        value: AttrValue::Int(v),
    }
}

fn float_attr(name: &str, v: f32) -> Attribute {
    Attribute {
        name: name.into(),
        value: AttrValue::Float(v),
    }
}

/// `name` is a one-element float32 constant within 1e-6 (relative) of `want`, and broadcasting it
/// against a value of rank `x_rank` cannot add dimensions.
fn is_scalar(g: &Graph, name: &str, want: f64, x_rank: Option<usize>) -> bool {
    scalar(g, name, x_rank).is_some_and(|v| (f64::from(v) - want).abs() <= 1e-6 * want.abs())
}

/// The value of a one-element float32 constant whose rank is at most `x_rank` (0 when x's is unknown).
fn scalar(g: &Graph, name: &str, x_rank: Option<usize>) -> Option<f32> {
    let dims = g.initializer(name)?.dims.len();
    if dims > x_rank.unwrap_or(0) {
        return None;
    }
    f32_scalar(g, name)
}

/// The value read by a two-input node besides the constant `want` (either operand order).
fn beside_scalar(g: &Graph, n: &Node, want: f64, x_rank: Option<usize>) -> Option<String> {
    match n.inputs.as_slice() {
        [a, c] | [c, a] if is_scalar(g, c, want, x_rank) => Some(a.clone()),
        _ => None,
    }
}

/// The output of a single-output node (every node of a chain has one).
fn output(n: &Node) -> Option<&String> {
    match n.outputs.as_slice() {
        [o] => Some(o),
        _ => None,
    }
}

/// The last dimension of x, when fixed and not empty.
fn last_dim(g: &Graph, x: &str) -> Option<i64> {
    match g.value_type(x)?.shape.as_ref()?.last()? {
        Dim::Fixed(d) if *d > 0 => Some(*d),
        _ => None,
    }
}

/// A 1-D float32 constant as long as x's last dimension (a LayerNorm scale or bias).
fn is_affine(g: &Graph, name: &str, last: i64) -> bool {
    g.initializer(name)
        .is_some_and(|t| t.dtype == dtype::FLOAT && t.dims == [last])
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
) -> Fusion {
    let ones = gamma.is_none().then_some(last);
    Fusion {
        kind: Kind::LayerNorm,
        last: 0,
        dead: Vec::new(),
        op_type: "LayerNormalization",
        domain: "",
        inputs: [Some(x), gamma, beta].into_iter().flatten().collect(),
        attrs: vec![
            int_attr("axis", -1),
            float_attr("epsilon", eps),
            int_attr("stash_type", 1),
        ],
        ones,
    }
}

/// The decomposed form, found from its variance ReduceMean. `x - m` may be one value read by the
/// square and the division, or computed twice (as `(x - u).pow(2)` and `(x - u) / ...` in a model's
/// code are, until CSE merges them later).
fn match_layer_norm(g: &Graph, ix: &Index, var_at: usize) -> Option<Fusion> {
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
    Some(Fusion {
        last: last_at,
        dead,
        ..layer_norm(x, gamma, beta, eps, last)
    })
}

/// The form left when the RMS-norm fusion took `d / Sqrt(mean(d^2) + eps) * gamma` first: an RMS norm
/// of a centered value is a LayerNorm.
fn match_layer_norm_of_rms(g: &Graph, ix: &Index, rms_at: usize) -> Option<Fusion> {
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
    Some(Fusion {
        last: last_at,
        dead,
        ..layer_norm(x, Some(gamma.clone()), beta, eps, last)
    })
}

/// `Erf(x * 1/sqrt(2) | x / sqrt(2))`, then the common tail.
fn match_gelu_erf(
    g: &Graph,
    ix: &Index,
    erf_at: usize,
    ops: (&'static str, &'static str, &'static str),
) -> Option<Fusion> {
    let erf = &g.nodes[erf_at];
    let (inner_at, inner) = sole_producer(g, ix, erf.inputs.first()?)?;
    let x = match (inner.op_type.as_str(), inner.inputs.as_slice()) {
        ("Mul", [a, b]) if inner.domain.is_empty() => [(a, b), (b, a)]
            .into_iter()
            .find(|(x, c)| is_scalar(g, c, FRAC_1_SQRT_2, rank(g, x)))?
            .0
            .clone(),
        ("Div", [x, c]) if inner.domain.is_empty() && is_scalar(g, c, SQRT_2, rank(g, x)) => {
            x.clone()
        }
        _ => return None,
    };
    gelu_tail(g, ix, x, vec![inner_at, erf_at], ops, "none")
}

/// `Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))`, then the common tail.
fn match_gelu_tanh(
    g: &Graph,
    ix: &Index,
    tanh_at: usize,
    ops: (&'static str, &'static str, &'static str),
) -> Option<Fusion> {
    let tanh = &g.nodes[tanh_at];
    let (scale_at, scale) = sole_producer(g, ix, tanh.inputs.first()?)?;
    if !is_op(scale, "Mul") {
        return None;
    }
    // the sum's rank is x's: look x up through the sum before checking the constants' ranks
    let (sum_at, sum) = scale
        .inputs
        .iter()
        .find_map(|v| sole_producer_op(g, ix, v, "Add"))?;
    let [a, b] = sum.inputs.as_slice() else {
        return None;
    };
    let (x, mut dead) = [(a, b), (b, a)]
        .into_iter()
        .find_map(|(x, poly)| cubic_term(g, ix, x, poly).map(|dead| (x.clone(), dead)))?;
    let x_rank = rank(g, &x);
    if beside_scalar(g, scale, SQRT_2_OVER_PI, x_rank).as_ref() != Some(output(sum)?) {
        return None;
    }
    dead.extend([sum_at, scale_at, tanh_at]);
    gelu_tail(g, ix, x, dead, ops, "tanh")
}

/// `poly = 0.044715 * (Pow(x, 3) | (x * x) * x | x * (x * x))`; returns the nodes it takes.
fn cubic_term(g: &Graph, ix: &Index, x: &str, poly: &str) -> Option<Vec<usize>> {
    let x_rank = rank(g, x);
    let (poly_at, poly) = sole_producer(g, ix, poly)?;
    if !is_op(poly, "Mul") {
        return None;
    }
    let cube = beside_scalar(g, poly, GELU_TANH_CUBE, x_rank)?;
    let (cube_at, cube) = sole_producer(g, ix, &cube)?;
    let mut dead = vec![poly_at, cube_at];
    match (cube.op_type.as_str(), cube.inputs.as_slice()) {
        ("Pow", [base, e]) if base == x && is_scalar(g, e, 3.0, x_rank) => {}
        ("Mul", [p, q]) if p == x || q == x => {
            let sq = if p == x { q } else { p };
            let (sq_at, sq) = sole_producer(g, ix, sq)?;
            if !is_op(sq, "Mul") || sq.inputs != [x, x] {
                return None;
            }
            dead.push(sq_at);
        }
        _ => return None,
    }
    cube.domain.is_empty().then_some(dead)
}

/// `a = 1 + inner` (inner: the Erf or Tanh output, produced by `dead`'s last node), then
/// `0.5 * x * a` in any association and order: `(x * 0.5) * a`, `x * (a * 0.5)`, `(x * a) * 0.5`.
fn gelu_tail(
    g: &Graph,
    ix: &Index,
    x: String,
    mut dead: Vec<usize>,
    (domain, erf_op, tanh_op): (&'static str, &'static str, &'static str),
    approximate: &str,
) -> Option<Fusion> {
    if !is_float(g, &x) {
        return None;
    }
    let x_rank = rank(g, &x);
    let inner = output(&g.nodes[*dead.last()?])?;
    let (add_at, add) = sole_reader(g, ix, inner)?;
    if !is_op(add, "Add") || !is_scalar(g, other(add, inner)?, 1.0, x_rank) {
        return None;
    }
    dead.push(add_at);
    let a = output(add)?;
    let (m1_at, m1) = sole_reader(g, ix, a)?;
    if !is_op(m1, "Mul") {
        return None;
    }
    let o = other(m1, a)?;
    let last = if o == x || is_scalar(g, o, 0.5, x_rank) {
        // (x * a) * 0.5  or  (a * 0.5) * x
        let p = output(m1)?;
        let (m2_at, m2) = sole_reader(g, ix, p)?;
        let rest = other(m2, p)?;
        let ok = if o == x {
            is_scalar(g, rest, 0.5, x_rank)
        } else {
            rest == x
        };
        if !is_op(m2, "Mul") || !ok {
            return None;
        }
        dead.push(m1_at);
        m2_at
    } else {
        // (x * 0.5) * a
        let (half_at, half) = sole_producer(g, ix, o)?;
        if !is_op(half, "Mul") || beside_scalar(g, half, 0.5, x_rank)? != x {
            return None;
        }
        dead.push(half_at);
        m1_at
    };
    let (op_type, attrs) = if domain.is_empty() {
        let attr = Attribute {
            name: "approximate".into(),
            value: AttrValue::String(approximate.as_bytes().to_vec()),
        };
        ("Gelu", vec![attr])
    } else if approximate == "none" {
        (erf_op, vec![])
    } else {
        (tanh_op, vec![])
    };
    Some(Fusion {
        kind: Kind::Gelu,
        last,
        dead,
        op_type,
        domain,
        inputs: vec![x],
        attrs,
        ones: None,
    })
}

/// `x * Sigmoid(x)`, the Sigmoid read only by the product.
fn match_silu(g: &Graph, ix: &Index, sig_at: usize) -> Option<Fusion> {
    let sig = &g.nodes[sig_at];
    let [x] = sig.inputs.as_slice() else {
        return None;
    };
    let s = output(sig)?;
    let (mul_at, mul) = sole_reader(g, ix, s)?;
    if !is_op(mul, "Mul") || other(mul, s)? != x || !is_float(g, x) {
        return None;
    }
    Some(Fusion {
        kind: Kind::Silu,
        last: mul_at,
        dead: vec![sig_at],
        op_type: "QuickGelu",
        domain: MS_DOMAIN,
        inputs: vec![x.clone()],
        attrs: vec![float_attr("alpha", 1.0)],
        ones: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Dim, Node};

    fn graph_with_x() -> (Graph, String) {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2), Dim::Fixed(3)]));
        (g, x)
    }

    #[test]
    fn silu_becomes_quick_gelu_at_the_onnxruntime_level_only() {
        for (level, fused) in [(Level::Default, 0), (Level::OnnxRuntime, 1)] {
            let (mut g, x) = graph_with_x();
            let s = g
                .add_node("Sigmoid", "", vec![x.clone()], &["s".into()], vec![], None)
                .expect("sigmoid");
            let y = g
                .add_node(
                    "Mul",
                    "",
                    vec![s[0].clone(), x],
                    &["y".into()],
                    vec![],
                    None,
                )
                .expect("mul");
            g.outputs.push(y[0].clone());
            assert_eq!(fuse_decomposed(&mut g, level, 24), (0, 0, fused));
            let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
            let want: &[&str] = if fused == 1 {
                &["QuickGelu"]
            } else {
                &["Sigmoid", "Mul"]
            };
            assert_eq!(ops, want);
        }
    }

    #[test]
    fn nodes_without_outputs_are_skipped() {
        let (mut g, x) = graph_with_x();
        for op in ["ReduceMean", "Erf", "Tanh", "Sigmoid", "RMSNormalization"] {
            g.nodes.push(Node {
                name: op.into(),
                op_type: op.into(),
                domain: String::new(),
                inputs: vec![x.clone()],
                outputs: vec![],
                attrs: vec![],
            });
        }
        assert_eq!(fuse_decomposed(&mut g, Level::OnnxRuntime, 26), (0, 0, 0));
        assert_eq!(g.nodes.len(), 5);
    }
}
