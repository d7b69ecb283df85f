//! Pattern rewrites, each visiting only the nodes of its op type (an index by op type, built once):
//! Reshape∘Reshape, Transpose∘Transpose (through same-shape Reshapes), Reshapes back to a shape
//! already held, lossless Cast∘Cast, Squeeze∘Unsqueeze on the same axes, and MatMul + Add → Gemm on
//! 2-D operands. Rewired producers left without readers are removed by the clean-up that runs after.

use super::matching::{producers, readers};
use super::rewrite::{apply, Rewrite};
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node};
use crate::tensor::le_i64s;
use std::collections::HashMap;

fn by_op(g: &Graph, op: &str) -> Vec<usize> {
    g.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op_type == op && n.domain.is_empty())
        .map(|(i, _)| i)
        .collect()
}

fn ints(n: &Node, name: &str) -> Option<Vec<i64>> {
    match n.attr(name) {
        Some(AttrValue::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

fn const_i64(g: &Graph, name: &str) -> Option<Vec<i64>> {
    let t = g.initializer(name)?;
    if t.dtype != dtype::INT64 {
        return None;
    }
    Some(le_i64s(t.data.as_slice()?))
}

/// Reshape(Reshape(x, a), b) → Reshape(x, b) when b copies no dim from its input (no 0 entries).
fn reshape_chains(g: &mut Graph) -> usize {
    let prod = producers(g);
    let mut count = 0;
    for i in by_op(g, "Reshape") {
        let Some(shape) = g.nodes[i].inputs.get(1).and_then(|s| const_i64(g, s)) else {
            continue;
        };
        if shape.contains(&0) {
            continue;
        }
        let Some(&j) = prod.get(&g.nodes[i].inputs[0]) else {
            continue;
        };
        if g.nodes[j].op_type != "Reshape" || !g.nodes[j].domain.is_empty() {
            continue;
        }
        let src = g.nodes[j].inputs[0].clone();
        g.nodes[i].inputs[0] = src;
        count += 1;
    }
    count
}

/// A value's shape as recorded when every dim is known (a size or a symbol: one symbol, one size).
fn known_shape<'a>(g: &'a Graph, v: &str) -> Option<&'a [Dim]> {
    let s = g.value_type(v)?.shape.as_deref()?;
    s.iter().all(|d| !matches!(d, Dim::Unknown)).then_some(s)
}

/// Whether node `n` is an Identity, or a Reshape whose output has its input's known shape: either
/// hands its input on unchanged.
fn passes_through(g: &Graph, n: &Node) -> bool {
    n.domain.is_empty()
        && (n.op_type == "Identity"
            || (n.op_type == "Reshape"
                && known_shape(g, &n.inputs[0]).is_some()
                && known_shape(g, &n.inputs[0]) == known_shape(g, &n.outputs[0])))
}

/// The producer of `v`, looking through nodes that hand their input on unchanged.
fn producer_through(g: &Graph, prod: &HashMap<String, usize>, v: &str) -> Option<usize> {
    let mut j = *prod.get(v)?;
    for _ in 0..8 {
        if !passes_through(g, &g.nodes[j]) {
            return Some(j);
        }
        j = *prod.get(&g.nodes[j].inputs[0])?;
    }
    None
}

/// Transpose(Transpose(x, p), q) → Transpose(x, p∘q), or Identity when that is the identity; Identities
/// and same-shape Reshapes between the two are looked through (GroupQueryAttention's output back to
/// heads-first, then the model's own transpose to heads-last: a round trip).
fn transpose_chains(g: &mut Graph) -> usize {
    let prod = producers(g);
    let mut count = 0;
    for i in by_op(g, "Transpose") {
        let Some(j) = producer_through(g, &prod, &g.nodes[i].inputs[0]) else {
            continue;
        };
        if g.nodes[j].op_type != "Transpose" || !g.nodes[j].domain.is_empty() {
            continue;
        }
        let (Some(p), Some(q)) = (ints(&g.nodes[j], "perm"), ints(&g.nodes[i], "perm")) else {
            continue;
        };
        if p.len() != q.len() {
            continue;
        }
        // out[k] = mid[q[k]] = x[p[q[k]]]
        let composed: Vec<i64> = q.iter().map(|&k| p[k as usize]).collect();
        let src = g.nodes[j].inputs[0].clone();
        let n = &mut g.nodes[i];
        n.inputs = vec![src];
        if composed.iter().enumerate().all(|(k, v)| *v == k as i64) {
            n.op_type = "Identity".to_owned();
            n.attrs.clear();
        } else {
            n.attrs = vec![Attribute {
                name: "perm".to_owned(),
                value: AttrValue::Ints(composed),
            }];
        }
        count += 1;
    }
    count
}

/// Reshape(…Reshape(x)…) whose output has x's known shape → Identity(x): a Reshape keeps the elements'
/// row-major order, so a chain of them (and Identities) back to a shape it started from changes nothing.
/// The attention's output split into heads and merged again after the round trip of Transposes above
/// is one.
fn reshape_round_trips(g: &mut Graph) -> usize {
    let prod = producers(g);
    let mut count = 0;
    for i in by_op(g, "Reshape") {
        let Some(want) = known_shape(g, &g.nodes[i].outputs[0]) else {
            continue;
        };
        let mut v = g.nodes[i].inputs[0].clone();
        let mut found = None;
        for _ in 0..8 {
            if known_shape(g, &v) == Some(want) {
                found = Some(v);
                break;
            }
            let Some(&j) = prod.get(&v) else { break };
            let n = &g.nodes[j];
            if !n.domain.is_empty() || !matches!(n.op_type.as_str(), "Reshape" | "Identity") {
                break;
            }
            v = n.inputs[0].clone();
        }
        if let Some(src) = found {
            let n = &mut g.nodes[i];
            n.op_type = "Identity".to_owned();
            n.inputs = vec![src];
            n.attrs.clear();
            count += 1;
        }
    }
    count
}

/// True when every value of `from` is exactly representable in `to`.
fn lossless(from: i32, to: i32) -> bool {
    use dtype::{
        BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT16, INT32, INT64, INT8, UINT16, UINT32, UINT64,
        UINT8,
    };
    if from == to {
        return true;
    }
    match from {
        BOOL => true,
        FLOAT16 | BFLOAT16 => matches!(to, FLOAT | DOUBLE),
        FLOAT => to == DOUBLE,
        INT8 => matches!(to, INT16 | INT32 | INT64 | FLOAT | DOUBLE | FLOAT16),
        UINT8 => matches!(
            to,
            INT16 | UINT16 | INT32 | UINT32 | INT64 | UINT64 | FLOAT | DOUBLE | FLOAT16
        ),
        INT16 => matches!(to, INT32 | INT64 | FLOAT | DOUBLE),
        INT32 => matches!(to, INT64 | DOUBLE),
        UINT16 => matches!(to, INT32 | UINT32 | INT64 | UINT64 | FLOAT | DOUBLE),
        UINT32 => matches!(to, INT64 | UINT64 | DOUBLE),
        _ => false,
    }
}

/// Cast(Cast(x, t1), t2) → Cast(x, t2) when x → t1 loses nothing (the middle value is x itself).
fn cast_chains(g: &mut Graph) -> usize {
    let prod = producers(g);
    let mut count = 0;
    for i in by_op(g, "Cast") {
        let Some(&j) = prod.get(&g.nodes[i].inputs[0]) else {
            continue;
        };
        if g.nodes[j].op_type != "Cast" || !g.nodes[j].domain.is_empty() {
            continue;
        }
        let src = g.nodes[j].inputs[0].clone();
        let Some(from) = g.value_type(&src).and_then(|t| t.dtype) else {
            continue;
        };
        let Some(AttrValue::Int(mid)) = g.nodes[j].attr("to") else {
            continue;
        };
        let Ok(mid) = i32::try_from(*mid) else {
            continue;
        };
        if !lossless(from, mid) {
            continue;
        }
        g.nodes[i].inputs[0] = src;
        count += 1;
    }
    count
}

/// Unsqueeze(Squeeze(x, a), a) → x and Squeeze(Unsqueeze(x, a), a) → x, for constant equal axes.
fn squeeze_pairs(g: &mut Graph) -> usize {
    let prod = producers(g);
    let mut count = 0;
    for (outer, inner) in [("Unsqueeze", "Squeeze"), ("Squeeze", "Unsqueeze")] {
        for i in by_op(g, outer) {
            let Some(&j) = prod.get(&g.nodes[i].inputs[0]) else {
                continue;
            };
            if g.nodes[j].op_type != inner || !g.nodes[j].domain.is_empty() {
                continue;
            }
            let axes = |n: &Node| n.inputs.get(1).and_then(|a| const_i64(g, a));
            let (Some(a), Some(b)) = (axes(&g.nodes[i]), axes(&g.nodes[j])) else {
                continue;
            };
            // negative axes mean different dims before and after; only equal non-negative lists match
            if a != b || a.iter().any(|v| *v < 0) {
                continue;
            }
            let src = g.nodes[j].inputs[0].clone();
            let n = &mut g.nodes[i];
            n.op_type = "Identity".to_owned();
            n.inputs = vec![src];
            count += 1;
        }
    }
    count
}

fn static_dims(g: &Graph, name: &str) -> Option<Vec<i64>> {
    g.value_type(name)?
        .shape
        .as_ref()?
        .iter()
        .map(|d| match d {
            crate::graph::Dim::Fixed(v) => Some(*v),
            _ => None,
        })
        .collect()
}

/// MatMul(A, B) + C → Gemm(A, B, C) when A and B are 2-D and the MatMul result has no other reader.
fn matmul_add_to_gemm(g: &mut Graph) -> usize {
    let prod = producers(g);
    let reads = readers(g);
    let rank = |g: &Graph, n: &str| g.value_type(n).and_then(|t| t.shape.as_ref()).map(Vec::len);
    let mut rewrites = Vec::new();
    for i in by_op(g, "Add") {
        let add = &g.nodes[i];
        for (m_side, c_side) in [(0, 1), (1, 0)] {
            let mm_out = &add.inputs[m_side];
            let Some(&j) = prod.get(mm_out) else { continue };
            let mm = &g.nodes[j];
            if mm.op_type != "MatMul" || !mm.domain.is_empty() || reads.get(mm_out) != Some(&1) {
                continue;
            }
            let (a, b, c) = (
                mm.inputs[0].clone(),
                mm.inputs[1].clone(),
                add.inputs[c_side].clone(),
            );
            if rank(g, &a) != Some(2) || rank(g, &b) != Some(2) || rank(g, &c).is_none_or(|r| r > 2)
            {
                continue;
            }
            // Gemm broadcasts C to A·B's shape only: the Add must not be larger than the product
            let (Some(sa), Some(sb), Some(so)) = (
                static_dims(g, &a),
                static_dims(g, &b),
                static_dims(g, &add.outputs[0]),
            ) else {
                continue;
            };
            if so != [sa[0], sb[1]] {
                continue;
            }
            let float = |n: &str| g.value_type(n).and_then(|t| t.dtype);
            if float(&a) != Some(dtype::FLOAT) || float(&c) != Some(dtype::FLOAT) {
                continue;
            }
            rewrites.push(Rewrite::replace(i, "Gemm", "", vec![a, b, c], vec![]).removing([j]));
            break;
        }
    }
    apply(g, rewrites)
}

/// Runs every rewrite once; returns how many fired.
pub(crate) fn rewrite_patterns(g: &mut Graph) -> usize {
    reshape_chains(g)
        + transpose_chains(g)
        + reshape_round_trips(g)
        + cast_chains(g)
        + squeeze_pairs(g)
        + matmul_add_to_gemm(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed, int, GraphExt};

    #[test]
    fn chains_collapse() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT16, fixed(&[2, 3]));
        let s1 = g.i64s(&[1], &[6]);
        let s2 = g.i64s(&[2], &[3, 2]);
        let r1 = g.op("Reshape", &[&x, &s1]);
        let r2 = g.op("Reshape", &[&r1, &s2]);
        let c1 = g.op_with("Cast", &[&r2], vec![int("to", i64::from(dtype::FLOAT))]);
        let c2 = g.op_with("Cast", &[&c1], vec![int("to", i64::from(dtype::FLOAT16))]);
        g.outputs.push(c2);
        assert_eq!(reshape_chains(&mut g), 1);
        assert_eq!(g.nodes[1].inputs[0], x);
        g.typed(&r2, dtype::FLOAT16, &[3, 2]);
        assert_eq!(cast_chains(&mut g), 1);
        assert_eq!(g.nodes[3].inputs[0], r2);
    }

    #[test]
    fn lossy_casts_stay() {
        assert!(!lossless(dtype::FLOAT, dtype::FLOAT16));
        assert!(!lossless(dtype::INT64, dtype::FLOAT));
        assert!(lossless(dtype::FLOAT16, dtype::FLOAT));
    }

    /// `dims` with "b" and "s" symbolic.
    fn sym(dims: &[&str]) -> Vec<Dim> {
        dims.iter()
            .map(|d| {
                d.parse()
                    .map_or_else(|_| Dim::Sym((*d).to_owned()), Dim::Fixed)
            })
            .collect()
    }

    fn typed_sym(g: &mut Graph, v: &str, dims: &[&str]) {
        let ty = crate::graph::ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(sym(dims)),
            sequence: false,
        };
        g.set_type(v, ty).expect("test type");
    }

    #[test]
    fn an_attention_outputs_round_trip_of_layouts_is_dropped() {
        // GroupQueryAttention's [b, s, 64] split into heads, back to heads-first, through a same-shape
        // Reshape, the model's transpose to heads-last and its merge: x itself
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(sym(&["b", "s", "64"])));
        let heads = g.i64s(&[4], &[0, 0, 4, 16]);
        let merged = g.i64s(&[3], &[0, 0, 64]);
        let swap = || vec![ints_attr("perm", &[0, 2, 1, 3])];
        let r1 = g.op("Reshape", &[&x, &heads]);
        let t1 = g.op_with("Transpose", &[&r1], swap());
        let shape = g.op("Shape", &[&t1]); // a run-time shape: no constant to compose
        let r2 = g.op("Reshape", &[&t1, &shape]);
        let t2 = g.op_with("Transpose", &[&r2], swap());
        let r3 = g.op("Reshape", &[&t2, &merged]);
        let y = g.op("Relu", &[&r3]);
        g.outputs.push(y);
        for (v, dims) in [
            (&r1, &["b", "s", "4", "16"]),
            (&t1, &["b", "4", "s", "16"]),
            (&r2, &["b", "4", "s", "16"]),
            (&t2, &["b", "s", "4", "16"]),
        ] {
            typed_sym(&mut g, v, dims);
        }
        typed_sym(&mut g, &r3, &["b", "s", "64"]);
        rewrite_patterns(&mut g);
        let relu = g.nodes.iter().find(|n| n.op_type == "Relu").expect("relu");
        let at = producers(&g)[&relu.inputs[0]];
        assert_eq!(g.nodes[at].op_type, "Identity");
        assert_eq!(g.nodes[at].inputs, vec![x.clone()]);
        // the second Transpose composed with the first: the identity permutation
        let t2_node = &g.nodes[producers(&g)[&t2]];
        assert_eq!(t2_node.op_type, "Identity");
    }

    #[test]
    fn a_reshape_to_another_shape_or_an_unknown_one_stays() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(sym(&["b", "s", "64"])));
        let heads = g.i64s(&[4], &[0, 0, 4, 16]);
        let r1 = g.op("Reshape", &[&x, &heads]);
        typed_sym(&mut g, &r1, &["b", "s", "4", "16"]);
        let flat = g.i64s(&[1], &[-1]);
        let r2 = g.op("Reshape", &[&r1, &flat]);
        let ty = crate::graph::ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(vec![Dim::Unknown]),
            sequence: false,
        };
        g.set_type(&r2, ty).expect("test type");
        g.outputs.push(r1.clone());
        g.outputs.push(r2.clone());
        assert_eq!(reshape_round_trips(&mut g), 0);
    }

    fn ints_attr(name: &str, v: &[i64]) -> Attribute {
        Attribute {
            name: name.to_owned(),
            value: AttrValue::Ints(v.to_vec()),
        }
    }
}
