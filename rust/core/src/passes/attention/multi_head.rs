//! At the onnxruntime level below opset 23: attention whose heads are split from 3-D projections and
//! merged back, as BERT / ViT / Whisper-style encoders write it, becomes onnxruntime's
//! `com.microsoft.MultiHeadAttention`:
//!
//! ```text
//! q = Transpose(Reshape(q3, (b, s, n, h)), [0, 2, 1, 3])      (k and v alike, same n)
//! o = <the attention chain of chain.rs>(q, k, v, mask)
//! y = Reshape(Transpose(o, [0, 2, 1, 3]), (b, s, n * hv))
//! ```
//!
//! becomes `y = MultiHeadAttention(q3, k3, v3, attention_bias = bias)` with `num_heads = n`. A boolean
//! mask becomes the additive bias `Where(mask, 0, -inf)` (shared by the layers once CSE has run).
//! onnxruntime's kernel gives NaN rows where the mask closes every key, torch gives zeros: when the
//! chain zeroed such rows, `Where(Squeeze(closed_rows, [1]), 0, y)` still does.
//! Rotated queries and keys (Llama) are 4-D before attention and grouped keys have fewer heads:
//! neither is fused (transposing back would cost what the fusion saves).

use super::chain::{match_chain, Chain};
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node, ValueType};
use crate::passes::matching::{is_float, is_op, shape, sole_producer_op, sole_reader, Index};
use crate::passes::rewrite::{f32_constant, fuse, new_node, Rewrite};
use crate::passes::MS_DOMAIN;

struct Heads {
    q3: String,
    k3: String,
    v3: String,
    count: i64,
    /// the final Reshape, rewritten in place, and the Transpose before it
    merge_at: usize,
    transpose_at: usize,
    /// Identity nodes between the attention and the merge (the converter's no-op casts)
    identities: Vec<usize>,
}

/// Fuses every attention chain whose heads are split from 3-D projections; returns how many it fused.
pub(crate) fn fuse_multi_head(g: &mut Graph) -> usize {
    let find = |g: &Graph, ix: &Index, i: usize| {
        let chain = match_chain(g, ix, i)?;
        let heads = match_heads(g, ix, &chain)?;
        Some((chain, heads))
    };
    fuse(g, &["Softmax"], find, |g, (chain, heads)| {
        emit(g, &chain, &heads)
    })
}

/// The fused node and its helpers; None when a constant cannot be made.
fn emit(g: &mut Graph, f: &Chain, h: &Heads) -> Option<Rewrite> {
    let zero = f32_constant(g, "zero", 0.0)?;
    let mut before = Vec::new();
    let bias = match &f.mask {
        Some(m) if g.value_type(m)?.dtype == Some(dtype::BOOL) => {
            let neg_inf = f32_constant(g, "neg_inf", f32::NEG_INFINITY)?;
            let bias = g.new_value(
                "attention_bias",
                ValueType {
                    dtype: Some(dtype::FLOAT),
                    shape: shape(g, m),
                    sequence: false,
                },
            );
            before.push(new_node(
                g,
                "Where",
                "",
                vec![m.clone(), zero.clone(), neg_inf],
                &bias,
                vec![],
            ));
            bias
        }
        Some(m) => m.clone(),
        None => String::new(),
    };
    let y = g.nodes[h.merge_at].outputs[0].clone();
    let y_type = g.value_type(&y).cloned().unwrap_or_default();
    let mut after = Vec::new();
    let attention_out = match &f.closed_rows {
        Some(flag) => {
            let axes = g
                .add_constant("axes", dtype::INT64, vec![1], 1i64.to_le_bytes().to_vec())
                .ok()?;
            let flag_shape = shape(g, flag)?;
            let rows = g.new_value(
                "closed_rows",
                ValueType {
                    dtype: Some(dtype::BOOL),
                    shape: Some(vec![
                        flag_shape[0].clone(),
                        flag_shape[2].clone(),
                        Dim::Fixed(1),
                    ]),
                    sequence: false,
                },
            );
            let fused = g.new_value(
                "attention",
                ValueType {
                    dtype: Some(dtype::FLOAT),
                    shape: y_type.shape.clone(),
                    sequence: false,
                },
            );
            after.push(new_node(
                g,
                "Squeeze",
                "",
                vec![flag.clone(), axes],
                &rows,
                vec![],
            ));
            after.push(new_node(
                g,
                "Where",
                "",
                vec![rows, zero, fused.clone()],
                &y,
                vec![],
            ));
            fused
        }
        None => y,
    };
    let mut inputs = vec![h.q3.clone(), h.k3.clone(), h.v3.clone()];
    if !bias.is_empty() {
        inputs.extend([String::new(), String::new(), bias]);
    }
    let attrs = vec![
        Attribute {
            name: "num_heads".into(),
            value: AttrValue::Int(h.count),
        },
        Attribute {
            name: "scale".into(),
            value: AttrValue::Float(f.scale),
        },
    ];
    let dead = f.dead.iter().copied().chain([f.last, h.transpose_at]);
    let rewrite = Rewrite::replace(h.merge_at, "MultiHeadAttention", MS_DOMAIN, inputs, attrs)
        .writing(vec![attention_out])
        .removing(dead.chain(h.identities.iter().copied()))
        .inserting_before(before)
        .inserting_after(after);
    Some(rewrite)
}

/// (x3, heads) for `Transpose(Reshape(x3, (b, s, n, h)), [0, 2, 1, 3])`, each read once, checked on the
/// recorded shapes.
fn split_source(g: &Graph, ix: &Index, x4: &str) -> Option<(String, i64)> {
    let (_, t) = sole_producer_op(g, ix, x4, "Transpose")?;
    if !is_swap12(t) {
        return None;
    }
    let split = t.inputs.first()?;
    let (_, r) = sole_producer_op(g, ix, split, "Reshape")?;
    let x3 = r.inputs.first()?;
    let (s3, s4) = (shape(g, x3)?, shape(g, split)?);
    let (Dim::Fixed(heads), Dim::Fixed(size), Dim::Fixed(hidden)) = (&s4[2], &s4[3], s3.get(2)?)
    else {
        return None;
    };
    let ok = is_float(g, x3)
        && s3.len() == 3
        && s4.len() == 4
        && s3[..2] == s4[..2]
        && heads * size == *hidden;
    ok.then(|| (x3.clone(), *heads))
}

fn is_swap12(t: &Node) -> bool {
    matches!(t.attr("perm"), Some(AttrValue::Ints(p)) if p == &[0, 2, 1, 3])
}

fn match_heads(g: &Graph, ix: &Index, f: &Chain) -> Option<Heads> {
    if f.k != f.k_read || f.v != f.v_read {
        return None; // grouped keys and values
    }
    let (q3, heads) = split_source(g, ix, &f.q)?;
    let (k3, k_heads) = split_source(g, ix, &f.k)?;
    let (v3, v_heads) = split_source(g, ix, &f.v)?;
    if k_heads != heads || v_heads != heads || shape(g, &q3)?.get(2) != shape(g, &k3)?.get(2) {
        return None;
    }
    let (q_dims, k_dims) = (shape(g, &f.q)?, shape(g, &f.k)?);
    if let Some(m) = &f.mask {
        // onnxruntime broadcasts the bias over batch and heads only
        let m = shape(g, m)?;
        if m.len() != 4 || m[2] != q_dims[2] || m[3] != k_dims[2] {
            return None;
        }
    }
    if let Some(flag) = &f.closed_rows {
        let s = shape(g, flag)?;
        if s.len() != 4 || s[1] != Dim::Fixed(1) || s[3] != Dim::Fixed(1) {
            return None;
        }
    }
    let mut identities = Vec::new();
    let (mut transpose_at, mut t) = sole_reader(g, ix, &g.nodes[f.last].outputs[0])?;
    while is_op(t, "Identity") {
        identities.push(transpose_at);
        (transpose_at, t) = sole_reader(g, ix, &t.outputs[0])?;
    }
    if !is_op(t, "Transpose") || !is_swap12(t) {
        return None;
    }
    let (merge_at, r) = sole_reader(g, ix, &t.outputs[0])?;
    let v_size = shape(g, &f.v)?.get(3)?.clone();
    let y = shape(g, &r.outputs[0])?;
    let Dim::Fixed(v_size) = v_size else {
        return None;
    };
    let ok = is_op(r, "Reshape")
        && y.len() == 3
        && y[..2] == shape(g, &q3)?[..2]
        && y[2] == Dim::Fixed(heads * v_size);
    ok.then_some(Heads {
        q3,
        k3,
        v3,
        count: heads,
        merge_at,
        transpose_at,
        identities,
    })
}
