//! What the fusion passes share to match their chains: maps of producers and readers built once per
//! pass (so that matching stays linear in the graph's size), and small readers of nodes, types and
//! one-element constants.

use std::collections::HashMap;

use super::{f32_values, producers, readers};
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::tensor::le_i64s;

/// A node of the default domain with this op type.
pub(crate) fn is_op(n: &Node, op: &str) -> bool {
    n.op_type == op && n.domain.is_empty()
}

pub(crate) fn is_float(g: &Graph, name: &str) -> bool {
    g.value_type(name).and_then(|t| t.dtype) == Some(dtype::FLOAT)
}

pub(crate) fn rank(g: &Graph, name: &str) -> Option<usize> {
    g.value_type(name)
        .and_then(|t| t.shape.as_ref())
        .map(Vec::len)
}

/// The value of a one-element float32 constant (a larger one is never decoded).
pub(crate) fn f32_scalar(g: &Graph, name: &str) -> Option<f32> {
    if g.initializer(name)?.numel() != 1 {
        return None;
    }
    f32_values(g, name)?.first().copied()
}

/// Maps built once per pass, so that matching stays linear in the graph's size.
pub(crate) struct Index {
    pub(crate) prod: HashMap<String, usize>,
    pub(crate) reads: HashMap<String, usize>,
    /// value -> the first node reading it
    pub(crate) reader: HashMap<String, usize>,
}

impl Index {
    pub(crate) fn new(g: &Graph) -> Index {
        Index {
            prod: producers(g),
            reads: readers(g),
            reader: first_readers(g),
        }
    }
}

fn first_readers(g: &Graph) -> HashMap<String, usize> {
    let mut r = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for input in &n.inputs {
            r.entry(input.clone()).or_insert(i);
        }
    }
    r
}

/// The node reading `value`, when it is the only reader (graph outputs count as readers).
pub(crate) fn sole_reader<'a>(g: &'a Graph, ix: &Index, value: &str) -> Option<(usize, &'a Node)> {
    if ix.reads.get(value) != Some(&1) {
        return None;
    }
    let i = *ix.reader.get(value)?;
    Some((i, &g.nodes[i]))
}

/// The input of a two-input node that is not `known`.
pub(crate) fn other<'a>(n: &'a Node, known: &str) -> Option<&'a str> {
    match n.inputs.as_slice() {
        [a, b] if a == known => Some(b),
        [a, b] if b == known => Some(a),
        _ => None,
    }
}

pub(crate) fn reduces_last_axis(g: &Graph, mean: &Node, x_rank: usize) -> bool {
    let axes = match (mean.attr("axes"), mean.inputs.get(1)) {
        (Some(AttrValue::Ints(a)), _) => a.clone(),
        (None, Some(name)) => match g.initializer(name) {
            Some(t) if t.dtype == dtype::INT64 => le_i64s(t.data.as_slice().unwrap_or_default()),
            _ => return false,
        },
        _ => return false,
    };
    let keepdims = !matches!(mean.attr("keepdims"), Some(AttrValue::Int(0)));
    keepdims && (axes == [-1] || axes == [x_rank as i64 - 1])
}

/// The producer of `value`, when `value` has no other reader than the chain being matched.
pub(crate) fn sole_producer<'a>(
    g: &'a Graph,
    ix: &Index,
    value: &str,
) -> Option<(usize, &'a Node)> {
    if ix.reads.get(value) != Some(&1) {
        return None;
    }
    let i = *ix.prod.get(value)?;
    Some((i, &g.nodes[i]))
}

/// The same, when that producer is an `op` node.
pub(crate) fn sole_producer_op<'a>(
    g: &'a Graph,
    ix: &Index,
    value: &str,
    op: &str,
) -> Option<(usize, &'a Node)> {
    sole_producer(g, ix, value).filter(|(_, n)| is_op(n, op))
}

pub(crate) fn shape(g: &Graph, name: &str) -> Option<Vec<Dim>> {
    g.value_type(name)?.shape.clone()
}

pub(crate) fn fixed(d: &Dim) -> Option<i64> {
    match d {
        Dim::Fixed(n) => Some(*n),
        _ => None,
    }
}
