//! Rotary position embedding in the rotate-half form of transformers' Llama-like models, fused:
//!
//! ```text
//! lo = Slice(x, 0, h/2, axis=-1)     hi = Slice(x, h/2, h (or INT64_MAX), axis=-1)
//! out = Add(Mul(x, cos), Mul(Concat(Neg(hi), lo, axis=-1), sin))     (operand orders free)
//! ```
//!
//! where x is float32 (batch, heads, seq, h) with static seq and even h, and cos / sin are float32
//! constants broadcasting to (1, 1, seq, h) whose two halves along h are equal (checked value by value).
//! It becomes:
//! - from opset 23, at both levels: the standard `RotaryEmbedding(x, cos_cache, sin_cache)` with
//!   caches (1, seq, h/2) when the batch is 1; for a larger static batch `RotaryEmbedding(x, cos_cache,
//!   sin_cache, position_ids)` with caches (seq, h/2) and position_ids (batch, seq) = 0..seq per row
//!   (onnxruntime wants the caches' first dim to equal the batch, and position ids are smaller than
//!   caches repeated per batch). A dynamic batch is left unfused at the default level.
//! - at the onnxruntime level, below opset 23 or for a dynamic batch:
//!   `com.microsoft.RotaryEmbedding(x, position_ids = [0], cos_cache, sin_cache)` with caches
//!   (seq, h/2) (a 1-element position_ids is the start position of every sequence), any batch.
//!
//! With dynamic sequence lengths cos and sin are computed from position ids at run time, not
//! constants: `rotary_live` fuses that form.

use std::collections::HashMap;
use std::rc::Rc;

use super::matching::{f32_values, is_float, is_op, other, sole_reader, Index};
use super::rewrite::{fuse, Rewrite};
use super::MS_DOMAIN;
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::tensor::le_i64s;

/// The most elements (seq * head size) a cos / sin table may have to be decoded.
const MAX_TABLE: i64 = 1 << 26;

/// (table, seq, head size) -> the first halves of its rows, when both halves are equal
type Halves = HashMap<(String, i64, i64), Option<Rc<Vec<f32>>>>;

#[derive(Clone, Copy, PartialEq)]
enum Form {
    Standard,
    Contrib,
}

struct Rotary {
    x: String,
    cos: String,
    sin: String,
    /// the first halves of cos' and sin's rows, (seq, h/2)
    cos_half: Rc<Vec<f32>>,
    sin_half: Rc<Vec<f32>>,
    /// the batch size, when static
    batch: Option<i64>,
    seq: i64,
    /// the head size
    h: i64,
    /// the Add, rewritten in place into the fused node
    add: usize,
    /// the other nodes of the pattern, dropped
    dead: [usize; 6],
}

/// Rotary embeddings → the standard `RotaryEmbedding` (opset 23 on), where the batch is static;
/// returns how many it fused.
pub(crate) fn fuse_standard(g: &mut Graph) -> usize {
    fuse_forms(g, true, false)
}

/// Rotary embeddings → the standard `RotaryEmbedding` where the batch is static, onnxruntime's
/// otherwise (opset 23 on); returns how many it fused.
pub(crate) fn fuse_standard_or_contrib(g: &mut Graph) -> usize {
    fuse_forms(g, true, true)
}

/// Rotary embeddings → onnxruntime's `com.microsoft.RotaryEmbedding`; returns how many it fused.
pub(crate) fn fuse_contrib(g: &mut Graph) -> usize {
    fuse_forms(g, false, true)
}

fn fuse_forms(g: &mut Graph, standard: bool, contrib: bool) -> usize {
    // queries and keys share their cos / sin constants: decode each once
    let mut halves = Halves::new();
    let find = |g: &Graph, ix: &Index, i: usize| match_rotary(g, ix, i, &mut halves);
    let mut caches = HashMap::new();
    fuse(g, &["Concat"], find, |g, r| {
        // the standard op needs the batch size for its caches or position ids
        let form = if standard && r.batch.is_some() {
            Form::Standard
        } else if contrib {
            Form::Contrib
        } else {
            return None;
        };
        let (inputs, domain) = fused_inputs(g, &r, form, &mut caches)?;
        let rewrite = Rewrite::replace(r.add, "RotaryEmbedding", domain, inputs, vec![]);
        Some(rewrite.removing(r.dead))
    })
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The fused node's inputs and domain, adding the caches (each made once per constant and shape,
/// as large ones are not deduplicated by content).
fn fused_inputs(
    g: &mut Graph,
    r: &Rotary,
    form: Form,
    caches: &mut HashMap<(String, i64, i64, bool), String>,
) -> Option<(Vec<String>, &'static str)> {
    let leading = form == Form::Standard && r.batch == Some(1);
    let mut cache = |g: &mut Graph, table: &str, values: &[f32], hint: &str| -> Option<String> {
        let key = (table.to_owned(), r.seq, r.h, leading);
        if let Some(name) = caches.get(&key) {
            return Some(name.clone());
        }
        let half = r.h / 2;
        let dims = if leading {
            vec![1, r.seq, half]
        } else {
            vec![r.seq, half]
        };
        let name = g
            .add_constant(hint, dtype::FLOAT, dims, f32_bytes(values))
            .ok()?;
        caches.insert(key, name.clone());
        Some(name)
    };
    let cos = cache(g, &r.cos, &r.cos_half, "cos_cache")?;
    let sin = cache(g, &r.sin, &r.sin_half, "sin_cache")?;
    match (form, r.batch) {
        (Form::Contrib, _) => {
            let start = g
                .add_constant("position_ids", dtype::INT64, vec![1], i64_bytes(&[0]))
                .ok()?;
            Some((vec![r.x.clone(), start, cos, sin], MS_DOMAIN))
        }
        (Form::Standard, Some(1)) => Some((vec![r.x.clone(), cos, sin], "")),
        (Form::Standard, Some(batch)) => {
            let ids: Vec<i64> = (0..batch).flat_map(|_| 0..r.seq).collect();
            let ids = g
                .add_constant(
                    "position_ids",
                    dtype::INT64,
                    vec![batch, r.seq],
                    i64_bytes(&ids),
                )
                .ok()?;
            Some((vec![r.x.clone(), cos, sin, ids], ""))
        }
        (Form::Standard, None) => None,
    }
}

/// The value of a one-element int64 constant.
fn i64_scalar(g: &Graph, name: &str) -> Option<i64> {
    let t = g.initializer(name)?;
    if t.dtype != dtype::INT64 || t.numel() != 1 {
        return None;
    }
    le_i64s(t.data.as_slice()?).first().copied()
}

/// The [start, end) a Slice of `x` takes along its last axis (of length `len`, `rank` axes), with
/// ONNX's clamping of negative and out-of-range bounds; None for any other Slice.
pub(super) fn last_axis_range(
    g: &Graph,
    n: &Node,
    x: &str,
    rank: i64,
    len: i64,
) -> Option<(i64, i64)> {
    if !is_op(n, "Slice") {
        return None;
    }
    let [data, starts, ends, axes, rest @ ..] = n.inputs.as_slice() else {
        return None;
    };
    let axis = i64_scalar(g, axes)?;
    if data != x || (axis != -1 && axis != rank - 1) {
        return None;
    }
    match rest {
        [] => {}
        [steps] if steps.is_empty() || i64_scalar(g, steps)? == 1 => {}
        _ => return None,
    }
    let clamp = |v: i64| if v < 0 { v.saturating_add(len) } else { v }.clamp(0, len);
    Some((clamp(i64_scalar(g, starts)?), clamp(i64_scalar(g, ends)?)))
}

/// The (seq, h/2) first half of the table a float32 constant broadcast to (1, 1, seq, h) holds,
/// when both halves of every row are equal.
fn half_table(g: &Graph, name: &str, seq: i64, h: i64) -> Option<Vec<f32>> {
    let dims = &g.initializer(name)?.dims;
    if dims.len() > 4 {
        return None;
    }
    let target = [1, 1, seq, h];
    let aligned = &target[4 - dims.len()..];
    if dims.iter().zip(aligned).any(|(&d, &t)| d != 1 && d != t) {
        return None;
    }
    let values = f32_values(g, name)?;
    let dim = |back: usize| dims.len().checked_sub(back).map_or(1, |i| dims[i]);
    let (rows, cols) = (dim(2), dim(1));
    if values.len() as i64 != rows * cols {
        return None;
    }
    let at = |s: i64, j: i64| {
        let (s, j) = (if rows == 1 { 0 } else { s }, if cols == 1 { 0 } else { j });
        values[(s * cols + j) as usize]
    };
    let half = h / 2;
    let mut out = Vec::with_capacity((seq * half) as usize);
    for s in 0..seq {
        for j in 0..half {
            let v = at(s, j);
            if v != at(s, j + half) {
                return None;
            }
            out.push(v);
        }
    }
    Some(out)
}

/// The rotate-half pattern around a Concat, whatever its cos and sin are.
pub(super) struct Parts<'a> {
    pub(super) x: &'a str,
    /// x's (batch, seq) dims and its static head size
    pub(super) batch: &'a Dim,
    pub(super) seq: &'a Dim,
    pub(super) h: i64,
    pub(super) cos: &'a str,
    pub(super) sin: &'a str,
    /// the Add, rewritten in place into the fused node
    pub(super) add: usize,
    /// the other nodes of the pattern, dropped
    pub(super) dead: [usize; 6],
}

/// `Add(Mul(x, cos), Mul(Concat(Neg(hi), lo), sin))` around the Concat at `concat_at`, x float32
/// (batch, heads, seq, h) with a static even h.
pub(super) fn match_parts<'a>(g: &'a Graph, ix: &Index, concat_at: usize) -> Option<Parts<'a>> {
    // Concat(Neg(hi), lo) on the last axis
    let concat = &g.nodes[concat_at];
    let [negated, lo] = concat.inputs.as_slice() else {
        return None;
    };
    let neg_at = *ix.prod.get(negated)?;
    let neg = &g.nodes[neg_at];
    let [hi] = neg.inputs.as_slice() else {
        return None;
    };
    if !is_op(neg, "Neg")
        || [negated, hi, lo]
            .iter()
            .any(|v| ix.reads.get(*v) != Some(&1))
    {
        return None;
    }
    let (lo_at, hi_at) = (*ix.prod.get(lo)?, *ix.prod.get(hi)?);
    let x = g.nodes[lo_at].inputs.first()?;
    if !is_float(g, x) {
        return None;
    }
    let shape = g.value_type(x)?.shape.as_ref()?;
    let [batch, _, seq, Dim::Fixed(h)] = shape.as_slice() else {
        return None;
    };
    let h = *h;
    let half = h / 2;
    if h < 2 || h % 2 != 0 || !matches!(concat.attr("axis"), Some(AttrValue::Int(-1 | 3))) {
        return None;
    }
    if last_axis_range(g, &g.nodes[lo_at], x, 4, h)? != (0, half)
        || last_axis_range(g, &g.nodes[hi_at], x, 4, h)? != (half, h)
    {
        return None;
    }
    // * sin, + x * cos
    let rotated = concat.outputs.first()?;
    let (sin_at, by_sin) = sole_reader(g, ix, rotated)?;
    if !is_op(by_sin, "Mul") {
        return None;
    }
    let sin = other(by_sin, rotated)?;
    let sin_product = by_sin.outputs.first()?;
    let (add_at, add) = sole_reader(g, ix, sin_product)?;
    if !is_op(add, "Add") {
        return None;
    }
    let by_cos = other(add, sin_product)?;
    let cos_at = *ix.prod.get(by_cos)?;
    let cos_mul = &g.nodes[cos_at];
    if !is_op(cos_mul, "Mul") || ix.reads.get(by_cos) != Some(&1) {
        return None;
    }
    let cos = other(cos_mul, x)?;
    Some(Parts {
        x,
        batch,
        seq,
        h,
        cos,
        sin,
        add: add_at,
        dead: [lo_at, hi_at, neg_at, concat_at, sin_at, cos_at],
    })
}

fn match_rotary(g: &Graph, ix: &Index, concat_at: usize, halves: &mut Halves) -> Option<Rotary> {
    let p = match_parts(g, ix, concat_at)?;
    let (Dim::Fixed(seq), h) = (p.seq, p.h) else {
        return None;
    };
    let seq = *seq;
    // a table beyond MAX_TABLE is no rotary table a model holds; it bounds what is decoded
    if seq <= 0 || seq.checked_mul(h).is_none_or(|n| n > MAX_TABLE) {
        return None;
    }
    let mut half = |table: &str| {
        halves
            .entry((table.to_owned(), seq, h))
            .or_insert_with(|| half_table(g, table, seq, h).map(Rc::new))
            .clone()
    };
    let (cos_half, sin_half) = (half(p.cos)?, half(p.sin)?);
    Some(Rotary {
        x: p.x.to_owned(),
        cos: p.cos.to_owned(),
        sin: p.sin.to_owned(),
        cos_half,
        sin_half,
        batch: match p.batch {
            Dim::Fixed(b) if *b > 0 => Some(*b),
            _ => None,
        },
        seq,
        h,
        add: p.add,
        dead: p.dead,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed, GraphExt};

    fn table(g: &mut Graph, dims: Vec<i64>, v: &[f32]) -> String {
        g.add_constant("t", dtype::FLOAT, dims, f32_bytes(v))
            .expect("table")
    }

    #[test]
    fn tables_broadcast_and_need_equal_halves() {
        let mut g = Graph::new("g");
        // (seq, h) = (2, 4) from a (1, 4) row and from a (2, 1) column
        let row = table(&mut g, vec![1, 4], &[1.0, 2.0, 1.0, 2.0]);
        assert_eq!(half_table(&g, &row, 2, 4), Some(vec![1.0, 2.0, 1.0, 2.0]));
        let col = table(&mut g, vec![1, 1, 2, 1], &[3.0, 4.0]);
        assert_eq!(half_table(&g, &col, 2, 4), Some(vec![3.0, 3.0, 4.0, 4.0]));
        let uneven = table(&mut g, vec![4], &[1.0, 2.0, 2.0, 1.0]);
        assert_eq!(half_table(&g, &uneven, 2, 4), None);
        // a leading dim that is not 1 would change the output's shape
        let batched = table(&mut g, vec![2, 1, 1, 2], &[1.0, 1.0, 1.0, 1.0]);
        assert_eq!(half_table(&g, &batched, 1, 2), None);
    }

    #[test]
    fn slice_bounds_are_clamped_like_onnx() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[1, 1, 2, 4]));
        let (start, end, axis) = (
            g.i64s(&[1], &[-2]),
            g.i64s(&[1], &[i64::MAX]),
            g.i64s(&[1], &[3]),
        );
        g.op("Slice", &[&x, &start, &end, &axis]);
        assert_eq!(last_axis_range(&g, &g.nodes[0], &x, 4, 4), Some((2, 4)));
        assert_eq!(last_axis_range(&g, &g.nodes[0], "other", 4, 4), None);
    }
}
