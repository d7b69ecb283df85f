//! At the onnxruntime level, in a decoder whose KV caches the runtime may pass as buffers of the
//! maximum length shared with the present outputs (`Graph::shared_cache_mask` names its
//! attention-mask input; onnxruntime-genai's `past_present_share_buffer`): attention over a cache
//! append becomes `com.microsoft.GroupQueryAttention`, which writes the new keys and values into the
//! buffer in place and attends over the lengths the mask gives.
//!
//! ```text
//! present_k = Concat(past_k, k, 2)   present_v = Concat(past_v, v, 2)     (k, v: b, h, s, e)
//! o = <chain>(q, [repeat](present_k), [repeat](present_v), mask)         (q: b, G·h, s, e)
//! ```
//!
//! becomes, at the later of the two Concats,
//!
//! ```text
//! o3, present_k, present_v = GroupQueryAttention(q3, k3, v3, past_k, past_v, seqlens_k, total)
//!     with x3 = Reshape(Transpose(x, [0, 2, 1, 3]), [0, 0, heads·e])
//!     seqlens_k = Cast<int32>(ReduceSum(attention_mask, 1) - 1), total = Cast<int32>(mask's length)
//! o = Transpose(Reshape(o3, [0, 0, G·h, e]), [0, 2, 1, 3])
//! ```
//!
//! The copy of the whole cache a Concat makes at every decode step goes: with shared buffers the
//! step writes one position a layer. The chain's own mask is dropped: the kernel applies the causal
//! rule and the right-padded lengths of `seqlens_k` itself, as the onnxruntime-genai model builder's
//! packages do. So the package layer sets the mask only for models whose attention is exactly that
//! (causal, over the whole past or a sliding window `Graph::shared_cache_windows` names, no
//! soft-capping; sinks, GPT-OSS's, as `head_sink` ([`super::sink_chain`]); see
//! `pretrained/shared_cache.py`) and
//! checks afterwards that every cache input is read by the fused nodes alone.
//!
//! onnxruntime 1.31's CPU kernel takes float32 heads whose size is a multiple of 16; other chains stay.

use super::chain::{match_chain, Chain};
use super::sink_chain::match_sink_chain;
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node, ValueType};
use crate::passes::matching::{fixed, float_attr, int_attr, is_float, is_op, shape, Index};
use crate::passes::rewrite::{fuse, i64_constant, new_node, Rewrite};
use crate::passes::MS_DOMAIN;

/// The head sizes onnxruntime's CPU kernel runs: multiples of this.
const HEAD_MULTIPLE: i64 = 16;

struct Append {
    at: usize,
    past: String,
    new: String,
}

struct Match {
    chain: Chain,
    k: Append,
    v: Append,
    /// the per-head sinks' initializer (GPT-OSS's attention), the kernel's `head_sink`
    sinks: Option<String>,
}

/// Fuses attention over shared caches; returns how many chains it fused (0 unless the graph names
/// its shared-cache mask, an int64 or int32 graph input).
pub(crate) fn fuse_shared_cache(g: &mut Graph) -> usize {
    let Some(mask) = g.shared_cache_mask.clone() else {
        return 0;
    };
    let mask_type = g.value_type(&mask).and_then(|t| t.dtype);
    if !g.inputs.contains(&mask) || !matches!(mask_type, Some(dtype::INT64 | dtype::INT32)) {
        return 0;
    }
    fuse(g, &["Softmax"], find, |g, m| emit(g, &m, &mask))
}

/// `Concat(past, new, axis = 2)` producing `value`, `past` a 4-D float32 graph input.
fn cache_append(g: &Graph, ix: &Index, value: &str) -> Option<Append> {
    let at = *ix.prod.get(value)?;
    let n = &g.nodes[at];
    let [past, new] = n.inputs.as_slice() else {
        return None;
    };
    let axis = matches!(n.attr("axis"), Some(AttrValue::Int(2 | -2)));
    let rank4 = |v: &str| is_float(g, v) && shape(g, v).is_some_and(|s| s.len() == 4);
    let input = g.inputs.iter().any(|i| i == past);
    (is_op(n, "Concat") && axis && input && rank4(past) && rank4(new)).then(|| Append {
        at,
        past: past.clone(),
        new: new.clone(),
    })
}

fn find(g: &Graph, ix: &Index, softmax_at: usize) -> Option<Match> {
    let (chain, sinks) = match_chain(g, ix, softmax_at)
        .map(|chain| (chain, None))
        .or_else(|| match_sink_chain(g, ix, softmax_at).map(|(c, sinks)| (c, Some(sinks))))?;
    let k = cache_append(g, ix, &chain.k)?;
    let v = cache_append(g, ix, &chain.v)?;
    let (q, kn, vn) = (shape(g, &chain.q)?, shape(g, &k.new)?, shape(g, &v.new)?);
    let same_rows = |s: &[Dim]| s[0] == q[0] && s[2] == q[2];
    let head = fixed(&q[3])?;
    let (heads, kv_heads) = (fixed(&q[1])?, fixed(&kn[1])?);
    if !same_rows(&kn)
        || !same_rows(&vn)
        || kn[1] != vn[1]
        || fixed(&kn[3])? != head
        || fixed(&vn[3])? != head
        || head % HEAD_MULTIPLE != 0
        || kv_heads == 0
        || heads % kv_heads != 0
    {
        return None;
    }
    // the node takes the later Concat's place: what it reads must be computed before it, and
    // nothing before it may read the cache the earlier Concat made
    let at = k.at.max(v.at);
    let computed_after = |value: &str| ix.prod.get(value).is_some_and(|&p| p >= at);
    if [&chain.q, &k.new, &v.new]
        .into_iter()
        .any(|r| computed_after(r))
    {
        return None;
    }
    let early = g.nodes[..at]
        .iter()
        .any(|n| n.inputs.iter().any(|i| *i == chain.k || *i == chain.v));
    (!early).then_some(Match { chain, k, v, sinks })
}

fn typed(g: &mut Graph, hint: &str, dtype: i32, dims: Vec<Dim>) -> String {
    g.new_value(
        hint,
        ValueType {
            dtype: Some(dtype),
            shape: Some(dims),
            sequence: false,
        },
    )
}

fn node(g: &Graph, op: &str, inputs: Vec<String>, output: &str, attrs: Vec<Attribute>) -> Node {
    new_node(g, op, "", inputs, output, attrs)
}

fn perm() -> Vec<Attribute> {
    vec![Attribute {
        name: "perm".into(),
        value: AttrValue::Ints(vec![0, 2, 1, 3]),
    }]
}

/// `(b, n, s, e) -> (b, s, n·e)`, the kernel's packed heads.
fn packed(
    g: &mut Graph,
    x: &str,
    (b, s, n, head): (&Dim, &Dim, i64, i64),
    before: &mut Vec<Node>,
) -> Option<String> {
    let dims = vec![b.clone(), s.clone(), Dim::Fixed(n), Dim::Fixed(head)];
    let t = typed(g, "heads_last", dtype::FLOAT, dims);
    before.push(node(g, "Transpose", vec![x.to_owned()], &t, perm()));
    let target = i64_constant(g, "shape", vec![3], &[0, 0, n * head])?;
    let out = typed(
        g,
        "packed",
        dtype::FLOAT,
        vec![b.clone(), s.clone(), Dim::Fixed(n * head)],
    );
    before.push(node(g, "Reshape", vec![t, target], &out, vec![]));
    Some(out)
}

/// `seqlens_k` (b, int32: the index of each row's last position) and `total_sequence_length` (an
/// int32 scalar: the mask's length), from the mask as the kernel's contract defines them.
fn lengths(g: &mut Graph, mask: &str, b: &Dim, before: &mut Vec<Node>) -> Option<(String, String)> {
    let int64 = |dims: Vec<Dim>| ValueType {
        dtype: Some(dtype::INT64),
        shape: Some(dims),
        sequence: false,
    };
    let mut wide = mask.to_owned();
    if g.value_type(mask).and_then(|t| t.dtype) != Some(dtype::INT64) {
        let mask_dims = shape(g, mask)?;
        wide = g.new_value("mask_int64", int64(mask_dims));
        let to = vec![int_attr("to", i64::from(dtype::INT64))];
        before.push(node(g, "Cast", vec![mask.to_owned()], &wide, to));
    }
    let axes = i64_constant(g, "axes", vec![1], &[1])?;
    let sums = g.new_value("mask_sums", int64(vec![b.clone()]));
    let keep = vec![int_attr("keepdims", 0)];
    before.push(node(g, "ReduceSum", vec![wide, axes], &sums, keep));
    let one = i64_constant(g, "one", vec![], &[1])?;
    let last = g.new_value("last_positions", int64(vec![b.clone()]));
    before.push(node(g, "Sub", vec![sums, one], &last, vec![]));
    let to32 = || vec![int_attr("to", i64::from(dtype::INT32))];
    let seqlens = typed(g, "seqlens_k", dtype::INT32, vec![b.clone()]);
    before.push(node(g, "Cast", vec![last], &seqlens, to32()));
    let length = g.new_value("mask_length", int64(vec![Dim::Fixed(1)]));
    let span = vec![int_attr("start", 1), int_attr("end", 2)];
    before.push(node(g, "Shape", vec![mask.to_owned()], &length, span));
    let length32 = typed(g, "mask_length32", dtype::INT32, vec![Dim::Fixed(1)]);
    before.push(node(g, "Cast", vec![length], &length32, to32()));
    let total = typed(g, "total_sequence_length", dtype::INT32, vec![]);
    let axis0 = i64_constant(g, "axes", vec![1], &[0])?;
    before.push(node(g, "Squeeze", vec![length32, axis0], &total, vec![]));
    Some((seqlens, total))
}

fn emit(g: &mut Graph, m: &Match, mask: &str) -> Option<Rewrite> {
    let c = &m.chain;
    let q = shape(g, &c.q)?;
    let heads = fixed(&q[1])?;
    let kv_heads = fixed(&shape(g, &m.k.new)?[1])?;
    let head = fixed(&q[3])?;
    let (b, s) = (q[0].clone(), q[2].clone());
    let mut before: Vec<Node> = Vec::new();
    let q3 = packed(g, &c.q, (&b, &s, heads, head), &mut before)?;
    let k3 = packed(g, &m.k.new, (&b, &s, kv_heads, head), &mut before)?;
    let v3 = packed(g, &m.v.new, (&b, &s, kv_heads, head), &mut before)?;
    let (seqlens, total) = lengths(g, mask, &b, &mut before)?;
    let dims3 = vec![b.clone(), s.clone(), Dim::Fixed(heads * head)];
    let out3 = typed(g, "group_query_attention", dtype::FLOAT, dims3);
    let mut inputs = vec![
        q3,
        k3,
        v3,
        m.k.past.clone(),
        m.v.past.clone(),
        seqlens,
        total,
    ];
    if let Some(sinks) = &m.sinks {
        // no cos_cache, sin_cache, position_ids or attention_bias (gqa_rotary may give the first three)
        inputs.extend(["", "", "", ""].map(String::from));
        inputs.push(sinks.clone());
    }
    let mut attrs = vec![
        int_attr("num_heads", heads),
        int_attr("kv_num_heads", kv_heads),
        float_attr("scale", c.scale),
    ];
    // onnxruntime's window counts the positions a query attends to, its own included, as
    // transformers' sliding_window does (measured: 4 matches a window mask of 4 over a past of 9)
    if let Some(&window) = g.shared_cache_windows.get(&m.k.past) {
        attrs.push(int_attr("local_window_size", window));
    }
    // back to (b, heads, s, e) under the chain's output name
    let mut after = Vec::new();
    let split = i64_constant(g, "shape", vec![4], &[0, 0, heads, head])?;
    let dims4 = vec![b.clone(), s.clone(), Dim::Fixed(heads), Dim::Fixed(head)];
    let y4 = typed(g, "heads_last", dtype::FLOAT, dims4);
    after.push(node(g, "Reshape", vec![out3.clone(), split], &y4, vec![]));
    let out = g.nodes[c.last].outputs.first()?.clone();
    after.push(node(g, "Transpose", vec![y4], &out, perm()));
    let at = m.k.at.max(m.v.at);
    let other = m.k.at.min(m.v.at);
    let outputs = vec![out3, c.k.clone(), c.v.clone()];
    let dead = c.dead.iter().copied().chain([c.last, other]);
    let rewrite = Rewrite::replace(at, "GroupQueryAttention", MS_DOMAIN, inputs, attrs)
        .writing(outputs)
        .removing(dead)
        .inserting_before(before)
        .inserting_after(after);
    Some(rewrite)
}
