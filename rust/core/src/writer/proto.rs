//! The prost messages of everything but the weights' bytes: the model's header (opsets, metadata,
//! local functions), value infos, attributes, nodes, tensor headers, and whole (sub)graphs for
//! attributes. The top-level graph's nodes are not built here but encoded by `skeleton`.
//!
//! `value_info` (`Model::value_info`): every function taking `value_info: bool` passes it on to the
//! subgraphs of the nodes it encodes; the local functions' bodies get none.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::functions::function_opsets;
use crate::graph::{AttrValue, Dim, Graph, Node, ValueType};
use crate::infer::Inferred;
use crate::model::{Function, Model};
use crate::proto::onnx;
use crate::scopes::Scope;
use crate::tensor::Tensor;

/// A value's type: a tensor's, or a sequence's of such tensors.
pub(super) fn type_proto(ty: &ValueType) -> onnx::TypeProto {
    let shape = ty.shape.as_ref().map(|dims| onnx::TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| onnx::tensor_shape_proto::Dimension {
                value: match d {
                    Dim::Fixed(v) => Some(onnx::tensor_shape_proto::dimension::Value::DimValue(*v)),
                    Dim::Sym(s) => Some(onnx::tensor_shape_proto::dimension::Value::DimParam(
                        s.clone(),
                    )),
                    Dim::Unknown => None,
                },
                denotation: None,
            })
            .collect(),
    });
    let tensor = onnx::TypeProto {
        value: Some(onnx::type_proto::Value::TensorType(
            onnx::type_proto::Tensor {
                elem_type: ty.dtype,
                shape,
            },
        )),
        denotation: None,
    };
    if !ty.sequence {
        return tensor;
    }
    onnx::TypeProto {
        value: Some(onnx::type_proto::Value::SequenceType(Box::new(
            onnx::type_proto::Sequence {
                elem_type: Some(Box::new(tensor)),
            },
        ))),
        denotation: None,
    }
}

/// The value info of a graph input or output.
fn io_value_info(graph: &Graph, name: &str) -> Result<onnx::ValueInfoProto> {
    let ty = graph.value_type(name).cloned().unwrap_or_default();
    if ty.dtype.is_none() {
        return Err(Error::Serialization(format!(
            "graph {:?}: input or output {name:?} has no known element type",
            graph.name
        )));
    }
    Ok(onnx::ValueInfoProto {
        name: Some(name.to_owned()),
        r#type: Some(type_proto(&ty)),
        metadata_props: value_metadata(graph, name),
        ..Default::default()
    })
}

pub(super) fn entries<'a>(
    props: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<onnx::StringStringEntryProto> {
    props
        .into_iter()
        .map(|(k, v)| onnx::StringStringEntryProto {
            key: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect()
}

/// The `metadata_props` of an input, output or initializer.
pub(super) fn value_metadata(graph: &Graph, name: &str) -> Vec<onnx::StringStringEntryProto> {
    graph
        .value_metadata
        .get(name)
        .map(|props| entries(props.iter().map(|(k, v)| (k, v))))
        .unwrap_or_default()
}

pub(super) fn tensor_header(t: &Tensor) -> onnx::TensorProto {
    onnx::TensorProto {
        dims: t.dims.clone(),
        data_type: Some(t.dtype),
        name: if t.name.is_empty() {
            None
        } else {
            Some(t.name.clone())
        },
        ..Default::default()
    }
}

/// A tensor with its bytes copied in: for attributes and subgraph initializers, which are small.
fn tensor_full(t: &Tensor) -> onnx::TensorProto {
    let mut p = tensor_header(t);
    p.raw_data = Some(t.data.to_vec());
    p
}

fn attribute(
    name: &str,
    value: &AttrValue,
    value_info: Option<&Inferred>,
) -> Result<onnx::AttributeProto> {
    use onnx::attribute_proto::AttributeType as T;
    let mut a = onnx::AttributeProto {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    let ty = match value {
        AttrValue::Int(v) => {
            a.i = Some(*v);
            T::Int
        }
        AttrValue::Float(v) => {
            a.f = Some(*v);
            T::Float
        }
        AttrValue::String(v) => {
            a.s = Some(v.clone());
            T::String
        }
        AttrValue::Ints(v) => {
            a.ints = v.clone();
            T::Ints
        }
        AttrValue::Floats(v) => {
            a.floats = v.clone();
            T::Floats
        }
        AttrValue::Strings(v) => {
            a.strings = v.clone();
            T::Strings
        }
        AttrValue::Tensor(t) => {
            a.t = Some(tensor_full(t));
            T::Tensor
        }
        AttrValue::Graph(g) => {
            a.g = Some(graph_full(g, value_info)?);
            T::Graph
        }
    };
    a.r#type = Some(ty as i32);
    Ok(a)
}

pub(super) fn node_proto(
    n: &Node,
    scopes: &[Arc<Scope>],
    value_info: Option<&Inferred>,
) -> Result<onnx::NodeProto> {
    let metadata_props = n
        .scope
        .and_then(|i| scopes.get(i as usize))
        .map(|s| entries(s.props.iter().map(|(k, v)| (k, v))))
        .unwrap_or_default();
    Ok(onnx::NodeProto {
        input: n.inputs.clone(),
        output: n.outputs.clone(),
        name: Some(n.name.clone()),
        op_type: Some(n.op_type.clone()),
        domain: if n.domain.is_empty() {
            None
        } else {
            Some(n.domain.clone())
        },
        attribute: n
            .attrs
            .iter()
            .map(|a| attribute(&a.name, &a.value, value_info))
            .collect::<Result<_>>()?,
        metadata_props,
        ..Default::default()
    })
}

/// The graph without its initializers (they are streamed separately).
pub(super) fn graph_skeleton(g: &Graph, value_info: Option<&Inferred>) -> Result<onnx::GraphProto> {
    let scopes = if g.nodes.iter().any(|n| n.scope.is_some()) {
        g.scopes.snapshot()
    } else {
        Vec::new()
    };
    let mut p = graph_without_nodes(g, value_info)?;
    p.node = g
        .nodes
        .iter()
        .map(|n| node_proto(n, &scopes, value_info))
        .collect::<Result<_>>()?;
    Ok(p)
}

pub(super) fn graph_without_nodes(
    g: &Graph,
    value_info: Option<&Inferred>,
) -> Result<onnx::GraphProto> {
    Ok(onnx::GraphProto {
        name: Some(g.name.clone()),
        input: g
            .inputs
            .iter()
            .map(|n| io_value_info(g, n))
            .collect::<Result<_>>()?,
        output: g
            .outputs
            .iter()
            .map(|n| io_value_info(g, n))
            .collect::<Result<_>>()?,
        value_info: match value_info {
            Some(inferred) => value_infos(g, inferred),
            None => Vec::new(),
        },
        metadata_props: entries(&g.metadata),
        ..Default::default()
    })
}

/// The `value_info` entries of `g` as messages (the values `value_info::typed_values` gives); the
/// top graph's are encoded without messages (`value_info::encode_value_infos`).
pub(super) fn value_infos(g: &Graph, inferred: &Inferred) -> Vec<onnx::ValueInfoProto> {
    super::value_info::typed_values(g, inferred)
        .map(|(name, ty, _, _)| onnx::ValueInfoProto {
            name: Some(name.to_owned()),
            r#type: Some(type_proto(ty)),
            ..Default::default()
        })
        .collect()
}

/// A whole (sub)graph as one prost message, initializers copied in.
pub(super) fn graph_full(g: &Graph, value_info: Option<&Inferred>) -> Result<onnx::GraphProto> {
    let mut p = graph_skeleton(g, value_info)?;
    p.initializer = g.initializers.iter().map(tensor_full).collect();
    Ok(p)
}

/// A local function: its constants become `Constant` nodes (a FunctionProto has no initializers), its
/// nodes keep their names and metadata; no `value_info`, in the body or its subgraphs: one body may
/// serve calls on values of other shapes (runtimes infer the types at each call).
fn function_proto(
    f: &Function,
    model_opsets: &BTreeMap<String, i64>,
) -> Result<onnx::FunctionProto> {
    let g = &f.graph;
    let scopes = if g.nodes.iter().any(|n| n.scope.is_some()) {
        g.scopes.snapshot()
    } else {
        Vec::new()
    };
    let mut node: Vec<onnx::NodeProto> = g
        .initializers
        .iter()
        .map(|t| {
            Ok(onnx::NodeProto {
                output: vec![t.name.clone()],
                name: Some(format!("Constant_{}", t.name)),
                op_type: Some("Constant".to_owned()),
                attribute: vec![attribute("value", &AttrValue::Tensor(t.clone()), None)?],
                ..Default::default()
            })
        })
        .collect::<Result<_>>()?;
    for n in &g.nodes {
        node.push(node_proto(n, &scopes, None)?);
    }
    Ok(onnx::FunctionProto {
        name: Some(f.name.clone()),
        domain: Some(f.domain.clone()),
        input: g.inputs.clone(),
        output: g.outputs.clone(),
        node,
        opset_import: function_opsets(f, model_opsets)
            .into_iter()
            .map(|(d, v)| onnx::OperatorSetIdProto {
                domain: Some(d),
                version: Some(v),
            })
            .collect(),
        ..Default::default()
    })
}

pub(super) fn model_header(m: &Model) -> Result<onnx::ModelProto> {
    Ok(onnx::ModelProto {
        ir_version: Some(m.ir_version),
        opset_import: m
            .opsets
            .iter()
            .map(|(d, v)| onnx::OperatorSetIdProto {
                domain: Some(d.clone()),
                version: Some(*v),
            })
            .collect(),
        producer_name: Some(m.producer_name.clone()),
        producer_version: Some(m.producer_version.clone()),
        metadata_props: entries(&m.metadata),
        functions: m
            .functions
            .iter()
            .map(|f| function_proto(f, &m.opsets))
            .collect::<Result<_>>()?,
        ..Default::default()
    })
}
