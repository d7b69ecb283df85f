//! The attention chain as the converter decomposes `scaled_dot_product_attention`, matched from its
//! Softmax; the three attention passes start from what this finds.
//!
//! ```text
//! scores = MatMul(Mul(q, scale), Transpose(k, perm = [0, 1, 3, 2]))
//! scores = Where(mask, scores, -inf)  |  Add(scores, bias)  |  scores
//! probs  = Softmax(scores, axis = -1)
//! probs  = Where(closed_rows, 0, probs)   (optional: rows the mask closes entirely give 0, as in torch)
//! out    = MatMul(probs, v)
//! ```
//!
//! q, k, v are 4-D (batch, heads, seq, head size), float32. Keys and values repeated per query-head
//! group (transformers' `repeat_kv`, the converter's `enable_gqa`: Unsqueeze at axis 2, Expand,
//! Reshape) are reported unrepeated too.

use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph};
use crate::passes::matching::{
    f32_scalar, fixed, is_float, is_op, reduces_last_axis, shape, sole_producer_op, sole_reader,
    Index,
};

/// One attention chain, as found.
pub(super) struct Chain {
    pub(super) q: String,
    pub(super) k: String,
    pub(super) v: String,
    /// keys and values as the scores read them (repeated per query-head group, if they were)
    pub(super) k_read: String,
    pub(super) v_read: String,
    /// the mask, without an all-true constant one
    pub(super) mask: Option<String>,
    /// the closed-rows flag, unless it is an all-false constant
    pub(super) closed_rows: Option<String>,
    pub(super) scale: f32,
    /// nodes replaced by the fused one (the final MatMul is rewritten in place)
    pub(super) dead: Vec<usize>,
    pub(super) last: usize,
    pub(super) softmax: usize,
    /// a Where applying an all-true constant mask (index, the scores it passes)
    pub(super) open_mask: Option<(usize, String)>,
    /// a Where zeroing rows by an all-false constant flag (index, the softmax output)
    pub(super) open_rows: Option<(usize, String)>,
}

fn is_rank4_float(g: &Graph, name: &str) -> bool {
    is_float(g, name) && shape(g, name).is_some_and(|s| s.len() == 4)
}

fn is_neg_inf(g: &Graph, name: &str) -> bool {
    f32_scalar(g, name).is_some_and(|v| v == f32::NEG_INFINITY)
}

/// The chain ending in the Softmax at `softmax_at`, if it is one.
pub(super) fn match_chain(g: &Graph, ix: &Index, softmax_at: usize) -> Option<Chain> {
    let softmax = &g.nodes[softmax_at];
    let axis = match softmax.attr("axis") {
        Some(AttrValue::Int(a)) => *a,
        _ => return None,
    };
    if axis != -1 && axis != 3 {
        return None;
    }
    let mut dead = vec![softmax_at];
    // the mask, if any
    let mut scores = softmax.inputs.first()?.clone();
    let mut mask = None;
    let mut mask_where = None;
    if let Some(&p) = ix.prod.get(&scores) {
        let n = &g.nodes[p];
        let masked = ix.reads.get(&scores) == Some(&1);
        if masked && is_op(n, "Where") && n.inputs.len() == 3 && is_neg_inf(g, &n.inputs[2]) {
            if g.value_type(&n.inputs[0])?.dtype != Some(dtype::BOOL) {
                return None;
            }
            mask = Some(n.inputs[0].clone());
            scores = n.inputs[1].clone();
            mask_where = Some(p);
            dead.push(p);
        } else if masked && is_op(n, "Add") {
            // which operand is the scores: the one a MatMul produces
            let [a, b] = n.inputs.as_slice() else {
                return None;
            };
            let from_matmul = |v: &str| {
                ix.prod
                    .get(v)
                    .is_some_and(|&j| is_op(&g.nodes[j], "MatMul"))
            };
            let (s, bias) = if from_matmul(a) { (a, b) } else { (b, a) };
            if !from_matmul(s) || !is_float(g, bias) {
                return None;
            }
            mask = Some(bias.clone());
            scores = s.clone();
            dead.push(p);
        }
    }
    // the scores: MatMul(Mul(q, scale), Transpose(k))
    let (mm_at, mm) = sole_producer_op(g, ix, &scores, "MatMul")?;
    let (mul_at, mul) = sole_producer_op(g, ix, mm.inputs.first()?, "Mul")?;
    let (tr_at, tr) = sole_producer_op(g, ix, mm.inputs.get(1)?, "Transpose")?;
    if !matches!(tr.attr("perm"), Some(AttrValue::Ints(p)) if p == &[0, 1, 3, 2]) {
        return None;
    }
    let (q, scale) = match mul.inputs.as_slice() {
        [a, b] if f32_scalar(g, b).is_some() => (a.clone(), f32_scalar(g, b)?),
        [a, b] if f32_scalar(g, a).is_some() => (b.clone(), f32_scalar(g, a)?),
        _ => return None,
    };
    dead.extend([mm_at, mul_at, tr_at]);
    // the closed rows' Where, then the output MatMul
    let probs = &softmax.outputs[0];
    let (mut next_at, mut next) = sole_reader(g, ix, probs)?;
    let mut weights = probs.clone();
    let mut flag_where = None;
    if is_op(next, "Where") && next.inputs.len() == 3 && next.inputs[2] == *probs {
        let flag = &next.inputs[0];
        let closes = bool_constant(g, flag) == Some(false)
            || mask
                .as_deref()
                .is_some_and(|m| closes_rows_of(g, ix, flag, m));
        if f32_scalar(g, &next.inputs[1]) != Some(0.0) || !closes {
            return None;
        }
        weights = next.outputs[0].clone();
        flag_where = Some((next_at, flag.clone()));
        dead.push(next_at);
        (next_at, next) = sole_reader(g, ix, &weights)?;
    }
    if !is_op(next, "MatMul") || next.inputs.first() != Some(&weights) {
        return None;
    }
    let v = next.inputs.get(1)?.clone();
    let k = tr.inputs.first()?.clone();
    let Reads {
        k,
        v,
        k_read,
        v_read,
    } = reads(g, ix, &q, k, v, mask.as_deref())?;
    let (q_dims, k_dims) = (shape(g, &q)?, shape(g, &k)?);
    let scores_dims = [&q_dims[0], &q_dims[1], &q_dims[2], &k_dims[2]];
    // a constant mask that lets everything through (no padding) is no mask, and a constant flag
    // closing no row zeroes nothing
    let open_mask = mask_where
        .filter(|_| {
            mask.as_ref()
                .is_some_and(|m| bool_constant(g, m) == Some(true))
        })
        .map(|at| (at, scores.clone()));
    let open_rows = flag_where
        .clone()
        .filter(|(_, flag)| bool_constant(g, flag) == Some(false) && fits(g, flag, scores_dims))
        .map(|(at, _)| (at, probs.clone()));
    let mask = mask.filter(|m| bool_constant(g, m) != Some(true));
    let closed_rows = flag_where
        .map(|(_, flag)| flag)
        .filter(|flag| bool_constant(g, flag) != Some(false));
    Some(Chain {
        q,
        k,
        v,
        k_read,
        v_read,
        mask,
        closed_rows,
        scale,
        dead,
        last: next_at,
        softmax: softmax_at,
        open_mask,
        open_rows,
    })
}

/// A chain's keys and values, unrepeated where they were repeated per query-head group, and as its
/// scores read them.
pub(super) struct Reads {
    pub(super) k: String,
    pub(super) v: String,
    pub(super) k_read: String,
    pub(super) v_read: String,
}

/// The keys and values of a chain of query `q`, when q, k and v are 4-D floats and `mask` (if any)
/// broadcasts to the scores without growing them.
pub(super) fn reads(
    g: &Graph,
    ix: &Index,
    q: &str,
    k: String,
    v: String,
    mask: Option<&str>,
) -> Option<Reads> {
    if ![q, &k, &v].iter().all(|name| is_rank4_float(g, name)) {
        return None;
    }
    let (k_read, v_read) = (k.clone(), v.clone());
    let (k, v) = unrepeated(g, ix, q, &k, &v).unwrap_or((k, v));
    let (q_dims, k_dims) = (shape(g, q)?, shape(g, &k)?);
    let scores_dims = [&q_dims[0], &q_dims[1], &q_dims[2], &k_dims[2]];
    if mask.is_some_and(|m| !fits(g, m, scores_dims)) {
        return None;
    }
    Some(Reads {
        k,
        v,
        k_read,
        v_read,
    })
}

/// True when `flag` is the converter's "row closed entirely" flag of `mask`:
/// `Equal(ReduceMax(Cast(mask) | mask, last axis, keepdims), 0 for a boolean mask | -inf for a float one)`.
/// Only then does Attention's zero output for fully masked rows stand in for the flag's Where.
fn closes_rows_of(g: &Graph, ix: &Index, flag: &str, mask: &str) -> bool {
    let check = || -> Option<bool> {
        let eq = &g.nodes[*ix.prod.get(flag)?];
        let [row_max, limit] = eq.inputs.as_slice() else {
            return None;
        };
        let rmax = &g.nodes[*ix.prod.get(row_max)?];
        if !is_op(eq, "Equal") || !is_op(rmax, "ReduceMax") {
            return None;
        }
        let mut source = rmax.inputs.first()?;
        if let Some(&c) = ix.prod.get(source) {
            if is_op(&g.nodes[c], "Cast") {
                source = g.nodes[c].inputs.first()?;
            }
        }
        let mask_rank = shape(g, mask)?.len();
        let boolean = g.value_type(mask)?.dtype == Some(dtype::BOOL);
        let expected = if boolean { 0.0 } else { f64::NEG_INFINITY };
        Some(
            source == mask
                && reduces_last_axis(g, rmax, mask_rank)
                && scalar_f64(g, limit) == Some(expected),
        )
    };
    check().unwrap_or(false)
}

/// True when the value broadcasts to the scores' dims without growing them (the Where or Add it
/// came from could have grown the scores; Attention's output has the query's shape).
fn fits(g: &Graph, value: &str, scores: [&Dim; 4]) -> bool {
    let Some(m) = shape(g, value) else {
        return false;
    };
    m.len() <= 4
        && m.iter()
            .zip(&scores[4 - m.len()..])
            .all(|(md, sd)| md == &Dim::Fixed(1) || md == *sd)
}

/// Some(b) when `name` is a boolean constant whose every element is b.
fn bool_constant(g: &Graph, name: &str) -> Option<bool> {
    let t = g.initializer(name)?;
    let bytes = t.data.as_slice()?;
    let first = *bytes.first()? != 0;
    (t.dtype == dtype::BOOL && bytes.iter().all(|&b| (b != 0) == first)).then_some(first)
}

/// A one-element int32, int64 or float32 constant, widened.
fn scalar_f64(g: &Graph, name: &str) -> Option<f64> {
    let t = g.initializer(name)?;
    let bytes = t.data.as_slice()?;
    if t.numel() != 1 {
        return None;
    }
    match t.dtype {
        dtype::FLOAT => Some(f64::from(f32::from_le_bytes(
            bytes.get(..4)?.try_into().ok()?,
        ))),
        dtype::INT32 => Some(f64::from(i32::from_le_bytes(
            bytes.get(..4)?.try_into().ok()?,
        ))),
        dtype::INT64 => Some(i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as f64),
        _ => None,
    }
}

/// Keys and values before a per-group repeat (Unsqueeze axis 2, Expand, Reshape merging axes 1 and 2),
/// when both are repeated and the query's head count is a multiple of theirs.
fn unrepeated(g: &Graph, ix: &Index, q: &str, k: &str, v: &str) -> Option<(String, String)> {
    let q_heads = fixed(shape(g, q)?.get(1)?)?;
    let k0 = repeat_source(g, ix, k)?;
    let v0 = repeat_source(g, ix, v)?;
    let kv_heads = fixed(shape(g, &k0)?.get(1)?)?;
    if kv_heads == 0
        || q_heads % kv_heads != 0
        || shape(g, &v0)?.get(1) != Some(&Dim::Fixed(kv_heads))
    {
        return None;
    }
    Some((k0, v0))
}

/// x for `Reshape(Expand(Unsqueeze(x, [2]), ...), ...)` of shapes (b, h, s, e) -> (b, h, 1, s, e) ->
/// (b, h, n, s, e) -> (b, h*n, s, e), checked on the recorded shapes. The repeat's nodes are never
/// removed by the fusions (the clean-up drops them once unread), so only the Reshape must be the
/// chain's alone.
fn repeat_source(g: &Graph, ix: &Index, value: &str) -> Option<String> {
    let (_, reshape) = sole_producer_op(g, ix, value, "Reshape")?;
    let expanded = reshape.inputs.first()?;
    let expand = &g.nodes[*ix.prod.get(expanded)?];
    // besides the Reshape, only Shape nodes may read the copy (the converter reads a symbolic size
    // there): they do not need its data
    let shape_reads = g
        .nodes
        .iter()
        .filter(|n| is_op(n, "Shape") && n.inputs.first() == Some(expanded))
        .count();
    if !is_op(expand, "Expand") || ix.reads.get(expanded) != Some(&(1 + shape_reads)) {
        return None;
    }
    let (_, unsq) = sole_producer_op(g, ix, expand.inputs.first()?, "Unsqueeze")?;
    let x = unsq.inputs.first()?;
    let axes = match (unsq.attr("axes"), unsq.inputs.get(1)) {
        (Some(AttrValue::Ints(a)), _) => a.clone(),
        (None, Some(name)) => {
            let t = g.initializer(name)?;
            (t.dtype == dtype::INT64)
                .then(|| crate::tensor::le_i64s(t.data.as_slice().unwrap_or_default()))?
        }
        _ => return None,
    };
    if axes != [2] {
        return None;
    }
    let xs = shape(g, x)?;
    let es = shape(g, &expand.outputs[0])?;
    let rs = shape(g, value)?;
    let (Some(h), Some(n)) = (fixed(xs.get(1)?), fixed(es.get(2)?)) else {
        return None;
    };
    let ok = xs.len() == 4
        && es.len() == 5
        && rs.len() == 4
        && es[0] == xs[0]
        && es[1] == xs[1]
        && es[3] == xs[2]
        && es[4] == xs[3]
        && rs[0] == xs[0]
        && rs[1] == Dim::Fixed(h * n)
        && rs[2] == xs[2]
        && rs[3] == xs[3];
    ok.then(|| x.clone())
}
