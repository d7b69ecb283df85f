//! No-op nodes (a Cast to the same type, a same-shape Reshape / Expand / forward Slice, `*1`, `+0`, an
//! identity Transpose, a Concat of one value and empty ones...) become Identity, which the identity
//! removal then drops.

use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::tensor::{le_f32s, le_f64s, le_i32s, le_i64s};

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

pub(super) fn ints_attr<'a>(n: &'a Node, name: &str) -> Option<&'a [i64]> {
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

/// The one input of a Concat whose others are all empty along its axis (a partial rotary's
/// pass-through slice when the rotary covers the whole head: Phi-3's), when it has the output's type.
fn sole_nonempty_concat_input(g: &Graph, n: &Node) -> Option<usize> {
    let Some(AttrValue::Int(axis)) = n.attr("axis") else {
        return None;
    };
    let empty = |v: &str| {
        let shape = g.value_type(v).and_then(|t| t.shape.as_ref());
        shape.is_some_and(|s| {
            let at = if *axis < 0 {
                *axis + s.len() as i64
            } else {
                *axis
            };
            usize::try_from(at).is_ok_and(|at| matches!(s.get(at), Some(Dim::Fixed(0))))
        })
    };
    let mut kept = n.inputs.iter().enumerate().filter(|(_, v)| !empty(v));
    let (at, x) = kept.next()?;
    (kept.next().is_none() && same_known_type(g, x, &n.outputs[0])).then_some(at)
}

/// Turns nodes that change nothing into Identity (remove_identities then drops them). Only when the
/// output's dtype and static shape, as torch recorded them, equal the input's (a Concat's: its one
/// non-empty input's dtype and shape, static or not).
pub fn mark_noops(g: &mut Graph) -> usize {
    let mut noop = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty() || n.outputs.len() != 1 || n.inputs.is_empty() {
            continue;
        }
        if n.op_type == "Concat" {
            if let Some(at) = sole_nonempty_concat_input(g, n) {
                noop.push((i, at));
            }
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
                .is_some_and(|p| p.iter().enumerate().all(|(k, v)| *v == k as i64)),
            "Mul" | "Div" if n.inputs.len() == 2 => unchanged && constant_is(g, &n.inputs[1], 1.0),
            "Add" | "Sub" if n.inputs.len() == 2 => unchanged && constant_is(g, &n.inputs[1], 0.0),
            _ => false,
        };
        if is_noop {
            noop.push((i, 0));
        }
    }
    for &(i, kept) in &noop {
        let n = &mut g.nodes[i];
        n.op_type = "Identity".to_owned();
        n.inputs = vec![n.inputs[kept].clone()];
        n.attrs.clear();
    }
    noop.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed, int, GraphExt};

    #[test]
    fn noops_become_identity() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2]));
        let one = g.f32s(&[], &[1.0]);
        let two = g.f32s(&[], &[2.0]);
        let c = g.op_with("Cast", &[&x], vec![int("to", i64::from(dtype::FLOAT))]);
        let m = g.op("Mul", &[&c, &one]);
        let m2 = g.op("Mul", &[&m, &two]);
        for v in [&c, &m, &m2] {
            g.typed(v, dtype::FLOAT, &[2]);
        }
        assert_eq!(mark_noops(&mut g), 2);
        assert_eq!(g.nodes[2].op_type, "Mul");
    }

    #[test]
    fn a_concat_of_one_value_and_empty_ones_is_a_noop() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 4]));
        let none = g.add_input("none", dtype::FLOAT, fixed(&[2, 0]));
        let some = g.add_input("some", dtype::FLOAT, fixed(&[2, 1]));
        let kept = g.op_with("Concat", &[&none, &x], vec![int("axis", -1)]);
        let grown = g.op_with("Concat", &[&x, &some], vec![int("axis", 1)]);
        g.typed(&kept, dtype::FLOAT, &[2, 4]);
        g.typed(&grown, dtype::FLOAT, &[2, 5]);
        assert_eq!(mark_noops(&mut g), 1);
        assert_eq!(g.nodes[0].op_type, "Identity");
        assert_eq!(g.nodes[0].inputs, vec![x]);
        assert_eq!(g.nodes[1].op_type, "Concat");
    }

    #[test]
    fn a_reversing_slice_is_not_a_noop() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[3]));
        let s = g.i64s(&[1], &[-1]);
        let e = g.i64s(&[1], &[i64::MIN]);
        let a = g.i64s(&[1], &[0]);
        let one = g.i64s(&[1], &[1]);
        let rev = g.op("Slice", &[&x, &s, &e, &a, &s]);
        let all = g.op("Slice", &[&rev, &a, &e, &a, &one]);
        g.typed(&rev, dtype::FLOAT, &[3]);
        g.typed(&all, dtype::FLOAT, &[3]);
        assert_eq!(mark_noops(&mut g), 1);
        assert_eq!(g.nodes[0].op_type, "Slice");
        assert_eq!(g.nodes[1].op_type, "Identity");
    }
}
