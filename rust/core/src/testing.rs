//! Short forms for building graphs in unit tests: one line per node instead of `add_node`'s six
//! arguments. Test-only; a failure to build is a broken test, so these panic.

use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, Graph, Node, ValueType};

pub(crate) trait GraphExt {
    /// Adds `op(inputs)` of the standard domain; returns its (first) output.
    fn op(&mut self, op: &str, inputs: &[&str]) -> String;
    /// The same with attributes.
    fn op_with(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attribute>) -> String;
    /// A node reading `inputs`, not added to the graph (its output is a fresh value).
    fn node_of(&mut self, op: &str, inputs: &[&str]) -> Node;
    /// A float32 constant.
    fn f32s(&mut self, dims: &[i64], values: &[f32]) -> String;
    /// An int64 constant.
    fn i64s(&mut self, dims: &[i64], values: &[i64]) -> String;
    /// Records `value` as `dtype` with a static shape.
    fn typed(&mut self, value: &str, dtype: i32, dims: &[i64]);
    /// `Split(x, sizes, axis = -1)`; returns its outputs, named after `hints`.
    fn split_last(&mut self, x: &str, sizes: &[i64], hints: &[&str]) -> Vec<String>;
}

impl GraphExt for Graph {
    fn op(&mut self, op: &str, inputs: &[&str]) -> String {
        self.op_with(op, inputs, vec![])
    }

    fn op_with(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attribute>) -> String {
        let inputs = inputs.iter().map(|s| (*s).to_owned()).collect();
        let hint = op.to_lowercase();
        self.add_node(op, "", inputs, &[hint], attrs, None)
            .expect("test node")
            .remove(0)
    }

    fn split_last(&mut self, x: &str, sizes: &[i64], hints: &[&str]) -> Vec<String> {
        let sizes = self.i64s(&[sizes.len() as i64], sizes);
        let hints: Vec<String> = hints.iter().map(|h| (*h).to_owned()).collect();
        let axis = Attribute {
            name: "axis".to_owned(),
            value: crate::graph::AttrValue::Int(-1),
        };
        self.add_node(
            "Split",
            "",
            vec![x.to_owned(), sizes],
            &hints,
            vec![axis],
            None,
        )
        .expect("split")
    }

    fn node_of(&mut self, op: &str, inputs: &[&str]) -> Node {
        let output = self.new_value(&op.to_lowercase(), ValueType::default());
        Node {
            name: self.names.unique_node(op),
            op_type: op.to_owned(),
            domain: String::new(),
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
            outputs: vec![output],
            attrs: vec![],
            scope: None,
        }
    }

    fn f32s(&mut self, dims: &[i64], values: &[f32]) -> String {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_constant("c", dtype::FLOAT, dims.to_vec(), bytes)
            .expect("test constant")
    }

    fn i64s(&mut self, dims: &[i64], values: &[i64]) -> String {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_constant("i", dtype::INT64, dims.to_vec(), bytes)
            .expect("test constant")
    }

    fn typed(&mut self, value: &str, dtype: i32, dims: &[i64]) {
        let ty = ValueType {
            dtype: Some(dtype),
            shape: Some(dims.iter().map(|d| Dim::Fixed(*d)).collect()),
            sequence: false,
        };
        self.set_type(value, ty).expect("test type");
    }
}

pub(crate) fn int(name: &str, v: i64) -> Attribute {
    Attribute {
        name: name.to_owned(),
        value: AttrValue::Int(v),
    }
}

pub(crate) fn float(name: &str, v: f32) -> Attribute {
    Attribute {
        name: name.to_owned(),
        value: AttrValue::Float(v),
    }
}

/// A static shape, as `Graph::add_input` takes it.
#[allow(clippy::unnecessary_wraps)] // add_input takes an optional shape
pub(crate) fn fixed(dims: &[i64]) -> Option<Vec<Dim>> {
    Some(dims.iter().map(|d| Dim::Fixed(*d)).collect())
}
