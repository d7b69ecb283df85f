//! After [`super::shared_cache`] and the rotary fusions, at the onnxruntime level: the rotary embedding
//! of a `GroupQueryAttention`'s query and key moves into the kernel (`do_rotary = 1`), and, once the
//! products are packed, its query, key and value read the one packed product (`packed_qkv`), as the
//! onnxruntime-genai builder's packages do:
//!
//! ```text
//! q3 = Reshape(Transpose(RotaryEmbedding(Transpose(Reshape(q, [b, s, h, e])), ids, cos, sin)))  (k alike)
//! v3 = Reshape(Reshape(v, [b, s, h, e]), [b, s, h·e])
//! o, pk, pv = GroupQueryAttention(q3, k3, v3, past_k, past_v, seqlens_k, total)
//! ```
//!
//! becomes `GroupQueryAttention(q, k, v, past_k, past_v, seqlens_k, total, cos_cache, sin_cache,
//! position_ids)` with `do_rotary = 1`, and `q, k, v = Split(x)` then `GroupQueryAttention(x, "", "",
//! ...)`. Per layer this drops two RotaryEmbedding, four Transpose and six Reshape nodes, and the Split
//! (measured at 8 layers: 0.6 ms of a 12.9 ms decode step against the builder's 11.8).
//!
//! The kernel reads cos and sin from tables of every position (`cos_cache[p]`, `p < rows`; onnxruntime
//! refuses a total length past the rows). They are computed here when the angles are the plain
//! `position_ids · inv_freq` the models' default rotary computes (`[Mul(] Cos | Sin(Mul(Cast<float>(
//! Unsqueeze(position_ids, -1)), inv_freq)) [, scale)]`, inv_freq a constant: Llama's scaled kinds
//! too), in float32 as the graph does, for `Graph::shared_cache_positions` rows (the package's context
//! length; at most 256 MiB of tables, else the graph's form stays). Dynamic scalings (angles from the
//! sequence length) keep the graph's form. The position
//! ids stay an input of the kernel: with them it rotates each row at its own positions while decoding,
//! and a prompt from its first row's start, as right-padded rows (genai's) have it.
//!
//! Only float32 heads: a half graph computes its tables through Casts this pass does not reproduce.

use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::passes::matching::{
    f32_scalar, f32_values, fixed, int_attr, int_of, is_op, shape, unsqueeze_axes, Index,
};
use crate::passes::rewrite::{apply, new_node, Rewrite};
use crate::passes::rotary::last_axis_range;
use crate::passes::MS_DOMAIN;

/// The rotary angles `position_ids · inv_freq` (times `scale` for cos and sin).
#[derive(Clone, PartialEq)]
struct Angles {
    positions: String,
    inv_freq: Vec<f32>,
    scale: f32,
}

/// A rotated head input of the kernel traced back to the unrotated 3-D value.
struct Rotated {
    y: String,
    angles: Angles,
    dead: Vec<usize>,
    /// a per-head norm before the rotation (Gemma 3's `q_norm` / `k_norm`), which stays
    normed: Option<Normed>,
}

/// `norm` (a node, over each head's last axis) read the heads as `[b, h, s, e]`; the kernel reads
/// it over `x4` (`[b, s, h, e]`: the last axis the same) reshaped by `shape3`.
struct Normed {
    norm: usize,
    x4: String,
    shape3: String,
}

/// A norm over the last axis alone: the same over `[b, h, s, e]` as over `[b, s, h, e]`.
fn last_axis_norm(n: &Node) -> bool {
    let norm = is_op(n, "SimplifiedLayerNormalization") || is_op(n, "RMSNormalization");
    let last = match n.attr("axis") {
        None => true,
        Some(AttrValue::Int(a)) => *a == -1 || *a == 3,
        Some(_) => false,
    };
    norm && last && n.outputs.len() == 1
}

fn producer<'a>(g: &'a Graph, ix: &Index, v: &str) -> Option<(usize, &'a Node)> {
    let at = *ix.prod.get(v)?;
    Some((at, &g.nodes[at]))
}

/// `v`'s producer, when `v` is read once (by the node being matched).
fn sole<'a>(g: &'a Graph, ix: &Index, v: &str) -> Option<(usize, &'a Node)> {
    (ix.reads.get(v) == Some(&1))
        .then(|| producer(g, ix, v))
        .flatten()
}

fn is_swap(n: &Node) -> bool {
    is_op(n, "Transpose")
        && matches!(n.attr("perm"), Some(AttrValue::Ints(p)) if p == &[0, 2, 1, 3])
}

fn unsqueezed_last(g: &Graph, n: &Node) -> bool {
    is_op(n, "Unsqueeze") && unsqueeze_axes(g, n).is_some_and(|a| a == [-1] || a == [2])
}

/// The angles of a cos or sin table (`op`), rows `Reshape`d (contrib) or 3-D (standard).
fn angles(g: &Graph, ix: &Index, table: &str, op: &str) -> Option<Angles> {
    let mut v = table.to_owned();
    if let Some((_, n)) = producer(g, ix, &v).filter(|(_, n)| is_op(n, "Reshape")) {
        v = n.inputs.first()?.clone();
    }
    let (_, mut n) = producer(g, ix, &v)?;
    let mut scale = 1.0;
    if is_op(n, "Mul") {
        let [a, b] = n.inputs.as_slice() else {
            return None;
        };
        let (s, rest) = match (f32_scalar(g, a), f32_scalar(g, b)) {
            (Some(s), None) => (s, b),
            (None, Some(s)) => (s, a),
            _ => return None,
        };
        scale = s;
        n = producer(g, ix, rest)?.1;
    }
    if !is_op(n, op) {
        return None;
    }
    let (_, m) = producer(g, ix, n.inputs.first()?)?;
    let [a, b] = m.inputs.as_slice() else {
        return None;
    };
    if !is_op(m, "Mul") {
        return None;
    }
    let constant = |c: &str| {
        let t = g.initializer(c)?;
        if t.dims.len() != 1 || t.dtype != dtype::FLOAT {
            return None;
        }
        // a buffer the model computed, written later from the package's file: its values handed in
        let known = g.known_values.get(c).map(|b| crate::tensor::le_f32s(b));
        f32_values(g, c).or(known)
    };
    let (inv_freq, cast) = match (constant(a), constant(b)) {
        (Some(f), None) => (f, b),
        (None, Some(f)) => (f, a),
        _ => return None,
    };
    let (_, cast) = producer(g, ix, cast)?;
    let to_float =
        matches!(cast.attr("to"), Some(AttrValue::Int(t)) if *t == i64::from(dtype::FLOAT));
    let (_, unsq) = producer(g, ix, cast.inputs.first()?)?;
    let positions = unsq.inputs.first()?.clone();
    let is_input = g.inputs.contains(&positions)
        && g.value_type(&positions).and_then(|t| t.dtype) == Some(dtype::INT64)
        && shape(g, &positions).is_some_and(|s| s.len() == 2);
    (is_op(cast, "Cast") && to_float && unsqueezed_last(g, unsq) && is_input).then_some(Angles {
        positions,
        inv_freq,
        scale,
    })
}

/// `packed` = `Reshape(Transpose(RotaryEmbedding(Transpose(Reshape(y)))))`, y of packed's shape.
fn rotated(g: &Graph, ix: &Index, packed: &str) -> Option<Rotated> {
    let (p_at, p) = sole(g, ix, packed)?;
    let (t2_at, t2) = sole(g, ix, p.inputs.first()?)?;
    let (r_at, r) = sole(g, ix, t2.inputs.first()?)?;
    let contrib = r.op_type == "RotaryEmbedding" && r.domain == MS_DOMAIN;
    let standard = is_op(r, "RotaryEmbedding");
    let plain = |name: &str| match r.attr(name) {
        None => true,
        Some(AttrValue::Int(v)) => *v == 0,
        Some(_) => false,
    };
    if !is_op(p, "Reshape") || !is_swap(t2) || !(contrib || standard) {
        return None;
    }
    if !plain("interleaved") || !plain("rotary_embedding_dim") || r.attr("num_heads").is_some() {
        return None;
    }
    let ((true, [_, _, cos, sin]) | (false, [_, cos, sin])) = (contrib, r.inputs.as_slice()) else {
        return None;
    };
    let (mut t1_at, mut t1) = sole(g, ix, r.inputs.first()?)?;
    let mut norm = None;
    if last_axis_norm(t1) {
        norm = Some(t1_at);
        (t1_at, t1) = sole(g, ix, t1.inputs.first()?)?;
    }
    let (x_at, x4) = sole(g, ix, t1.inputs.first()?)?;
    if !is_swap(t1) || !is_op(x4, "Reshape") {
        return None;
    }
    let y = x4.inputs.first()?.clone();
    let a = angles(g, ix, cos, "Cos")?;
    if angles(g, ix, sin, "Sin")? != a || shape(g, &y)? != shape(g, packed)? {
        return None;
    }
    let Some(norm) = norm else {
        return Some(Rotated {
            y,
            angles: a,
            dead: vec![p_at, t2_at, r_at, t1_at, x_at],
            normed: None,
        });
    };
    // the norm stays, over the heads as the Reshape gives them; the rest of the chain goes
    Some(Rotated {
        y: packed.to_owned(),
        angles: a,
        dead: vec![p_at, t2_at, r_at, t1_at, norm],
        normed: Some(Normed {
            norm,
            x4: x4.outputs.first()?.clone(),
            shape3: p.inputs.get(1)?.clone(),
        }),
    })
}

/// The kernel's input of a normed head (`Rotated::normed`): the norm over `[b, s, h, e]`, reshaped to
/// `[b, s, h·e]`, as nodes to insert; the value `y` the chain ended in is written anew.
fn normed_input(g: &mut Graph, r: &Rotated, m: &Normed, nodes: &mut Vec<Node>) -> Option<()> {
    let norm = g.nodes.get(m.norm)?.clone();
    let ty = g.value_type(&m.x4)?.clone();
    let heads = g.new_value("normed_heads", ty);
    let mut inputs = norm.inputs.clone();
    *inputs.first_mut()? = m.x4.clone();
    nodes.push(new_node(
        g,
        &norm.op_type,
        &norm.domain,
        inputs,
        &heads,
        norm.attrs,
    ));
    nodes.push(new_node(
        g,
        "Reshape",
        "",
        vec![heads, m.shape3.clone()],
        &r.y,
        vec![],
    ));
    Some(())
}

/// `v3` through Reshapes, Identities (and pairs of adjacent `[0, 2, 1, 3]` Transposes, which cancel) back to the
/// earliest value of its own shape, and the nodes that go: row-major order is all a Reshape keeps, so
/// a value of the same shape on such a path holds the same data.
fn unreshaped(g: &Graph, ix: &Index, v3: &str) -> (String, Vec<usize>) {
    let want = shape(g, v3);
    let (mut best, mut dead, mut walk, mut seen) =
        (v3.to_owned(), Vec::new(), v3.to_owned(), Vec::new());
    // the nodes go while what they make is read on this path alone; past a shared value they stay
    let mut alone = true;
    while let Some((at, n)) = producer(g, ix, &walk) {
        alone &= ix.reads.get(&walk) == Some(&1);
        let Some(input) = n.inputs.first() else { break };
        if is_op(n, "Reshape") || is_op(n, "Identity") {
            seen.extend(alone.then_some(at));
            walk = input.clone();
        } else if is_swap(n) {
            let Some((before, m)) = producer(g, ix, input).filter(|(_, m)| is_swap(m)) else {
                break;
            };
            let Some(source) = m.inputs.first() else {
                break;
            };
            seen.extend(alone.then_some(at));
            alone &= ix.reads.get(input) == Some(&1);
            seen.extend(alone.then_some(before));
            walk = source.clone();
        } else {
            break;
        }
        if want.is_some() && shape(g, &walk) == want {
            best = walk.clone();
            dead = seen.clone();
        }
    }
    (best, dead)
}

/// The most bytes the two tables may take: a context of millions of positions (Llama 4's 10M) would
/// make the package larger than its weights; such a graph keeps its rotary nodes.
const MAX_TABLE_BYTES: usize = 256 << 20;

/// The (cos, sin) tables of `a`, `rows` positions (made once per angles); None past
/// [`MAX_TABLE_BYTES`].
fn tables(g: &mut Graph, a: &Angles, rows: usize) -> Option<(String, String)> {
    let half = a.inv_freq.len();
    if rows.checked_mul(half)?.checked_mul(8)? > MAX_TABLE_BYTES {
        return None;
    }
    let (mut cos, mut sin) = (
        Vec::with_capacity(rows * half * 4),
        Vec::with_capacity(rows * half * 4),
    );
    for p in 0..rows {
        #[allow(clippy::cast_precision_loss)] // positions below 2^24 are exact
        let position = p as f32;
        for &f in &a.inv_freq {
            // float32 as the graph computes it: the angle, then cos / sin, then the scale
            let angle = position * f;
            cos.extend_from_slice(&(angle.cos() * a.scale).to_le_bytes());
            sin.extend_from_slice(&(angle.sin() * a.scale).to_le_bytes());
        }
    }
    let dims = vec![i64::try_from(rows).ok()?, i64::try_from(half).ok()?];
    let cos = g
        .add_constant("cos_cache", dtype::FLOAT, dims.clone(), cos)
        .ok()?;
    let sin = g.add_constant("sin_cache", dtype::FLOAT, dims, sin).ok()?;
    Some((cos, sin))
}

/// Moves the rotary embeddings of GroupQueryAttention's query and key into the kernel; returns how
/// many nodes it changed (0 unless the graph names its shared caches' positions).
pub(crate) fn fold_rotary(g: &mut Graph) -> usize {
    let Some(rows) = g.shared_cache_positions else {
        return 0;
    };
    if !g.nodes.iter().any(|n| n.op_type == "GroupQueryAttention") {
        return 0;
    }
    // a partial rotary over the whole head (Phi-3's) concatenates an empty pass-through slice to the
    // rotated heads: that Concat and its slice go first, so that the chain below matches
    crate::passes::noops::mark_noops(g);
    crate::passes::cleanup::remove_identities(g);
    crate::passes::cleanup::remove_unused_nodes(g);
    let ix = Index::new(g);
    let mut found = Vec::new();
    for (at, n) in g.nodes.iter().enumerate() {
        let kernel = n.op_type == "GroupQueryAttention" && n.domain == MS_DOMAIN;
        // 7 inputs, or 12 with no optional one but the sinks (`head_sink`, shared_cache's for GPT-OSS)
        let sinks_only = n.inputs.len() == 12 && n.inputs[7..11].iter().all(String::is_empty);
        if !kernel || !(n.inputs.len() == 7 || sinks_only) || n.attr("do_rotary").is_some() {
            continue;
        }
        let float = g.value_type(&n.inputs[0]).and_then(|t| t.dtype) == Some(dtype::FLOAT);
        let (Some(q), Some(k)) = (rotated(g, &ix, &n.inputs[0]), rotated(g, &ix, &n.inputs[1]))
        else {
            continue;
        };
        // the kernel's tables: half the head, a multiple of 8
        let head = shape(g, &q.y)
            .and_then(|s| s.last().cloned())
            .and_then(|d| if let Dim::Fixed(w) = d { Some(w) } else { None });
        let half = q.angles.inv_freq.len();
        let head_size = match (head, int_of(n, "num_heads")) {
            (Some(w), Some(h)) if h > 0 => Some(w / h),
            _ => None,
        };
        if !float || q.angles != k.angles || half % 8 != 0 || head_size != Some(2 * half as i64) {
            continue;
        }
        found.push((at, q, k));
    }
    // one pair of tables for every layer of the same angles (large tables are not deduplicated)
    let mut made: Vec<(Angles, (String, String))> = Vec::new();
    let mut rewrites = Vec::new();
    for (at, q, k) in found {
        let known = made
            .iter()
            .find(|(a, _)| *a == q.angles)
            .map(|(_, pair)| pair.clone());
        let Some((cos, sin)) = known.or_else(|| tables(g, &q.angles, rows)) else {
            continue;
        };
        if !made.iter().any(|(a, _)| *a == q.angles) {
            made.push((q.angles.clone(), (cos.clone(), sin.clone())));
        }
        let mut before = Vec::new();
        let heads = [&q, &k].map(|r| r.normed.as_ref().map(|m| (r, m)));
        if heads
            .into_iter()
            .flatten()
            .any(|(r, m)| normed_input(g, r, m, &mut before).is_none())
        {
            continue;
        }
        let n = &g.nodes[at];
        let (v, v_dead) = unreshaped(g, &ix, &n.inputs[2]);
        let mut inputs = vec![q.y, k.y, v];
        inputs.extend(n.inputs[3..7].iter().cloned());
        inputs.extend([cos, sin, q.angles.positions.clone()]);
        if let Some(sinks) = n.inputs.get(11) {
            inputs.extend([String::new(), sinks.clone()]);
        }
        let mut attrs: Vec<_> = n.attrs.clone();
        attrs.push(int_attr("do_rotary", 1));
        attrs.push(int_attr("rotary_interleaved", 0));
        let dead = q.dead.into_iter().chain(k.dead).chain(v_dead);
        rewrites.push(
            Rewrite::replace(at, "GroupQueryAttention", MS_DOMAIN, inputs, attrs)
                .removing(dead)
                .inserting_before(before),
        );
    }
    apply(g, rewrites)
}

/// `x` when `q, k, v` are `Slice(x)`s along its last axis, read by the kernel alone, that cover it in
/// order from 0 to its end (Phi-3's one qkv product sliced apart), with the Slices' indices.
fn sliced_whole(g: &Graph, ix: &Index, qkv: &[String]) -> Option<(String, Vec<usize>)> {
    let x = sole(g, ix, qkv.first()?)?.1.inputs.first()?;
    let dims = shape(g, x)?;
    let (rank, width) = (
        i64::try_from(dims.len()).ok()?,
        dims.last().and_then(fixed)?,
    );
    let (mut next, mut dead) = (0, Vec::new());
    for v in qkv {
        let (at, n) = sole(g, ix, v)?;
        let (start, end) = last_axis_range(g, n, x, rank, width)?;
        if start != next {
            return None;
        }
        next = end;
        dead.push(at);
    }
    (next == width).then(|| (x.clone(), dead))
}

/// `GroupQueryAttention(q, k, v, ...)` with `q, k, v = Split(x, axis = -1)` (or three Slices covering
/// `x`'s last axis in order) read by it alone becomes `GroupQueryAttention(x, "", "", ...)`: the
/// kernel's packed form; returns how many it changed.
pub(crate) fn pack_qkv(g: &mut Graph) -> usize {
    if !g.nodes.iter().any(|n| n.op_type == "GroupQueryAttention") {
        return 0;
    }
    // what the rotary fold left unread still counts as a reader of the Split's outputs
    crate::passes::cleanup::remove_unused_nodes(g);
    let ix = Index::new(g);
    let mut rewrites = Vec::new();
    for (at, n) in g.nodes.iter().enumerate() {
        if n.op_type != "GroupQueryAttention" || n.domain != MS_DOMAIN || n.inputs.len() < 3 {
            continue;
        }
        if let Some((x, dead)) = sliced_whole(g, &ix, &n.inputs[..3]) {
            let three_d = shape(g, &x).is_some_and(|s| s.len() == 3);
            if three_d {
                let mut inputs = n.inputs.clone();
                inputs[0] = x;
                inputs[1] = String::new();
                inputs[2] = String::new();
                rewrites.push(Rewrite::rewire(at, inputs).removing(dead));
                continue;
            }
        }
        let Some((split_at, split)) = sole(g, &ix, &n.inputs[0]) else {
            continue;
        };
        let axis_last = matches!(split.attr("axis"), Some(AttrValue::Int(-1 | 2)));
        let three_d = split
            .inputs
            .first()
            .and_then(|x| shape(g, x))
            .is_some_and(|s| s.len() == 3);
        let outputs_read_once = split.outputs.iter().all(|o| ix.reads.get(o) == Some(&1));
        if !is_op(split, "Split")
            || !axis_last
            || !three_d
            || !outputs_read_once
            || split.outputs != n.inputs[..3]
        {
            continue;
        }
        let mut inputs = n.inputs.clone();
        inputs[0] = split.inputs[0].clone();
        inputs[1] = String::new();
        inputs[2] = String::new();
        rewrites.push(Rewrite::rewire(at, inputs).removing([split_at]));
    }
    apply(g, rewrites)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Attribute;
    use crate::testing::{fixed, int, GraphExt};

    const HALF: usize = 8; // head 16

    fn ints(name: &str, v: &[i64]) -> Attribute {
        Attribute {
            name: name.to_owned(),
            value: AttrValue::Ints(v.to_vec()),
        }
    }

    fn ms(
        g: &mut Graph,
        op: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<Attribute>,
    ) -> Vec<String> {
        let inputs = inputs.iter().map(|s| (*s).to_owned()).collect();
        let hints: Vec<String> = (0..outputs)
            .map(|i| format!("{}_{i}", op.to_lowercase()))
            .collect();
        g.add_node(op, MS_DOMAIN, inputs, &hints, attrs, None)
            .expect("node")
    }

    /// y (2, 3, heads·16) rotated as the contrib fusion leaves it, packed back to (2, 3, heads·16).
    fn rotated_chain(
        g: &mut Graph,
        y: &str,
        heads: i64,
        ids: &str,
        cos: &str,
        sin: &str,
    ) -> String {
        let shape4 = g.i64s(&[4], &[0, 0, heads, 16]);
        let x4 = g.op("Reshape", &[y, &shape4]);
        g.typed(&x4, dtype::FLOAT, &[2, 3, heads, 16]);
        let t1 = g.op_with("Transpose", &[&x4], vec![ints("perm", &[0, 2, 1, 3])]);
        let r = ms(g, "RotaryEmbedding", &[&t1, ids, cos, sin], 1, vec![]).remove(0);
        let t2 = g.op_with("Transpose", &[&r], vec![ints("perm", &[0, 2, 1, 3])]);
        let shape3 = g.i64s(&[3], &[0, 0, heads * 16]);
        let packed = g.op("Reshape", &[&t2, &shape3]);
        g.typed(&packed, dtype::FLOAT, &[2, 3, heads * 16]);
        packed
    }

    /// A layer's GroupQueryAttention over q, k rotated by `position_ids · inv_freq` (scaled by 0.5).
    fn graph() -> (Graph, Vec<f32>) {
        let mut g = Graph::new("g");
        g.shared_cache_positions = Some(6);
        let pos = g.add_input("position_ids", dtype::INT64, fixed(&[2, 3]));
        let ids = g.add_input("row_ids", dtype::INT64, fixed(&[2, 3]));
        let q = g.add_input("q", dtype::FLOAT, fixed(&[2, 3, 32]));
        let k = g.add_input("k", dtype::FLOAT, fixed(&[2, 3, 16]));
        let v = g.add_input("v", dtype::FLOAT, fixed(&[2, 3, 16]));
        let rest: Vec<String> = ["pk", "pv", "seqlens", "total"]
            .iter()
            .map(|n| g.add_input(n, dtype::FLOAT, None))
            .collect();
        let inv_freq: Vec<f32> = (0..HALF)
            .map(|i| 1.0 / 10000f32.powf(i as f32 / HALF as f32))
            .collect();
        let freq = g.f32s(&[HALF as i64], &inv_freq);
        let axes = g.i64s(&[1], &[-1]);
        let u = g.op("Unsqueeze", &[&pos, &axes]);
        let c = g.op_with("Cast", &[&u], vec![int("to", i64::from(dtype::FLOAT))]);
        let angles = g.op("Mul", &[&c, &freq]);
        let half_scale = g.f32s(&[], &[0.5]);
        let rows = g.i64s(&[2], &[-1, HALF as i64]);
        let mut tables = Vec::new();
        for op in ["Cos", "Sin"] {
            let t = g.op(op, &[&angles]);
            let scaled = g.op("Mul", &[&t, &half_scale]);
            tables.push(g.op("Reshape", &[&scaled, &rows]));
        }
        let pq = rotated_chain(&mut g, &q, 2, &ids, &tables[0], &tables[1]);
        let pk = rotated_chain(&mut g, &k, 1, &ids, &tables[0], &tables[1]);
        let attrs = vec![int("num_heads", 2), int("kv_num_heads", 1)];
        let mut inputs: Vec<&str> = vec![&pq, &pk, &v];
        inputs.extend(rest.iter().map(String::as_str));
        let out = ms(&mut g, "GroupQueryAttention", &inputs, 3, attrs);
        g.outputs.extend(out);
        (g, inv_freq)
    }

    #[test]
    fn the_rotary_moves_into_the_kernel_with_tables_of_every_position() {
        let (mut g, inv_freq) = graph();
        assert_eq!(fold_rotary(&mut g), 1);
        let n = g
            .nodes
            .iter()
            .find(|n| n.op_type == "GroupQueryAttention")
            .expect("kernel");
        assert_eq!(
            n.inputs[..3],
            ["q".to_owned(), "k".to_owned(), "v".to_owned()]
        );
        assert_eq!(n.inputs[9], "position_ids");
        assert!(matches!(n.attr("do_rotary"), Some(AttrValue::Int(1))));
        assert!(!g
            .nodes
            .iter()
            .any(|n| n.op_type == "RotaryEmbedding" || n.op_type == "Transpose"));
        let cos = g.initializer(&n.inputs[7]).expect("cos table");
        assert_eq!(cos.dims, [6, HALF as i64]);
        let values = crate::tensor::le_f32s(cos.data.as_slice().expect("bytes"));
        for p in 0..6 {
            for (j, f) in inv_freq.iter().enumerate() {
                assert_eq!(
                    values[p * HALF + j],
                    ((p as f32) * f).cos() * 0.5,
                    "{p} {j}"
                );
            }
        }
    }

    #[test]
    fn no_positions_no_fold_and_other_angles_stay() {
        let (mut g, _) = graph();
        g.shared_cache_positions = None;
        assert_eq!(fold_rotary(&mut g), 0);
        // a context whose tables would pass MAX_TABLE_BYTES keeps the rotary nodes
        let (mut g, _) = graph();
        g.shared_cache_positions = Some(10 << 20);
        assert_eq!(fold_rotary(&mut g), 0);
        // angles that are not position_ids · constant (frequencies computed at run time) stay
        let (mut g, _) = graph();
        let freq = g.add_input("freq", dtype::FLOAT, fixed(&[HALF as i64]));
        let m = g
            .nodes
            .iter_mut()
            .find(|n| n.op_type == "Mul")
            .expect("angles");
        m.inputs[1] = freq;
        assert_eq!(fold_rotary(&mut g), 0);
    }

    #[test]
    fn a_split_read_by_the_kernel_alone_becomes_its_packed_input() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 3, 64]));
        let qkv = g.split_last(&x, &[32, 16, 16], &["q", "k", "v"]);
        let rest = ["pk", "pv", "seqlens", "total"].map(|n| g.add_input(n, dtype::FLOAT, None));
        let mut inputs: Vec<&str> = qkv.iter().map(String::as_str).collect();
        inputs.extend(rest.iter().map(String::as_str));
        let out = ms(&mut g, "GroupQueryAttention", &inputs, 3, vec![]);
        g.outputs.extend(out);
        assert_eq!(pack_qkv(&mut g), 1);
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(
            g.nodes[0].inputs[..4],
            [
                "x".to_owned(),
                String::new(),
                String::new(),
                "pk".to_owned()
            ]
        );
    }

    /// GroupQueryAttention over `Slice(x)`s of x's last axis, each `[start, end)`.
    fn sliced(bounds: &[(i64, i64)]) -> Graph {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 3, 64]));
        let axes = g.i64s(&[1], &[-1]);
        let mut inputs = Vec::new();
        for &(start, end) in bounds {
            let s = g.i64s(&[1], &[start]);
            let e = g.i64s(&[1], &[end]);
            inputs.push(g.op("Slice", &[&x, &s, &e, &axes]));
        }
        inputs.extend(["pk", "pv", "seqlens", "total"].map(|n| g.add_input(n, dtype::FLOAT, None)));
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let out = ms(&mut g, "GroupQueryAttention", &inputs, 3, vec![]);
        g.outputs.extend(out);
        g
    }

    #[test]
    fn slices_covering_one_product_in_order_become_its_packed_input() {
        let mut g = sliced(&[(0, 32), (32, 48), (48, i64::MAX)]);
        assert_eq!(pack_qkv(&mut g), 1);
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(
            g.nodes[0].inputs[..3],
            ["x".to_owned(), String::new(), String::new()]
        );
        // a gap, or slices out of order, are no packed product
        for bounds in [[(0, 32), (36, 48), (48, 64)], [(32, 48), (0, 32), (48, 64)]] {
            let mut g = sliced(&bounds);
            assert_eq!(pack_qkv(&mut g), 0);
        }
    }
}
