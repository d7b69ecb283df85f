//! Local simplifications: no-op nodes become Identity (then removed), equal nodes are computed once
//! (CSE), and a 2-D weight read through a Transpose is stored transposed instead (written block by
//! block by the writer, never copied whole in memory).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use super::retain_nodes;
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::tensor::{le_f32s, le_f64s, le_i32s, le_i64s, Tensor, TensorData};

fn static_shape(g: &Graph, name: &str) -> Option<Vec<i64>> {
    let shape = g.value_type(name)?.shape.as_ref()?;
    shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => Some(*v),
            _ => None,
        })
        .collect()
}

fn same_known_type(g: &Graph, a: &str, b: &str) -> bool {
    match (g.value_type(a), g.value_type(b)) {
        (Some(ta), Some(tb)) => {
            ta.dtype.is_some() && ta.dtype == tb.dtype && ta.shape.is_some() && ta.shape == tb.shape
        }
        _ => false,
    }
}

fn ints_attr<'a>(n: &'a Node, name: &str) -> Option<&'a [i64]> {
    match n.attr(name) {
        Some(AttrValue::Ints(v)) => Some(v),
        _ => None,
    }
}

/// True when the constant `name` holds only `value` (any element type).
fn constant_is(g: &Graph, name: &str, value: f64) -> bool {
    let Some(t) = g.initializer(name) else {
        return false;
    };
    let Some(bytes) = t.data.as_slice() else {
        return false;
    };
    if t.data.len() > 1024 {
        return false;
    }
    let values: Vec<f64> = match t.dtype {
        dtype::FLOAT => le_f32s(bytes).into_iter().map(f64::from).collect(),
        dtype::DOUBLE => le_f64s(bytes),
        dtype::INT64 => le_i64s(bytes).into_iter().map(|v| v as f64).collect(),
        dtype::INT32 => le_i32s(bytes).into_iter().map(f64::from).collect(),
        _ => return false,
    };
    values.iter().all(|v| *v == value)
}

fn constant_all_positive(g: &Graph, name: &str) -> bool {
    let Some(t) = g.initializer(name) else {
        return false;
    };
    match (t.dtype, t.data.as_slice()) {
        (dtype::INT64, Some(b)) => le_i64s(b).iter().all(|v| *v > 0),
        (dtype::INT32, Some(b)) => le_i32s(b).iter().all(|v| *v > 0),
        _ => false,
    }
}

/// Turns nodes that change nothing into Identity (remove_identities then drops them). Only when the
/// output's dtype and static shape, as torch recorded them, equal the input's.
pub fn mark_noops(g: &mut Graph) -> usize {
    let mut noop = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty() || n.outputs.len() != 1 || n.inputs.is_empty() {
            continue;
        }
        let (x, y) = (&n.inputs[0], &n.outputs[0]);
        let unchanged = same_known_type(g, x, y) && static_shape(g, x).is_some();
        let is_noop = match n.op_type.as_str() {
            "Cast" => {
                let to = match n.attr("to") {
                    Some(AttrValue::Int(t)) => Some(*t),
                    _ => None,
                };
                let from = g.value_type(x).and_then(|t| t.dtype).map(i64::from);
                from.is_some() && from == to
            }
            "Reshape" | "Expand" | "Squeeze" | "Unsqueeze" | "Flatten" | "Tile" => unchanged,
            // a reversing Slice keeps the shape: only forward steps make a same-shape Slice a no-op
            "Slice" => {
                unchanged
                    && (n.inputs.len() < 5
                        || n.inputs[4].is_empty()
                        || constant_all_positive(g, &n.inputs[4]))
            }
            "Transpose" => ints_attr(n, "perm")
                .map(|p| p.iter().enumerate().all(|(k, v)| *v == k as i64))
                .unwrap_or(false),
            "Mul" | "Div" if n.inputs.len() == 2 => unchanged && constant_is(g, &n.inputs[1], 1.0),
            "Add" | "Sub" if n.inputs.len() == 2 => unchanged && constant_is(g, &n.inputs[1], 0.0),
            _ => false,
        };
        if is_noop {
            noop.push(i);
        }
    }
    for &i in &noop {
        let n = &mut g.nodes[i];
        n.op_type = "Identity".to_owned();
        n.inputs.truncate(1);
        n.attrs.clear();
    }
    noop.len()
}

fn attr_key(out: &mut String, v: &AttrValue) -> bool {
    // Writing to a String cannot fail.
    match v {
        AttrValue::Int(i) => {
            let _ = write!(out, "i{i}");
        }
        AttrValue::Float(f) => {
            let _ = write!(out, "f{}", f.to_bits());
        }
        AttrValue::String(s) => {
            let _ = write!(out, "s{s:?}");
        }
        AttrValue::Ints(v) => {
            let _ = write!(out, "I{v:?}");
        }
        AttrValue::Floats(v) => {
            let bits: Vec<u32> = v.iter().map(|f| f.to_bits()).collect();
            let _ = write!(out, "F{bits:?}");
        }
        AttrValue::Strings(v) => {
            let _ = write!(out, "S{v:?}");
        }
        AttrValue::Tensor(t) => {
            if t.data.len() > 4096 {
                return false;
            }
            let _ = write!(out, "T{}{:?}{:?}", t.dtype, t.dims, t.data.to_vec());
        }
        AttrValue::Graph(_) => return false,
    }
    true
}

const NONDETERMINISTIC: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
];

/// Common-subexpression elimination: a node equal to an earlier one (op, domain, inputs, attributes)
/// reads the earlier one's outputs instead. Returns how many nodes were merged.
pub fn eliminate_common_subexpressions(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut replace: HashMap<String, String> = HashMap::new();
    let mut to_identity: Vec<(usize, String)> = Vec::new();
    let mut removed: HashSet<usize> = HashSet::new();
    for i in 0..g.nodes.len() {
        for input in g.nodes[i].inputs.iter_mut() {
            if let Some(r) = replace.get(input) {
                *input = r.clone();
            }
        }
        let n = &g.nodes[i];
        if n.outputs.is_empty() || NONDETERMINISTIC.contains(&n.op_type.as_str()) {
            continue;
        }
        let mut key = format!("{}|{}|{:?}|", n.op_type, n.domain, n.inputs);
        if !n.attrs.iter().all(|a| {
            key.push_str(&a.name);
            key.push('=');
            attr_key(&mut key, &a.value)
        }) {
            continue;
        }
        let _ = write!(key, "|{}", n.outputs.len());
        match seen.get(&key) {
            Some(&first) => {
                let earlier = g.nodes[first].outputs.clone();
                let mine = n.outputs.clone();
                if mine.iter().any(|o| outputs.contains(o)) {
                    // keep the graph output's name: the node becomes an Identity of the first result
                    if mine.len() == 1 {
                        to_identity.push((i, earlier[0].clone()));
                    }
                    continue;
                }
                for (m, e) in mine.into_iter().zip(earlier) {
                    if !m.is_empty() {
                        replace.insert(m, e);
                    }
                }
                removed.insert(i);
            }
            None => {
                seen.insert(key, i);
            }
        }
    }
    for (i, src) in &to_identity {
        let n = &mut g.nodes[*i];
        n.op_type = "Identity".to_owned();
        n.domain.clear();
        n.inputs = vec![src.clone()];
        n.attrs.clear();
    }
    // readers inside subgraphs may also refer to merged values
    if !replace.is_empty() {
        for n in g.nodes.iter_mut() {
            for a in n.attrs.iter_mut() {
                if let AttrValue::Graph(sub) = &mut a.value {
                    for (old, new) in &replace {
                        sub.rename(old, new);
                    }
                }
            }
        }
    }
    let count = removed.len() + to_identity.len();
    retain_nodes(g, |i| !removed.contains(&i));
    count
}

/// A Transpose of a 2-D initializer becomes an initializer stored transposed: weights stay borrowed
/// (the writer transposes them as it writes), small owned constants are transposed now.
pub fn fold_weight_transposes(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut folded: Vec<(usize, Tensor)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op_type != "Transpose" || !n.domain.is_empty() || n.inputs.len() != 1 {
            continue;
        }
        if outputs.contains(&n.outputs[0]) {
            continue;
        }
        let Some(w) = g.initializer(&n.inputs[0]) else {
            continue;
        };
        if w.dims.len() != 2 {
            continue;
        }
        if let Some(p) = ints_attr(n, "perm") {
            if p != [1, 0] {
                continue;
            }
        }
        let Some(item) = dtype::item_size(w.dtype) else {
            continue;
        };
        let (rows, cols) = (w.dims[0] as usize, w.dims[1] as usize);
        let data = match &w.data {
            TensorData::Borrowed(src) => TensorData::Transposed {
                source: Arc::clone(src),
                rows,
                cols,
                item,
            },
            // transposing a transposed weight gives the original memory back
            TensorData::Transposed { source, .. } => TensorData::Borrowed(Arc::clone(source)),
            // no bytes yet, or bytes computed as they are written: keep the Transpose node
            TensorData::Deferred { .. } | TensorData::ChannelScaled { .. } => continue,
            TensorData::Owned(bytes) => {
                let view = TensorData::Transposed {
                    source: Arc::new(bytes.clone()),
                    rows,
                    cols,
                    item,
                };
                TensorData::Owned(view.to_vec())
            }
        };
        folded.push((
            i,
            Tensor {
                name: n.outputs[0].clone(),
                dtype: w.dtype,
                dims: vec![w.dims[1], w.dims[0]],
                data,
            },
        ));
    }
    let count = folded.len();
    let drop: HashSet<usize> = folded.iter().map(|(i, _)| *i).collect();
    for (_, t) in folded {
        g.insert_initializer(t);
    }
    retain_nodes(g, |i| !drop.contains(&i));
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, ValueType};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn cse_merges_equal_nodes_and_keeps_outputs() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let a = g
            .add_node("Relu", "", vec![x.clone()], &["a".into()], vec![], None)
            .expect("a");
        let b = g
            .add_node("Relu", "", vec![x.clone()], &["b".into()], vec![], None)
            .expect("b");
        let s = g
            .add_node(
                "Add",
                "",
                vec![a[0].clone(), b[0].clone()],
                &["s".into()],
                vec![],
                None,
            )
            .expect("s");
        g.outputs.push(s[0].clone());
        assert_eq!(eliminate_common_subexpressions(&mut g), 1);
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(g.nodes[1].inputs, vec!["a".to_owned(), "a".to_owned()]);
    }

    #[test]
    fn noops_become_identity() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2)]));
        let one = g
            .add_constant("one", dtype::FLOAT, vec![], f32s(&[1.0]))
            .expect("one");
        let two = g
            .add_constant("two", dtype::FLOAT, vec![], f32s(&[2.0]))
            .expect("two");
        let to = Attribute {
            name: "to".into(),
            value: AttrValue::Int(i64::from(dtype::FLOAT)),
        };
        let c = g
            .add_node("Cast", "", vec![x.clone()], &["c".into()], vec![to], None)
            .expect("c");
        let m = g
            .add_node(
                "Mul",
                "",
                vec![c[0].clone(), one],
                &["m".into()],
                vec![],
                None,
            )
            .expect("m");
        let m2 = g
            .add_node(
                "Mul",
                "",
                vec![m[0].clone(), two],
                &["m2".into()],
                vec![],
                None,
            )
            .expect("m2");
        let ty = ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(vec![Dim::Fixed(2)]),
        };
        for v in [&c[0], &m[0], &m2[0]] {
            g.set_type(v, ty.clone()).expect("type");
        }
        assert_eq!(mark_noops(&mut g), 2);
        assert_eq!(g.nodes[2].op_type, "Mul");
    }

    #[test]
    fn a_reversing_slice_is_not_a_noop() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(3)]));
        let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let s = g
            .add_constant("s", dtype::INT64, vec![1], i64s(&[-1]))
            .expect("s");
        let e = g
            .add_constant("e", dtype::INT64, vec![1], i64s(&[i64::MIN]))
            .expect("e");
        let a = g
            .add_constant("a", dtype::INT64, vec![1], i64s(&[0]))
            .expect("a");
        let one = g
            .add_constant("one", dtype::INT64, vec![1], i64s(&[1]))
            .expect("one");
        let rev = g
            .add_node(
                "Slice",
                "",
                vec![x.clone(), s.clone(), e.clone(), a.clone(), s],
                &["rev".into()],
                vec![],
                None,
            )
            .expect("rev");
        let z = g
            .add_constant("z", dtype::INT64, vec![1], i64s(&[0]))
            .expect("z");
        let all = g
            .add_node(
                "Slice",
                "",
                vec![rev[0].clone(), z, e, a, one],
                &["all".into()],
                vec![],
                None,
            )
            .expect("all");
        let ty = ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(vec![Dim::Fixed(3)]),
        };
        g.set_type(&rev[0], ty.clone()).expect("t");
        g.set_type(&all[0], ty).expect("t");
        assert_eq!(mark_noops(&mut g), 1);
        assert_eq!(g.nodes[0].op_type, "Slice");
        assert_eq!(g.nodes[1].op_type, "Identity");
    }

    #[test]
    fn weight_transposes_fold_lazily() {
        let mut g = Graph::new("g");
        let w = g
            .add_constant(
                "w",
                dtype::FLOAT,
                vec![2, 3],
                f32s(&[1., 2., 3., 4., 5., 6.]),
            )
            .expect("w");
        let t = g
            .add_node("Transpose", "", vec![w], &["wt".into()], vec![], None)
            .expect("t");
        g.outputs.push("y".into());
        let y = g.add_node("Relu", "", vec![t[0].clone()], &["y".into()], vec![], None);
        assert!(y.is_ok());
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let wt = g.initializer("wt").expect("folded");
        assert_eq!(wt.dims, vec![3, 2]);
        assert_eq!(wt.data.to_vec(), f32s(&[1., 4., 2., 5., 3., 6.]));
    }
}
