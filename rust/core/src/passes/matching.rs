//! What the passes share to match their chains: maps of producers and readers built once per pass
//! (so that matching stays linear in the graph's size), and small readers of nodes, types, attributes
//! and one-element constants.

use std::collections::HashMap;

use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node};
use crate::tensor::le_i64s;

/// The float32 values of a constant initializer held in memory (None for other types).
pub(crate) fn f32_values(g: &Graph, name: &str) -> Option<Vec<f32>> {
    let t = g.initializer(name)?;
    if t.dtype != dtype::FLOAT {
        return None;
    }
    Some(crate::tensor::le_f32s(t.data.as_slice()?))
}

/// Value name -> index of the node producing it.
pub(crate) fn producers(g: &Graph) -> HashMap<String, usize> {
    g.nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i)))
        .collect()
}

/// Value name -> how many times it is read (node inputs and graph outputs, and reads inside the
/// subgraphs of If / Loop / Scan nodes, which may read outer values: a fusion must not remove those).
pub(crate) fn readers(g: &Graph) -> HashMap<String, usize> {
    fn count(g: &Graph, r: &mut HashMap<String, usize>) {
        for name in g
            .nodes
            .iter()
            .flat_map(|n| n.inputs.iter())
            .chain(g.outputs.iter())
        {
            *r.entry(name.clone()).or_default() += 1;
        }
        for sub in g
            .nodes
            .iter()
            .flat_map(super::super::graph::Node::subgraphs)
        {
            count(sub, r);
        }
    }
    let mut r = HashMap::new();
    count(g, &mut r);
    r
}

pub(crate) fn int_attr(name: &str, v: i64) -> Attribute {
    Attribute {
        name: name.into(),
        value: AttrValue::Int(v),
    }
}

/// The value of an int attribute (None when absent or of another type).
pub(crate) fn int_of(n: &Node, name: &str) -> Option<i64> {
    match n.attr(name) {
        Some(AttrValue::Int(v)) => Some(*v),
        _ => None,
    }
}

/// The axes of an Unsqueeze (attribute below opset 13, constant input from 13).
pub(crate) fn unsqueeze_axes(g: &Graph, n: &Node) -> Option<Vec<i64>> {
    match (n.attr("axes"), n.inputs.get(1)) {
        (Some(AttrValue::Ints(a)), _) => Some(a.clone()),
        (None, Some(name)) => {
            let t = g.initializer(name)?;
            (t.dtype == dtype::INT64).then(|| le_i64s(t.data.as_slice().unwrap_or_default()))
        }
        _ => None,
    }
}

pub(crate) fn float_attr(name: &str, v: f32) -> Attribute {
    Attribute {
        name: name.into(),
        value: AttrValue::Float(v),
    }
}

/// The output of a single-output node (every node of a chain has one).
pub(crate) fn output(n: &Node) -> Option<&String> {
    match n.outputs.as_slice() {
        [o] => Some(o),
        _ => None,
    }
}

/// `name` is a one-element float32 constant within 1e-6 (relative) of `want`, and broadcasting it
/// against a value of rank `x_rank` cannot add dimensions.
pub(crate) fn is_scalar(g: &Graph, name: &str, want: f64, x_rank: Option<usize>) -> bool {
    scalar(g, name, x_rank).is_some_and(|v| (f64::from(v) - want).abs() <= 1e-6 * want.abs())
}

/// The value of a one-element float32 constant whose rank is at most `x_rank` (0 when x's is unknown).
pub(crate) fn scalar(g: &Graph, name: &str, x_rank: Option<usize>) -> Option<f32> {
    let dims = g.initializer(name)?.dims.len();
    if dims > x_rank.unwrap_or(0) {
        return None;
    }
    f32_scalar(g, name)
}

/// The value read by a two-input node besides the constant `want` (either operand order).
pub(crate) fn beside_scalar(
    g: &Graph,
    n: &Node,
    want: f64,
    x_rank: Option<usize>,
) -> Option<String> {
    match n.inputs.as_slice() {
        [a, c] | [c, a] if is_scalar(g, c, want, x_rank) => Some(a.clone()),
        _ => None,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::AttrValue;
    use crate::testing::{fixed, GraphExt};

    #[test]
    fn reads_inside_subgraphs_count() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2]));
        let y = g.op("Neg", &[&x]);
        let mut body = g.subgraph("then");
        let z = body.op("Abs", &[&y]);
        body.outputs.push(z);
        g.op("Abs", &[&y]);
        let cond = g.add_input("c", dtype::BOOL, Some(vec![]));
        let branch = Attribute {
            name: "then_branch".into(),
            value: AttrValue::Graph(Box::new(body)),
        };
        g.op_with("If", &[&cond], vec![branch]);
        // y is read once by the outer graph's nodes, once inside the branch
        assert_eq!(readers(&g).get(&y), Some(&2));
        assert_eq!(readers(&g).get(&x), Some(&1));
    }
}
