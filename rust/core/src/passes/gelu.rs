//! GELU written out elementwise (by hand in a model, GPT-2's `NewGELU`, or a decomposition), fused back
//! into one node. Only float32 chains are fused.
//!
//! ```text
//! erf form:  0.5 * x * (1 + Erf(x * 1/sqrt(2) | x / sqrt(2)))
//! tanh form: 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * (Pow(x, 3) | x * x * x))))
//!   (any association of the outer product, any operand order)
//!   -> Gelu(x, approximate = "none" | "tanh") (standard, opset 20 on)
//!   -> com.microsoft Gelu | FastGelu (onnxruntime's, any opset)
//! ```
//!
//! The last node of the chain is rewritten in place (its output keeps its name); the other nodes are
//! dropped. Every value inside a chain must be read only by the chain, and every constant must be one
//! element of at most x's rank, so the fused node's output has the shape the chain's had.

use super::matching::{
    beside_scalar, is_float, is_op, is_scalar, other, output, rank, sole_producer,
    sole_producer_op, sole_reader, Index,
};
use super::rewrite::{fuse, Rewrite};
use super::MS_DOMAIN;
use crate::graph::{AttrValue, Attribute, Graph};

const SQRT_2: f64 = std::f64::consts::SQRT_2;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// sqrt(2 / pi), the tanh approximation's scale
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_CUBE: f64 = 0.044_715;

/// (domain, erf op, tanh op); the standard op carries the form in an attribute
type Ops = (&'static str, &'static str, &'static str);

/// Fuses every decomposed GELU into the standard `Gelu` (opset 20 on); returns how many it fused.
pub(crate) fn fuse_standard(g: &mut Graph) -> usize {
    fuse_as(g, ("", "Gelu", "Gelu"))
}

/// Fuses every decomposed GELU into onnxruntime's `Gelu` / `FastGelu`; returns how many it fused.
pub(crate) fn fuse_contrib(g: &mut Graph) -> usize {
    fuse_as(g, (MS_DOMAIN, "Gelu", "FastGelu"))
}

fn fuse_as(g: &mut Graph, ops: Ops) -> usize {
    let find = |g: &Graph, ix: &Index, i: usize| {
        let found = if is_op(&g.nodes[i], "Erf") {
            match_gelu_erf(g, ix, i, ops)
        } else {
            match_gelu_tanh(g, ix, i, ops)
        };
        // the fused node takes the last node's place, so it must have the one output
        found.filter(|r| output(&g.nodes[r.at()]).is_some())
    };
    fuse(g, &["Erf", "Tanh"], find, |_, r| Some(r))
}

/// `Erf(x * 1/sqrt(2) | x / sqrt(2))`, then the common tail.
fn match_gelu_erf(g: &Graph, ix: &Index, erf_at: usize, ops: Ops) -> Option<Rewrite> {
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
fn match_gelu_tanh(g: &Graph, ix: &Index, tanh_at: usize, ops: Ops) -> Option<Rewrite> {
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
    (domain, erf_op, tanh_op): Ops,
    approximate: &str,
) -> Option<Rewrite> {
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
    Some(Rewrite::replace(last, op_type, domain, vec![x], attrs).removing(dead))
}
