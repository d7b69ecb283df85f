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
//! GPT-OSS rotates the two halves apart, with tables of half the head:
//!
//! ```text
//! x1, x2 = Split(x, [h/2, h/2], axis = -1)
//! c = Unsqueeze([Mul(] Cos(f) [, scalar)], axes = [1])                          (s alike, Sin)
//! out = Concat(Sub(Mul(x1, c), Mul(x2, s)), Add(Mul(x2, c), Mul(x1, s)), axis = -1)
//! ```
//!
//! which is the same rotation (x · [c, c] + Concat(-x2, x1) · [s, s]), fused alike.
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
    /// the node rewritten in place into the fused one (the rotated value's producer)
    add: usize,
    dead: Vec<usize>,
}

/// Rotary embeddings with cos / sin computed from angles at run time → `RotaryEmbedding` (opset 23);
/// returns how many it fused.
pub(crate) fn fuse_live(g: &mut Graph) -> usize {
    fuse(g, &["Concat"], match_either, |g, m| Some(emit(g, m)))
}

/// The same → `com.microsoft.RotaryEmbedding` (onnxruntime level, below opset 23); returns how many
/// it fused.
pub(crate) fn fuse_live_contrib(g: &mut Graph) -> usize {
    fuse(g, &["Concat"], match_either, emit_contrib)
}

fn match_either(g: &Graph, ix: &Index, concat_at: usize) -> Option<Live> {
    match_live(g, ix, concat_at).or_else(|| match_halves(g, ix, concat_at))
}

/// (angles, scale) for `Unsqueeze([Cast to float |] [Mul(] op(Concat(f, f, last axis)) [, scalar)],
/// [1])`.
fn table_source(g: &Graph, ix: &Index, table: &str, op: &str) -> Option<(String, Option<String>)> {
    let (emb, scale) = half_table_source(g, ix, table, op)?;
    let concat = ix.prod.get(&emb).map(|&i| &g.nodes[i])?;
    let [f, f2] = concat.inputs.as_slice() else {
        return None;
    };
    let last = matches!(concat.attr("axis"), Some(AttrValue::Int(-1 | 2)));
    (is_op(concat, "Concat") && f == f2 && last && is_float(g, f)).then(|| (f.clone(), scale))
}

/// (what `op` reads, scale) for `Unsqueeze([Cast to float |] [Mul(] op(f) [, scalar)], [1])`.
fn half_table_source(
    g: &Graph,
    ix: &Index,
    table: &str,
    op: &str,
) -> Option<(String, Option<String>)> {
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
    Some((n.inputs.first()?.clone(), scale))
}

/// `Concat(Sub(Mul(x1, c), Mul(x2, s)), Add(Mul(x2, c), Mul(x1, s)))` at `concat_at` (each Mul's
/// operands in either order), x1 and x2 the halves of one Split of x.
fn match_halves(g: &Graph, ix: &Index, concat_at: usize) -> Option<Live> {
    let producer = |v: &str| ix.prod.get(v).map(|&i| (i, &g.nodes[i]));
    let once = |v: &str| ix.reads.get(v) == Some(&1);
    let concat = &g.nodes[concat_at];
    let [first, second] = concat.inputs.as_slice() else {
        return None;
    };
    let (sub_at, sub) = producer(first)?;
    let (add_at, add) = producer(second)?;
    let last = matches!(concat.attr("axis"), Some(AttrValue::Int(-1 | 3)));
    if !last || !is_op(sub, "Sub") || !is_op(add, "Add") || !once(first) || !once(second) {
        return None;
    }
    // a product's two operands, each Mul read by the Sub or Add alone
    let product = |v: &String| {
        let (at, m) = producer(v)?;
        let [a, b] = m.inputs.as_slice() else {
            return None;
        };
        (is_op(m, "Mul") && once(v)).then_some((at, a.as_str(), b.as_str()))
    };
    let two = |ins: &[String]| -> Option<[(usize, &str, &str); 2]> {
        let [a, b] = ins else {
            return None;
        };
        Some([product(a)?, product(b)?])
    };
    let [m1, m2] = two(&sub.inputs)?;
    let [m3, m4] = two(&add.inputs)?;
    // the Split: x1 and x2, its two outputs, halves of x's last axis
    let (split_at, split) = producer(m1.1)
        .filter(|(_, n)| is_op(n, "Split"))
        .or_else(|| producer(m1.2).filter(|(_, n)| is_op(n, "Split")))?;
    let [x1, x2] = split.outputs.as_slice() else {
        return None;
    };
    let x = split.inputs.first()?;
    let halves_of = |m: (usize, &str, &str), half: &String| -> Option<String> {
        match (m.1 == half.as_str(), m.2 == half.as_str()) {
            (true, false) => Some(m.2.to_owned()),
            (false, true) => Some(m.1.to_owned()),
            _ => None,
        }
    };
    let c = halves_of(m1, x1)?;
    let s = halves_of(m2, x2)?;
    // the Add's products in either order: x2 · c and x1 · s
    let (m3, m4) = if halves_of(m3, x2).as_ref() == Some(&c) {
        (m3, m4)
    } else {
        (m4, m3)
    };
    if halves_of(m3, x2)? != c || halves_of(m4, x1)? != s {
        return None;
    }
    let x_shape = shape(g, x)?;
    let [batch, _, seq, Dim::Fixed(h)] = x_shape.as_slice() else {
        return None;
    };
    let halves_read = [x1, x2].iter().all(|v| ix.reads.get(*v) == Some(&2));
    let axis_last = matches!(split.attr("axis"), Some(AttrValue::Int(-1 | 3)));
    if !is_float(g, x) || h % 2 != 0 || !halves_read || !axis_last {
        return None;
    }
    for v in [x1, x2] {
        if shape(g, v)?.last().and_then(fixed) != Some(h / 2) {
            return None;
        }
    }
    let (angles, scale) = half_table_source(g, ix, &c, "Cos")?;
    if half_table_source(g, ix, &s, "Sin")? != (angles.clone(), scale.clone()) {
        return None;
    }
    let a = shape(g, &angles)?;
    let known = |d: &Dim| !matches!(d, Dim::Unknown);
    let fits = a.len() == 3
        && a[0] == *batch
        && a[1] == *seq
        && known(&a[0])
        && known(&a[1])
        && fixed(&a[2]) == Some(h / 2);
    fits.then(|| Live {
        x: x.clone(),
        angles,
        scale,
        add: concat_at,
        dead: vec![split_at, sub_at, add_at, m1.0, m2.0, m3.0, m4.0],
    })
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
        dead: p.dead.to_vec(),
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

    /// x (2, 3, 5, 4) rotated half by half (GPT-OSS's form) by angles f (2, 5, 2); `sign` false
    /// swaps the Sub and the Add (no rotation).
    fn rotated_halves(g: &mut Graph, sign: bool) -> String {
        let x = g.add_input("x", dtype::FLOAT, None);
        g.typed(&x, dtype::FLOAT, &[2, 3, 5, 4]);
        let f = g.add_input("f", dtype::FLOAT, None);
        g.typed(&f, dtype::FLOAT, &[2, 5, 2]);
        let axes = g.i64s(&[1], &[1]);
        let mut table = |op: &str| {
            let t = g.op(op, &[&f]);
            let t = g.op("Unsqueeze", &[&t, &axes]);
            g.typed(&t, dtype::FLOAT, &[2, 1, 5, 2]);
            t
        };
        let (c, s) = (table("Cos"), table("Sin"));
        let halves = g.split_last(&x, &[2, 2], &["x1", "x2"]);
        let (x1, x2) = (&halves[0], &halves[1]);
        for h in [x1, x2] {
            g.typed(h, dtype::FLOAT, &[2, 3, 5, 2]);
        }
        let (a, b) = (g.op("Mul", &[x1, &c]), g.op("Mul", &[&s, x2]));
        let first = g.op(if sign { "Sub" } else { "Add" }, &[&a, &b]);
        let (a, b) = (g.op("Mul", &[&s, x1]), g.op("Mul", &[x2, &c]));
        let second = g.op(if sign { "Add" } else { "Sub" }, &[&a, &b]);
        let out = g.op_with("Concat", &[&first, &second], vec![int("axis", -1)]);
        g.outputs.push(out.clone());
        out
    }

    #[test]
    fn halves_rotated_apart_fuse() {
        let mut g = Graph::new("g");
        let out = rotated_halves(&mut g, true);
        assert_eq!(fuse_live(&mut g), 1);
        let fused = g.nodes.iter().find(|n| n.op_type == "RotaryEmbedding");
        let fused = fused.expect("fused");
        assert_eq!(fused.outputs, [out]);
        assert_eq!(fused.inputs[0], "x");
        assert!(!g.nodes.iter().any(|n| n.op_type == "Split"));
        let mut g = Graph::new("g");
        rotated_halves(&mut g, false);
        assert_eq!(fuse_live(&mut g), 0);
    }

    #[test]
    fn unequal_halves_are_left_alone() {
        let mut g = Graph::new("g");
        rotary(&mut g, false);
        assert_eq!(fuse_live(&mut g), 0);
    }
}
