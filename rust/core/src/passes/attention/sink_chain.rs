//! Attention with sinks, as GPT-OSS's eager attention computes it, matched from its Softmax for the
//! shared-cache fusion ([`super::shared_cache`]), whose kernel takes the sinks as `head_sink`:
//!
//! ```text
//! scores   = Mul(MatMul(q, Transpose(k, perm = [0, 1, 3, 2])), scale)    (or MatMul(Mul(q, scale), ...))
//! scores   = Add(scores, mask) | scores
//! combined = Concat(scores, Expand(Reshape(sinks, [1, -1, 1, 1]), ...), axis = -1)
//! probs    = Softmax(Sub(combined, <its row maximum>), axis = -1)
//! out      = MatMul(Slice(probs, 0, -1, axis = -1), v)
//! ```
//!
//! `sinks` is a per-head constant (an initializer of the query's head count). The sink's column joins
//! each row's softmax and is dropped after it: the kernel adds `exp(sink)` to each row's denominator,
//! the same value. The maximum subtracted first (NaN-propagating, as torch's max is converted) leaves
//! the softmax unchanged; the kernel keeps its own rows stable.

use super::chain::{reads, Chain, Reads};
use crate::dtype;
use crate::graph::{AttrValue, Graph};
use crate::passes::matching::{
    f32_scalar, fixed, is_float, is_op, shape, sole_producer_op, sole_reader, Index,
};
use crate::tensor::le_i64s;

/// The largest node count of the row-maximum subtree removed with the chain.
const MAX_SUBTREE: usize = 12;

/// The chain ending in the Softmax at `softmax_at`, and its sinks' initializer, if it is one.
pub(super) fn match_sink_chain(
    g: &Graph,
    ix: &Index,
    softmax_at: usize,
) -> Option<(Chain, String)> {
    let softmax = &g.nodes[softmax_at];
    if !matches!(softmax.attr("axis"), Some(AttrValue::Int(-1 | 3))) {
        return None;
    }
    let mut dead = vec![softmax_at];
    let (sub_at, sub) = sole_producer_op(g, ix, softmax.inputs.first()?, "Sub")?;
    let [combined, row_max] = sub.inputs.as_slice() else {
        return None;
    };
    dead.push(sub_at);
    dead.extend(reads_only(g, ix, row_max, combined)?);
    // the Sub and the maximum's subtree are the combined scores' only readers, but for computations
    // nothing reads (torch's max also gives the indices: an ArgMax the clean-up drops later)
    let cat_at = *ix.prod.get(combined)?;
    let cat = &g.nodes[cat_at];
    let others: Vec<usize> = readers_of(g, combined)
        .filter(|i| !dead.contains(i))
        .collect();
    let mut readers = true;
    for at in others {
        match unread_from(g, at) {
            Some(nodes) => dead.extend(
                nodes
                    .into_iter()
                    .filter(|n| !dead.contains(n))
                    .collect::<Vec<_>>(),
            ),
            None => readers = false,
        }
    }
    let last_axis = matches!(cat.attr("axis"), Some(AttrValue::Int(-1 | 3)));
    let [scores, sink_column] = cat.inputs.as_slice() else {
        return None;
    };
    if !is_op(cat, "Concat") || !last_axis || !readers || g.outputs.contains(combined) {
        return None;
    }
    dead.push(cat_at);
    let (sinks, sink_nodes) = sink_source(g, ix, sink_column)?;
    dead.extend(sink_nodes);
    // the mask, if any: an Add whose other operand is not the scores' product
    let mut scores = scores.clone();
    let mut mask = None;
    if let Some((add_at, add)) = sole_producer_op(g, ix, &scores, "Add") {
        let [a, b] = add.inputs.as_slice() else {
            return None;
        };
        let from_product = |v: &str| {
            ix.prod
                .get(v)
                .is_some_and(|&j| is_op(&g.nodes[j], "Mul") || is_op(&g.nodes[j], "MatMul"))
        };
        let (s, bias) = if from_product(a) { (a, b) } else { (b, a) };
        if !from_product(s) || !is_float(g, bias) {
            return None;
        }
        mask = Some(bias.clone());
        scores = s.clone();
        dead.push(add_at);
    }
    let (q, k, scale, product) = scaled_product(g, ix, &scores)?;
    dead.extend(product);
    // the sink's column dropped, then the output MatMul
    let probs = &softmax.outputs[0];
    let (slice_at, slice) = sole_reader(g, ix, probs)?;
    if !is_op(slice, "Slice") || !drops_last_column(g, slice) {
        return None;
    }
    dead.push(slice_at);
    let weights = slice.outputs.first()?;
    let (last, out) = sole_reader(g, ix, weights)?;
    if !is_op(out, "MatMul") || out.inputs.first() != Some(weights) {
        return None;
    }
    let v = out.inputs.get(1)?.clone();
    let Reads {
        k,
        v,
        k_read,
        v_read,
    } = reads(g, ix, &q, k, v, mask.as_deref())?;
    let heads = fixed(shape(g, &q)?.get(1)?)?;
    let sink = g.initializer(&sinks)?;
    if sink.dims != [heads] || sink.dtype != dtype::FLOAT {
        return None;
    }
    let chain = Chain {
        q,
        k,
        v,
        k_read,
        v_read,
        mask,
        closed_rows: None,
        scale,
        dead,
        last,
        softmax: softmax_at,
        open_mask: None,
        open_rows: None,
    };
    Some((chain, sinks))
}

/// `Mul(MatMul(q, Transpose(k)), scale)` or `MatMul(Mul(q, scale), Transpose(k))`: (q, k, scale, the
/// nodes).
fn scaled_product(
    g: &Graph,
    ix: &Index,
    scores: &str,
) -> Option<(String, String, f32, Vec<usize>)> {
    let scalar_side = |n: &crate::graph::Node| -> Option<(String, f32)> {
        match n.inputs.as_slice() {
            [a, b] if f32_scalar(g, b).is_some() => Some((a.clone(), f32_scalar(g, b)?)),
            [a, b] if f32_scalar(g, a).is_some() => Some((b.clone(), f32_scalar(g, a)?)),
            _ => None,
        }
    };
    let transposed = |value: &str| -> Option<(usize, String)> {
        let (at, tr) = sole_producer_op(g, ix, value, "Transpose")?;
        matches!(tr.attr("perm"), Some(AttrValue::Ints(p)) if p == &[0, 1, 3, 2])
            .then(|| Some((at, tr.inputs.first()?.clone())))?
    };
    if let Some((mul_at, mul)) = sole_producer_op(g, ix, scores, "Mul") {
        let (product, scale) = scalar_side(mul)?;
        let (mm_at, mm) = sole_producer_op(g, ix, &product, "MatMul")?;
        let (tr_at, k) = transposed(mm.inputs.get(1)?)?;
        return Some((
            mm.inputs.first()?.clone(),
            k,
            scale,
            vec![mul_at, mm_at, tr_at],
        ));
    }
    let (mm_at, mm) = sole_producer_op(g, ix, scores, "MatMul")?;
    let (mul_at, mul) = sole_producer_op(g, ix, mm.inputs.first()?, "Mul")?;
    let (q, scale) = scalar_side(mul)?;
    let (tr_at, k) = transposed(mm.inputs.get(1)?)?;
    Some((q, k, scale, vec![mm_at, mul_at, tr_at]))
}

/// The sinks' initializer under `Expand(Reshape(sinks, ...), ...)` (each step optional), and the
/// nodes to remove with the chain.
fn sink_source(g: &Graph, ix: &Index, column: &str) -> Option<(String, Vec<usize>)> {
    let mut value = column.to_owned();
    let mut nodes = Vec::new();
    for op in ["Expand", "Reshape"] {
        if let Some((at, n)) = sole_producer_op(g, ix, &value, op) {
            value = n.inputs.first()?.clone();
            nodes.push(at);
        }
    }
    g.initializer(&value).map(|_| (value, nodes))
}

/// Whether `slice` keeps all but the last element of the last axis of a 4-D value.
fn drops_last_column(g: &Graph, slice: &crate::graph::Node) -> bool {
    let ints = |i: usize| -> Option<Vec<i64>> {
        let t = g.initializer(slice.inputs.get(i)?)?;
        (t.dtype == dtype::INT64).then(|| le_i64s(t.data.as_slice().unwrap_or_default()))
    };
    let (Some(starts), Some(ends), Some(axes)) = (ints(1), ints(2), ints(3)) else {
        return false;
    };
    let steps = if slice.inputs.len() > 4 {
        ints(4)
    } else {
        Some(vec![1])
    };
    starts == [0] && ends == [-1] && matches!(axes.as_slice(), [-1 | 3]) && steps == Some(vec![1])
}

/// The nodes computing `value` from `source` and constants alone (the row maximum of the combined
/// scores), each read only inside that computation; None where another value enters it.
fn reads_only(g: &Graph, ix: &Index, value: &str, source: &str) -> Option<Vec<usize>> {
    let mut nodes: Vec<usize> = Vec::new();
    let mut pending = vec![value.to_owned()];
    while let Some(v) = pending.pop() {
        if v == source || g.initializer(&v).is_some() {
            continue;
        }
        let at = *ix.prod.get(&v)?;
        if nodes.contains(&at) {
            continue;
        }
        nodes.push(at);
        if nodes.len() > MAX_SUBTREE {
            return None;
        }
        pending.extend(g.nodes[at].inputs.iter().filter(|i| !i.is_empty()).cloned());
    }
    // each output read by the subtree or (the root) by the Sub alone
    let inside = |reader: usize| nodes.contains(&reader);
    for &at in &nodes {
        for out in &g.nodes[at].outputs {
            let outside = readers_of(g, out).filter(|&r| !inside(r)).count();
            if g.outputs.contains(out) || outside > usize::from(out == value) {
                return None;
            }
        }
    }
    Some(nodes)
}

/// The nodes from `start` on whose outputs nothing reads but each other: `start` and what reads it,
/// when none of it is a graph output or read elsewhere (at most `MAX_SUBTREE` nodes).
fn unread_from(g: &Graph, start: usize) -> Option<Vec<usize>> {
    let mut nodes = vec![start];
    let mut i = 0;
    while i < nodes.len() {
        for out in &g.nodes[nodes[i]].outputs {
            if g.outputs.contains(out) {
                return None;
            }
            for r in readers_of(g, out) {
                if !nodes.contains(&r) {
                    nodes.push(r);
                }
            }
        }
        if nodes.len() > MAX_SUBTREE {
            return None;
        }
        i += 1;
    }
    Some(nodes)
}

/// The nodes reading `value`, in graph order (the Index keeps counts and first readers only; these
/// walks need every reader of a few values).
fn readers_of<'a>(g: &'a Graph, value: &'a str) -> impl Iterator<Item = usize> + 'a {
    g.nodes
        .iter()
        .enumerate()
        .filter(move |(_, n)| n.inputs.iter().any(|i| i == value))
        .map(|(i, _)| i)
}
