//! Rotary embeddings whose cos and sin are computed at run time from the positions (every decode
//! step of a KV-cache model: positions are an input), in the rotate-half form of [`super::rotary`]:
//!
//! ```text
//! emb = Concat(f, f, axis = -1)                      f: (batch, seq, h/2) angles, any computation
//! cos = Unsqueeze([Cast to float32 |] [Mul(] Cos(emb) [, scalar)], axes = [1])   (sin alike, same f)
//! out = Add(Mul(x, cos), Mul(Concat(Neg(hi), lo), sin))                          (x: b, heads, s, h)
//! ```
//!
//! becomes, from opset 23, the standard `RotaryEmbedding(x, cos_cache, sin_cache)` with the 3-D caches
//! (batch, seq, h/2) `[Mul(] Cos(f) [, scalar)]` and `Sin(f)` alike: exact, since both halves of `emb`
//! are `f` (the attention scaling of some rotary types is the same scalar on both). The caches' nodes
//! are made once per match; the CSE stage that follows merges those of the layers sharing them.
//! x's batch and sequence dims must be the angles' (the cache has no broadcasting).
//!
//! At the onnxruntime level below opset 23 it becomes `com.microsoft.RotaryEmbedding(x, ids, cos2,
//! sin2)`, whose caches are 2-D tables indexed by position ids: the same caches flattened to
//! (batch·seq, h/2) rows, and ids (batch, seq) numbering them 0..batch·seq. No table of all positions
//! is precomputed (the graph bounds no position, and dynamic scalings such as longrope compute their
//! angles otherwise): each row is the step's own angles, exact for any rotary type whose cos and sin
//! have this form.

use super::matching::{f32_scalar, fixed, int_attr, is_float, is_op, shape, unsqueeze_axes, Index};
use super::rewrite::{fuse, i64_constant, new_node, Rewrite};
use super::rotary::match_parts;
use super::MS_DOMAIN;
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node, ValueType};

struct Live {
    x: String,
    /// the angles (batch, seq, h/2), and the scalar multiplying cos and sin (if any)
    angles: String,
    scale: Option<String>,
    add: usize,
    dead: [usize; 6],
}

/// Rotary embeddings with cos / sin computed from angles at run time → `RotaryEmbedding` (opset 23);
/// returns how many it fused.
pub(crate) fn fuse_live(g: &mut Graph) -> usize {
    fuse(g, &["Concat"], match_live, |g, m| Some(emit(g, m)))
}

/// The same → `com.microsoft.RotaryEmbedding` (onnxruntime level, below opset 23); returns how many
/// it fused.
pub(crate) fn fuse_live_contrib(g: &mut Graph) -> usize {
    fuse(g, &["Concat"], match_live, emit_contrib)
}

/// (angles, scale) for `Unsqueeze([Cast to float |] [Mul(] op(Concat(f, f, last axis)) [, scalar)],
/// [1])`.
fn table_source(g: &Graph, ix: &Index, table: &str, op: &str) -> Option<(String, Option<String>)> {
    let producer = |v: &str| ix.prod.get(v).map(|&i| &g.nodes[i]);
    let unsq = producer(table)?;
    if !is_op(unsq, "Unsqueeze") || unsqueeze_axes(g, unsq)? != [1] {
        return None;
    }
    let mut n = producer(unsq.inputs.first()?)?;
    let same_type_cast = |n: &Node| {
        is_op(n, "Cast")
            && matches!(n.attr("to"), Some(AttrValue::Int(t)) if *t == i64::from(dtype::FLOAT))
    };
    if is_op(n, "Identity") || same_type_cast(n) {
        n = producer(n.inputs.first()?)?;
    }
    let mut scale = None;
    if is_op(n, "Mul") {
        let [a, b] = n.inputs.as_slice() else {
            return None;
        };
        let (value, s) = if f32_scalar(g, b).is_some() {
            (a, b)
        } else {
            (b, a)
        };
        f32_scalar(g, s)?;
        if shape(g, s).is_none_or(|d| d.len() > 3) {
            return None;
        }
        scale = Some(s.clone());
        n = producer(value)?;
    }
    if !is_op(n, op) {
        return None;
    }
    let concat = producer(n.inputs.first()?)?;
    let [f, f2] = concat.inputs.as_slice() else {
        return None;
    };
    let last = matches!(concat.attr("axis"), Some(AttrValue::Int(-1 | 2)));
    (is_op(concat, "Concat") && f == f2 && last && is_float(g, f)).then(|| (f.clone(), scale))
}

fn match_live(g: &Graph, ix: &Index, concat_at: usize) -> Option<Live> {
    let p = match_parts(g, ix, concat_at)?;
    let (angles, scale) = table_source(g, ix, p.cos, "Cos")?;
    if table_source(g, ix, p.sin, "Sin")? != (angles.clone(), scale.clone()) {
        return None;
    }
    // the caches must be x's batch and sequence exactly (recorded dims), and h/2 wide
    let a = shape(g, &angles)?;
    let known = |d: &Dim| !matches!(d, Dim::Unknown);
    let fits = a.len() == 3
        && a[0] == *p.batch
        && a[1] == *p.seq
        && known(&a[0])
        && known(&a[1])
        && fixed(&a[2]) == Some(p.h / 2);
    fits.then(|| Live {
        x: p.x.to_owned(),
        angles,
        scale,
        add: p.add,
        dead: p.dead,
    })
}

/// `[Mul(] Cos(angles) [, scale)]` and the same with Sin, (batch, seq, h/2), their nodes added to `nodes`.
fn caches(g: &mut Graph, m: &Live, nodes: &mut Vec<Node>) -> (String, String) {
    let ty = g.value_type(&m.angles).cloned().unwrap_or(ValueType {
        dtype: Some(dtype::FLOAT),
        shape: None,
        sequence: false,
    });
    let mut cache = |g: &mut Graph, op: &str| {
        let mut out = g.new_value(&op.to_lowercase(), ty.clone());
        nodes.push(node(g, op, vec![m.angles.clone()], &out, vec![]));
        if let Some(s) = &m.scale {
            let scaled = g.new_value("scaled", ty.clone());
            nodes.push(node(g, "Mul", vec![out, s.clone()], &scaled, vec![]));
            out = scaled;
        }
        out
    };
    (cache(g, "Cos"), cache(g, "Sin"))
}

fn emit(g: &mut Graph, m: Live) -> Rewrite {
    let mut nodes = Vec::new();
    let (cos, sin) = caches(g, &m, &mut nodes);
    Rewrite::replace(m.add, "RotaryEmbedding", "", vec![m.x, cos, sin], vec![])
        .removing(m.dead)
        .inserting_before(nodes)
}

fn int64(dims: Vec<Dim>) -> ValueType {
    ValueType {
        dtype: Some(dtype::INT64),
        shape: Some(dims),
        sequence: false,
    }
}

/// onnxruntime's operator reads its caches as 2-D tables indexed by position ids: the caches
/// flattened to (batch·seq, h/2) rows, and ids numbering those rows, (batch, seq) = 0..batch·seq.
fn emit_contrib(g: &mut Graph, m: Live) -> Option<Rewrite> {
    let mut nodes = Vec::new();
    let (cos, sin) = caches(g, &m, &mut nodes);
    let half = fixed(shape(g, &m.angles)?.get(2)?)?;
    let rows_shape = i64_constant(g, "rotary_dims", vec![2], &[-1, half])?;
    let table = ValueType {
        dtype: Some(dtype::FLOAT),
        shape: Some(vec![Dim::Unknown, Dim::Fixed(half)]),
        sequence: false,
    };
    let flat = |g: &mut Graph, cache: String, nodes: &mut Vec<Node>| {
        let out = g.new_value("table", table.clone());
        nodes.push(node(
            g,
            "Reshape",
            vec![cache, rows_shape.clone()],
            &out,
            vec![],
        ));
        out
    };
    let cos2 = flat(g, cos, &mut nodes);
    let sin2 = flat(g, sin, &mut nodes);
    let a = shape(g, &m.angles)?;
    let batch_seq = g.new_value("batch_seq", int64(vec![Dim::Fixed(2)]));
    let (start, end) = (int_attr("start", 0), int_attr("end", 2));
    nodes.push(node(
        g,
        "Shape",
        vec![m.angles.clone()],
        &batch_seq,
        vec![start, end],
    ));
    let count = g.new_value("rows", int64(vec![Dim::Fixed(1)]));
    let (start, end) = (int_attr("start", 0), int_attr("end", 1));
    nodes.push(node(
        g,
        "Shape",
        vec![cos2.clone()],
        &count,
        vec![start, end],
    ));
    let axes = i64_constant(g, "rotary_dims", vec![1], &[0])?;
    let count0 = g.new_value("rows", int64(vec![]));
    nodes.push(node(g, "Squeeze", vec![count, axes], &count0, vec![]));
    let (zero, one) = (
        i64_constant(g, "rotary_dims", vec![], &[0])?,
        i64_constant(g, "rotary_dims", vec![], &[1])?,
    );
    let numbered = g.new_value("row_ids", int64(vec![Dim::Unknown]));
    nodes.push(node(g, "Range", vec![zero, count0, one], &numbered, vec![]));
    let ids = g.new_value("position_ids", int64(vec![a[0].clone(), a[1].clone()]));
    nodes.push(node(g, "Reshape", vec![numbered, batch_seq], &ids, vec![]));
    let inputs = vec![m.x, ids, cos2, sin2];
    let rewrite = Rewrite::replace(m.add, "RotaryEmbedding", MS_DOMAIN, inputs, vec![])
        .removing(m.dead)
        .inserting_before(nodes);
    Some(rewrite)
}

fn node(g: &Graph, op: &str, inputs: Vec<String>, output: &str, attrs: Vec<Attribute>) -> Node {
    new_node(g, op, "", inputs, output, attrs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{int, GraphExt};

    /// x (2, 3, 5, 4) rotated by angles f (2, 5, 2) computed at run time.
    fn rotary(g: &mut Graph, duplicate_halves: bool) -> String {
        let x = g.add_input("x", dtype::FLOAT, None);
        g.typed(&x, dtype::FLOAT, &[2, 3, 5, 4]);
        let f = g.add_input("f", dtype::FLOAT, None);
        g.typed(&f, dtype::FLOAT, &[2, 5, 2]);
        let other_half = if duplicate_halves {
            f.clone()
        } else {
            g.op("Neg", &[&f])
        };
        let emb = g.op_with("Concat", &[&f, &other_half], vec![int("axis", -1)]);
        g.typed(&emb, dtype::FLOAT, &[2, 5, 4]);
        let axes = g.i64s(&[1], &[1]);
        let mut table = |op: &str| {
            let t = g.op(op, &[&emb]);
            let t = g.op("Unsqueeze", &[&t, &axes]);
            g.typed(&t, dtype::FLOAT, &[2, 1, 5, 4]);
            t
        };
        let (cos, sin) = (table("Cos"), table("Sin"));
        let slice = |g: &mut Graph, from: i64, to: i64| {
            let (a, b, ax) = (
                g.i64s(&[1], &[from]),
                g.i64s(&[1], &[to]),
                g.i64s(&[1], &[-1]),
            );
            g.op("Slice", &[&x, &a, &b, &ax])
        };
        let lo = slice(g, 0, 2);
        let hi = slice(g, 2, 4);
        let neg = g.op("Neg", &[&hi]);
        let rotated = g.op_with("Concat", &[&neg, &lo], vec![int("axis", -1)]);
        let by_sin = g.op("Mul", &[&rotated, &sin]);
        let by_cos = g.op("Mul", &[&x, &cos]);
        let out = g.op("Add", &[&by_cos, &by_sin]);
        g.outputs.push(out.clone());
        out
    }

    #[test]
    fn angles_computed_at_run_time_fuse() {
        let mut g = Graph::new("g");
        let out = rotary(&mut g, true);
        assert_eq!(fuse_live(&mut g), 1);
        let fused = g.nodes.iter().find(|n| n.op_type == "RotaryEmbedding");
        let fused = fused.expect("fused");
        assert_eq!(fused.outputs, [out]);
        assert_eq!(fused.inputs[0], "x");
    }

    #[test]
    fn unequal_halves_are_left_alone() {
        let mut g = Graph::new("g");
        rotary(&mut g, false);
        assert_eq!(fuse_live(&mut g), 0);
    }
}
