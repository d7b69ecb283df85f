//! At the onnxruntime level below opset 23: grouped-query attention over a KV cache (the chain of
//! [`super::chain`] reading keys and values repeated per group, each the cache append
//! `Concat(past, new, axis = 2)`) becomes `com.microsoft.GroupQueryAttention`, which appends to the
//! cache and attends to the unrepeated heads in one kernel:
//!
//! ```text
//! present_k = Concat(past_k, k, 2)   present_v = Concat(past_v, v, 2)      (k, v: b, h, s, e)
//! o = <chain>(q, repeat(present_k), repeat(present_v), mask)              (q: b, G·h, s, e)
//! ```
//!
//! becomes, at the later of the two Concats,
//!
//! ```text
//! o3, present_k, present_v = GroupQueryAttention(q3, k3, v3, past_k, past_v, seqlens_k, total,
//!                                                attention_bias = bias)   with x3 = (b, s, heads·e)
//! o = Transpose(Reshape(o3, [0, 0, G·h, e]), [0, 2, 1, 3])
//! ```
//!
//! `total` = past + s and `seqlens_k` = total - 1 for every row: the kernel's own causal rule then is
//! torch's bottom-right one for every row, and padding comes from the mask, given as the additive
//! bias (`Where(mask, 0, -inf)` for a boolean one). Rows the mask closes entirely are zeroed after
//! the kernel, as the chain did. Everything the fused node reads must come before the later Concat
//! and nothing may read the caches before it (the node takes their place).

use super::chain::{match_chain, Chain};
use super::grouped::{f32_constant, i64_constant, node};
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node, ValueType};
use crate::passes::matching::{fixed, float_attr, int_attr, is_float, is_op, shape, Index};
use crate::passes::rewrite::{fuse, Rewrite};
use crate::passes::MS_DOMAIN;

struct Append {
    at: usize,
    past: String,
    new: String,
}

struct Match {
    chain: Chain,
    k: Append,
    v: Append,
    /// the nodes computing the closed-rows flag from the mask, in order (the converter computes it
    /// after the Softmax: the fused node's helpers recompute it from the mask, before the node)
    flag_nodes: Vec<usize>,
}

/// Fuses grouped-query attention over a KV cache; returns how many it fused.
pub(crate) fn fuse_group_query(g: &mut Graph) -> usize {
    fuse(g, &["Softmax"], find, |g, m| emit(g, &m))
}

/// `Concat(past, new, axis = 2)` producing `value`, both 4-D float32.
fn cache_append(g: &Graph, ix: &Index, value: &str) -> Option<Append> {
    let at = *ix.prod.get(value)?;
    let n = &g.nodes[at];
    let [past, new] = n.inputs.as_slice() else {
        return None;
    };
    let axis = matches!(n.attr("axis"), Some(AttrValue::Int(2 | -2)));
    let rank4 = |v: &str| is_float(g, v) && shape(g, v).is_some_and(|s| s.len() == 4);
    (is_op(n, "Concat") && axis && rank4(past) && rank4(new)).then(|| Append {
        at,
        past: past.clone(),
        new: new.clone(),
    })
}

/// Where `value` is computed (None for graph inputs and constants: always available).
fn position(ix: &Index, value: &str) -> Option<usize> {
    ix.prod.get(value).copied()
}

fn find(g: &Graph, ix: &Index, softmax_at: usize) -> Option<Match> {
    let chain = match_chain(g, ix, softmax_at)?;
    if chain.k == chain.k_read || chain.v == chain.v_read {
        return None;
    }
    let k = cache_append(g, ix, &chain.k)?;
    let v = cache_append(g, ix, &chain.v)?;
    let (q, kn, vn) = (shape(g, &chain.q)?, shape(g, &k.new)?, shape(g, &v.new)?);
    let total = shape(g, &chain.k)?;
    let same_rows = |s: &[Dim]| s[0] == q[0] && s[2] == q[2];
    let head = fixed(&q[3])?;
    if !same_rows(&kn)
        || !same_rows(&vn)
        || kn[1] != vn[1]
        || fixed(&kn[3])? != head
        || fixed(&vn[3])? != head
    {
        return None;
    }
    if let Some(m) = &chain.mask {
        // the kernel's bias is (b | 1, heads | 1, s, total): no broadcasting over rows or keys
        let m = shape(g, m)?;
        if m.len() != 4 || m[2] != q[2] || m[3] != total[2] || m[1] != Dim::Fixed(1) {
            return None;
        }
    }
    let mut flag_nodes = Vec::new();
    if let Some(flag) = &chain.closed_rows {
        let s = shape(g, flag)?;
        if s.len() != 4 || s[1] != Dim::Fixed(1) || s[3] != Dim::Fixed(1) {
            return None;
        }
        // Equal(ReduceMax([Cast(] mask [)]), limit): the chain checked it is the mask's flag
        let eq = *ix.prod.get(flag)?;
        let max = *ix.prod.get(g.nodes[eq].inputs.first()?)?;
        let source = g.nodes[max].inputs.first()?;
        if let Some(&cast) = ix.prod.get(source).filter(|&&i| is_op(&g.nodes[i], "Cast")) {
            flag_nodes.push(cast);
        }
        flag_nodes.extend([max, eq]);
    }
    // the node takes the later Concat's place: what it reads must come before, and nothing may
    // read the caches before it
    let at = k.at.max(v.at);
    let reads: Vec<&String> = [&chain.q, &k.new, &v.new, &k.past, &v.past]
        .into_iter()
        .chain(chain.mask.iter())
        .chain(
            flag_nodes
                .iter()
                .flat_map(|&i| g.nodes[i].inputs.iter().skip(1)),
        )
        .collect();
    if reads
        .iter()
        .any(|r| position(ix, r).is_some_and(|p| p >= at))
    {
        return None;
    }
    let early = g.nodes[..at]
        .iter()
        .any(|n| n.inputs.iter().any(|i| *i == chain.k || *i == chain.v));
    (!early).then_some(Match {
        chain,
        k,
        v,
        flag_nodes,
    })
}

fn typed(g: &mut Graph, hint: &str, dtype: i32, dims: Vec<Dim>) -> String {
    g.new_value(
        hint,
        ValueType {
            dtype: Some(dtype),
            shape: Some(dims),
        },
    )
}

fn emit(g: &mut Graph, m: &Match) -> Option<Rewrite> {
    let c = &m.chain;
    let q = shape(g, &c.q)?;
    let heads = fixed(&q[1])?;
    let kv_heads = fixed(&shape(g, &m.k.new)?[1])?;
    let head = fixed(&q[3])?;
    let (b, s) = (q[0].clone(), q[2].clone());
    let mut before: Vec<Node> = Vec::new();
    let swap = || vec![crate::passes::attention::perm(&[0, 2, 1, 3])];
    // (b, n, s, e) -> (b, s, n·e)
    let flat = |g: &mut Graph, x: &str, n: i64, before: &mut Vec<Node>| -> Option<String> {
        let t_dims = vec![b.clone(), s.clone(), Dim::Fixed(n), Dim::Fixed(head)];
        let t = typed(g, "heads_last", dtype::FLOAT, t_dims);
        before.push(node(g, "Transpose", vec![x.to_owned()], &t, swap()));
        let target = i64_constant(g, &[0, 0, n * head])?;
        let dims = vec![b.clone(), s.clone(), Dim::Fixed(n * head)];
        let out = typed(g, "packed", dtype::FLOAT, dims);
        before.push(node(g, "Reshape", vec![t, target], &out, vec![]));
        Some(out)
    };
    let q3 = flat(g, &c.q, heads, &mut before)?;
    let k3 = flat(g, &m.k.new, kv_heads, &mut before)?;
    let v3 = flat(g, &m.v.new, kv_heads, &mut before)?;
    // total = past + s (int32 scalar), seqlens_k = total - 1 per row (int32, b)
    let one_i64 = || ValueType {
        dtype: Some(dtype::INT64),
        shape: Some(vec![Dim::Fixed(1)]),
    };
    let dim_of = |g: &mut Graph, x: &str, axis: i64, before: &mut Vec<Node>| {
        let out = g.new_value("dim", one_i64());
        let attrs = vec![int_attr("start", axis), int_attr("end", axis + 1)];
        before.push(node(g, "Shape", vec![x.to_owned()], &out, attrs));
        out
    };
    let past_len = dim_of(g, &m.k.past, 2, &mut before);
    let new_len = dim_of(g, &c.q, 2, &mut before);
    let batch = dim_of(g, &c.q, 0, &mut before);
    let total = g.new_value("total", one_i64());
    before.push(node(g, "Add", vec![past_len, new_len], &total, vec![]));
    let one = i64_constant(g, &[1])?;
    let last = g.new_value("last", one_i64());
    before.push(node(g, "Sub", vec![total.clone(), one], &last, vec![]));
    let rows = typed(g, "last_rows", dtype::INT64, vec![b.clone()]);
    before.push(node(g, "Expand", vec![last, batch], &rows, vec![]));
    let seqlens = typed(g, "seqlens_k", dtype::INT32, vec![b.clone()]);
    let to32 = || vec![int_attr("to", i64::from(dtype::INT32))];
    before.push(node(g, "Cast", vec![rows], &seqlens, to32()));
    let total32 = typed(g, "total32", dtype::INT32, vec![Dim::Fixed(1)]);
    before.push(node(g, "Cast", vec![total], &total32, to32()));
    let axes = i64_constant(g, &[0])?;
    let total_scalar = typed(g, "total_sequence_length", dtype::INT32, vec![]);
    before.push(node(
        g,
        "Squeeze",
        vec![total32, axes],
        &total_scalar,
        vec![],
    ));
    let bias = match &c.mask {
        Some(mask) if g.value_type(mask)?.dtype == Some(dtype::BOOL) => {
            let zero = f32_constant(g, "zero", 0.0)?;
            let neg_inf = f32_constant(g, "neg_inf", f32::NEG_INFINITY)?;
            let bias = typed(g, "attention_bias", dtype::FLOAT, shape(g, mask)?);
            before.push(node(
                g,
                "Where",
                vec![mask.clone(), zero, neg_inf],
                &bias,
                vec![],
            ));
            bias
        }
        Some(mask) => mask.clone(),
        None => String::new(),
    };
    let packed = vec![b.clone(), s.clone(), Dim::Fixed(heads * head)];
    let out3 = typed(g, "group_query_attention", dtype::FLOAT, packed.clone());
    let mut inputs = vec![q3, k3, v3, m.k.past.clone(), m.v.past.clone()];
    inputs.extend([seqlens, total_scalar]);
    if !bias.is_empty() {
        inputs.extend([String::new(), String::new(), String::new(), bias]);
    }
    let attrs = vec![
        int_attr("num_heads", heads),
        int_attr("kv_num_heads", kv_heads),
        float_attr("scale", c.scale),
    ];
    // after: zero closed rows, back to (b, heads, s, e) under the chain's output name
    let mut after = Vec::new();
    let mut y3 = out3.clone();
    if c.closed_rows.is_some() {
        let flag = recompute(g, &m.flag_nodes, &mut before)?;
        let axes = i64_constant(g, &[1])?;
        let zero = f32_constant(g, "zero", 0.0)?;
        let rows = typed(
            g,
            "closed_rows",
            dtype::BOOL,
            vec![b.clone(), s.clone(), Dim::Fixed(1)],
        );
        after.push(node(g, "Squeeze", vec![flag, axes], &rows, vec![]));
        let zeroed = typed(g, "attention", dtype::FLOAT, packed);
        after.push(node(g, "Where", vec![rows, zero, y3], &zeroed, vec![]));
        y3 = zeroed;
    }
    let split = i64_constant(g, &[0, 0, heads, head])?;
    let y4_dims = vec![b.clone(), s.clone(), Dim::Fixed(heads), Dim::Fixed(head)];
    let y4 = typed(g, "heads_last", dtype::FLOAT, y4_dims);
    after.push(node(g, "Reshape", vec![y3, split], &y4, vec![]));
    let out = g.nodes[c.last].outputs.first()?.clone();
    after.push(node(g, "Transpose", vec![y4], &out, swap()));
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

/// Copies of `nodes` (a chain, each reading the previous one's output first) with fresh outputs, added
/// to `before`; returns the last one's output.
fn recompute(g: &mut Graph, nodes: &[usize], before: &mut Vec<Node>) -> Option<String> {
    let mut previous: Option<(String, String)> = None;
    for &i in nodes {
        let mut n = g.nodes[i].clone();
        let old = n.outputs.first()?.clone();
        let ty = g.value_type(&old).cloned().unwrap_or_default();
        let new = g.new_value(&n.op_type.to_lowercase(), ty);
        if let Some((from, to)) = &previous {
            for input in &mut n.inputs {
                if input == from {
                    input.clone_from(to);
                }
            }
        }
        n.name = g.names.unique_node(&n.op_type);
        n.outputs = vec![new.clone()];
        before.push(n);
        previous = Some((old, new));
    }
    previous.map(|(_, new)| new)
}
