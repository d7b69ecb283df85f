//! Below opset 23, grouped-query attention (keys and values repeated per query-head group, as
//! transformers' `repeat_kv` and the converter's `enable_gqa` write it; see [`super::chain`]) reads
//! the unrepeated keys and values: each group of G query heads is stacked along the rows, so that one
//! product per key/value head replaces G products against copies of it, and the Expand copying the
//! cache on every decode step goes.
//!
//! ```text
//! q (b, G·h, s, e), k and v (b, h, t, e), repeated to (b, G·h, t, e) before the chain
//! ```
//!
//! becomes (query head i reads key/value head i // G, so a group is G consecutive heads and
//! `(b, G·h, s, e) -> (b, h, G·s, e)` is a plain Reshape)
//!
//! ```text
//! scores = Reshape(MatMul(Mul(Reshape(q, [0, h, G·s, 0]), scale), Transpose(k)), [0, G·h, s, 0])
//! scores = Where(mask, scores, -inf) | Add(scores, bias) | scores      (the chain's own mask)
//! probs  = Softmax(scores) [then Where(closed_rows, 0, probs)]
//! out    = Reshape(MatMul(Reshape(probs, [0, h, G·s, 0]), v), [0, G·h, s, 0])
//! ```
//!
//! The masks stay on the (b, G·h, s, t) scores, where they broadcast as before. The Reshapes' targets
//! are `[0, h, G·s, 0]` and `[0, G·h, s, 0]` (0 copies the batch and the last dim; s read from q when
//! it is dynamic), so empty batches and sequences reshape as well.
//! Open masks (all-true constants) and flags closing no row are dropped, as `open_masks` would.

use super::chain::{match_chain, Chain};
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node, ValueType};
use crate::passes::matching::{fixed, int_attr, shape, Index};
use crate::passes::rewrite::{f32_constant, fuse, i64_constant, new_node, Rewrite};

/// Rewrites every grouped attention chain to read unrepeated keys and values; returns how many.
pub(crate) fn ungroup_repeats(g: &mut Graph) -> usize {
    let find = |g: &Graph, ix: &Index, i: usize| {
        match_chain(g, ix, i).filter(|c| c.k != c.k_read && c.v != c.v_read)
    };
    fuse(g, &["Softmax"], find, emit)
}

/// A fresh float32 value of the given dims.
fn value(g: &mut Graph, hint: &str, dims: Vec<Dim>) -> String {
    g.new_value(
        hint,
        ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(dims),
            sequence: false,
        },
    )
}

fn node(g: &Graph, op: &str, inputs: Vec<String>, output: &str, attrs: Vec<Attribute>) -> Node {
    new_node(g, op, "", inputs, output, attrs)
}

/// A 1-D int64 constant (a shape or axes).
fn shape_constant(g: &mut Graph, values: &[i64]) -> Option<String> {
    i64_constant(g, "shape", vec![values.len() as i64], values)
}

/// The rows of a group stacked: G·s when s is known.
fn stacked(group: i64, rows: &Dim) -> Dim {
    fixed(rows).map_or(Dim::Unknown, |s| Dim::Fixed(group * s))
}

/// The Reshapes' targets `[0, h, G·s, 0]` (to groups) and `[0, G·h, s, 0]` (back to heads): 0 copies
/// the batch and the last dim, and s is read from q when it is not static (never -1, which could not
/// be inferred for an empty batch).
fn reshape_targets(
    g: &mut Graph,
    q: &str,
    s: &Dim,
    (heads, kv_heads): (i64, i64),
    nodes: &mut Vec<Node>,
) -> Option<(String, String)> {
    let group = heads / kv_heads;
    if let Some(s) = fixed(s) {
        let to_groups = shape_constant(g, &[0, kv_heads, group * s, 0])?;
        return Some((to_groups, shape_constant(g, &[0, heads, s, 0])?));
    }
    let one = ValueType {
        dtype: Some(dtype::INT64),
        shape: Some(vec![Dim::Fixed(1)]),
        sequence: false,
    };
    let four = ValueType {
        dtype: Some(dtype::INT64),
        shape: Some(vec![Dim::Fixed(4)]),
        sequence: false,
    };
    let rows = g.new_value("seq", one.clone());
    let (start, end) = (int_attr("start", 2), int_attr("end", 3));
    let read = node(g, "Shape", vec![q.to_owned()], &rows, vec![start, end]);
    nodes.push(read);
    let grouped_rows = g.new_value("grouped_seq", one);
    let factor = shape_constant(g, &[group])?;
    nodes.push(node(
        g,
        "Mul",
        vec![rows.clone(), factor],
        &grouped_rows,
        vec![],
    ));
    let zero = shape_constant(g, &[0])?;
    let axis = || vec![int_attr("axis", 0)];
    let mut target = |g: &mut Graph, hint: &str, h: i64, r: &str| -> Option<String> {
        let lead = shape_constant(g, &[0, h])?;
        let out = g.new_value(hint, four.clone());
        let inputs = vec![lead, r.to_owned(), zero.clone()];
        nodes.push(node(g, "Concat", inputs, &out, axis()));
        Some(out)
    };
    let to_groups = target(g, "to_groups", kv_heads, &grouped_rows)?;
    let to_heads = target(g, "to_heads", heads, &rows)?;
    Some((to_groups, to_heads))
}

/// The rewritten chain, ending in a Reshape that writes the final MatMul's output in its place.
fn emit(g: &mut Graph, c: Chain) -> Option<Rewrite> {
    let (q_dims, k_dims, v_dims) = (shape(g, &c.q)?, shape(g, &c.k)?, shape(g, &c.v)?);
    let heads = fixed(&q_dims[1])?;
    let kv_heads = fixed(&k_dims[1])?;
    let group = heads / kv_heads;
    let (b, s, t) = (q_dims[0].clone(), q_dims[2].clone(), k_dims[2].clone());
    let mut nodes = Vec::new();
    let (to_groups, to_heads) = reshape_targets(g, &c.q, &s, (heads, kv_heads), &mut nodes)?;
    let scale = f32_constant(g, "scale", c.scale)?;
    let neg_inf = f32_constant(g, "neg_inf", f32::NEG_INFINITY)?;
    let zero = f32_constant(g, "zero", 0.0)?;
    let rows = stacked(group, &s);
    let kv = Dim::Fixed(kv_heads);
    let scores_dims = vec![b.clone(), q_dims[1].clone(), s.clone(), t.clone()];
    let mut step = |g: &mut Graph, op: &str, inputs: Vec<String>, dims: Vec<Dim>, attrs| {
        let out = value(g, &op.to_lowercase(), dims);
        nodes.push(node(g, op, inputs, &out, attrs));
        out
    };
    let q_dims_g = vec![b.clone(), kv.clone(), rows.clone(), q_dims[3].clone()];
    let qg = step(
        g,
        "Reshape",
        vec![c.q.clone(), to_groups.clone()],
        q_dims_g.clone(),
        vec![],
    );
    let qs = step(g, "Mul", vec![qg, scale], q_dims_g, vec![]);
    let perm = Attribute {
        name: "perm".into(),
        value: AttrValue::Ints(vec![0, 1, 3, 2]),
    };
    let kt_dims = vec![b.clone(), kv.clone(), k_dims[3].clone(), t.clone()];
    let kt = step(g, "Transpose", vec![c.k.clone()], kt_dims, vec![perm]);
    let sg_dims = vec![b.clone(), kv.clone(), rows.clone(), t.clone()];
    let sg = step(g, "MatMul", vec![qs, kt], sg_dims.clone(), vec![]);
    let mut scores = step(
        g,
        "Reshape",
        vec![sg, to_heads.clone()],
        scores_dims.clone(),
        vec![],
    );
    if let Some(mask) = &c.mask {
        let boolean = g.value_type(mask)?.dtype == Some(dtype::BOOL);
        scores = if boolean {
            let inputs = vec![mask.clone(), scores, neg_inf];
            step(g, "Where", inputs, scores_dims.clone(), vec![])
        } else {
            step(
                g,
                "Add",
                vec![scores, mask.clone()],
                scores_dims.clone(),
                vec![],
            )
        };
    }
    let softmax = vec![int_attr("axis", -1)];
    let mut probs = step(g, "Softmax", vec![scores], scores_dims.clone(), softmax);
    if let Some(flag) = &c.closed_rows {
        let inputs = vec![flag.clone(), zero, probs];
        probs = step(g, "Where", inputs, scores_dims, vec![]);
    }
    let pg = step(g, "Reshape", vec![probs, to_groups], sg_dims, vec![]);
    let og_dims = vec![b, kv, rows, v_dims[3].clone()];
    let og = step(g, "MatMul", vec![pg, c.v.clone()], og_dims, vec![]);
    let rewrite = Rewrite::replace(c.last, "Reshape", "", vec![og, to_heads], vec![])
        .removing(c.dead)
        .inserting_before(nodes);
    Some(rewrite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::matching::is_op;
    use crate::testing::{int, GraphExt};

    /// Keys and values (b, 1, t, e) repeated to `heads`, as transformers' `repeat_kv` writes them.
    fn repeated(g: &mut Graph, x: &str, heads: i64) -> String {
        let axes = g.i64s(&[1], &[2]);
        let wide = g.op("Unsqueeze", &[x, &axes]);
        g.typed(&wide, dtype::FLOAT, &[1, 1, 1, 3, 4]);
        let target = g.i64s(&[5], &[1, 1, heads, 3, 4]);
        let wide = g.op("Expand", &[&wide, &target]);
        g.typed(&wide, dtype::FLOAT, &[1, 1, heads, 3, 4]);
        let shape = g.i64s(&[4], &[1, heads, 3, 4]);
        let out = g.op("Reshape", &[&wide, &shape]);
        g.typed(&out, dtype::FLOAT, &[1, heads, 3, 4]);
        out
    }

    fn chain(g: &mut Graph, heads: i64) -> String {
        let q = g.add_input("q", dtype::FLOAT, None);
        g.typed(&q, dtype::FLOAT, &[1, heads, 2, 4]);
        let k = g.add_input("k", dtype::FLOAT, None);
        g.typed(&k, dtype::FLOAT, &[1, 1, 3, 4]);
        let v = g.add_input("v", dtype::FLOAT, None);
        g.typed(&v, dtype::FLOAT, &[1, 1, 3, 4]);
        let (k, v) = (repeated(g, &k, heads), repeated(g, &v, heads));
        let scale = g.f32s(&[], &[0.5]);
        let qs = g.op("Mul", &[&q, &scale]);
        let perm = Attribute {
            name: "perm".into(),
            value: AttrValue::Ints(vec![0, 1, 3, 2]),
        };
        let kt = g.op_with("Transpose", &[&k], vec![perm]);
        let scores = g.op("MatMul", &[&qs, &kt]);
        g.typed(&scores, dtype::FLOAT, &[1, heads, 2, 3]);
        let probs = g.op_with("Softmax", &[&scores], vec![int("axis", -1)]);
        let out = g.op("MatMul", &[&probs, &v]);
        g.typed(&out, dtype::FLOAT, &[1, heads, 2, 4]);
        g.outputs.push(out.clone());
        out
    }

    #[test]
    fn grouped_keys_are_read_unrepeated() {
        let mut g = Graph::new("g");
        let out = chain(&mut g, 2);
        assert_eq!(ungroup_repeats(&mut g), 1);
        crate::passes::remove_unused_nodes(&mut g);
        assert!(!g.nodes.iter().any(|n| is_op(n, "Expand")));
        let last = g.nodes.last().expect("nodes");
        assert!(is_op(last, "Reshape") && last.outputs == [out]);
        // the products read the key and value inputs directly
        let matmuls: Vec<&Node> = g.nodes.iter().filter(|n| is_op(n, "MatMul")).collect();
        assert_eq!(matmuls.len(), 2);
        assert_eq!(matmuls[1].inputs[1], "v");
    }

    #[test]
    fn chains_without_repeats_are_left_alone() {
        let mut plain = Graph::new("p");
        let q = plain.add_input("q", dtype::FLOAT, None);
        plain.typed(&q, dtype::FLOAT, &[1, 2, 2, 4]);
        let perm = Attribute {
            name: "perm".into(),
            value: AttrValue::Ints(vec![0, 1, 3, 2]),
        };
        let scale = plain.f32s(&[], &[0.5]);
        let qs = plain.op("Mul", &[&q, &scale]);
        let kt = plain.op_with("Transpose", &[&q], vec![perm]);
        let scores = plain.op("MatMul", &[&qs, &kt]);
        let probs = plain.op_with("Softmax", &[&scores], vec![int("axis", -1)]);
        let out = plain.op("MatMul", &[&probs, &q]);
        plain.typed(&out, dtype::FLOAT, &[1, 2, 2, 4]);
        plain.outputs.push(out);
        assert_eq!(ungroup_repeats(&mut plain), 0);
    }
}
