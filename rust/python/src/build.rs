//! Building the graph: values (inputs, outputs, constants, types) and nodes with their attributes, and
//! reading them back (the walker's checks, the debug dump, the report).

use std::collections::BTreeMap;

use fastonnx_core::{AttrValue, Attribute, Dim, Model, Tensor, TensorData, ValueType};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::{py_err, GraphBuilder, GraphError};

/// One node as Python sees it: name, op type, input names, output names.
type NodeRows = Vec<(String, String, Vec<String>, Vec<String>)>;

fn to_dims(shape: Option<Vec<Option<DimArg>>>) -> Option<Vec<Dim>> {
    shape.map(|dims| {
        dims.into_iter()
            .map(|d| match d {
                Some(DimArg::Int(v)) => Dim::Fixed(v),
                Some(DimArg::Sym(s)) => Dim::Sym(s),
                None => Dim::Unknown,
            })
            .collect()
    })
}

#[derive(FromPyObject)]
enum DimArg {
    Int(i64),
    Sym(String),
}

fn dims_to_py(py: Python<'_>, dims: &[Dim]) -> PyResult<Py<PyList>> {
    let items: Vec<Py<PyAny>> = dims
        .iter()
        .map(|d| -> PyResult<Py<PyAny>> {
            Ok(match d {
                Dim::Fixed(v) => v.into_pyobject(py)?.into_any().unbind(),
                Dim::Sym(s) => s.into_pyobject(py)?.into_any().unbind(),
                Dim::Unknown => py.None(),
            })
        })
        .collect::<PyResult<_>>()?;
    Ok(PyList::new(py, items)?.unbind())
}

/// A tensor-valued node attribute (ConstantOfShape's value, Constant's value).
#[pyclass(module = "fastonnx._core", frozen)]
pub(crate) struct TensorAttr {
    tensor: Tensor,
}

#[pymethods]
impl TensorAttr {
    #[new]
    fn new(data: &[u8], dtype: i32, shape: Vec<i64>) -> PyResult<Self> {
        fastonnx_core::tensor::check_size("tensor attribute", dtype, &shape, data.len())
            .map_err(py_err)?;
        Ok(TensorAttr {
            tensor: Tensor {
                name: String::new(),
                dtype,
                dims: shape,
                data: TensorData::Owned(data.to_vec()),
            },
        })
    }
}

fn attr_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<AttrValue> {
    if v.is_instance_of::<PyBool>() {
        return Ok(AttrValue::Int(i64::from(v.extract::<bool>()?)));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(AttrValue::Int(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(AttrValue::Float(v.extract::<f64>()? as f32));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(AttrValue::String(v.extract::<String>()?.into_bytes()));
    }
    if v.is_instance_of::<PyBytes>() {
        return Ok(AttrValue::String(v.extract::<Vec<u8>>()?));
    }
    if let Ok(t) = v.extract::<PyRef<'_, TensorAttr>>() {
        return Ok(AttrValue::Tensor(t.tensor.clone()));
    }
    if let Ok(mut sub) = v.extract::<PyRefMut<'_, GraphBuilder>>() {
        let graph = std::mem::take(&mut sub.model.graph);
        return Ok(AttrValue::Graph(Box::new(graph)));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> = v.try_iter()?.collect::<PyResult<_>>()?;
        if items.iter().all(|i| i.is_instance_of::<PyInt>()) {
            return Ok(AttrValue::Ints(
                items.iter().map(|i| i.extract()).collect::<PyResult<_>>()?,
            ));
        }
        if items
            .iter()
            .all(|i| i.is_instance_of::<PyInt>() || i.is_instance_of::<PyFloat>())
        {
            let floats = items
                .iter()
                .map(|i| i.extract::<f64>().map(|f| f as f32))
                .collect::<PyResult<_>>()?;
            return Ok(AttrValue::Floats(floats));
        }
        if items.iter().all(|i| i.is_instance_of::<PyString>()) {
            let strings = items
                .iter()
                .map(|i| i.extract::<String>().map(String::into_bytes))
                .collect::<PyResult<_>>()?;
            return Ok(AttrValue::Strings(strings));
        }
    }
    Err(GraphError::new_err(format!(
        "attribute {key:?}: cannot store a {} ({}) as an ONNX attribute",
        v.get_type().name()?,
        v.repr()?
    )))
}

impl GraphBuilder {
    /// The top graph's nodes `start..stop`, out-of-range bounds clamped (what `nodes` and
    /// `node_names` read).
    fn node_range(&self, start: usize, stop: Option<usize>) -> &[fastonnx_core::graph::Node] {
        let nodes = &self.model.graph.nodes;
        let stop = stop.map_or(nodes.len(), |s| s.min(nodes.len()));
        nodes.get(start.min(stop)..stop).unwrap_or_default()
    }
}

#[pymethods]
impl GraphBuilder {
    #[new]
    #[pyo3(signature = (opset, ir_version, *, producer_version = ""))]
    fn new(opset: i64, ir_version: i64, producer_version: &str) -> Self {
        GraphBuilder {
            model: Model::new(opset, ir_version, producer_version),
        }
    }

    #[getter]
    fn opset(&self) -> i64 {
        self.model.opset()
    }

    #[getter]
    fn ir_version(&self) -> i64 {
        self.model.ir_version
    }

    fn set_opset(&mut self, domain: &str, version: i64) {
        self.model.set_opset(domain, version);
    }

    fn opsets(&self) -> BTreeMap<String, i64> {
        self.model.opsets.clone()
    }

    fn unique_name(&self, hint: &str) -> String {
        self.model.graph.names.unique_value(hint)
    }

    fn has_value(&self, name: &str) -> bool {
        self.model.graph.has_value(name)
    }

    #[pyo3(signature = (name, dtype, shape))]
    fn add_input(&mut self, name: &str, dtype: i32, shape: Option<Vec<Option<DimArg>>>) -> String {
        self.model.graph.add_input(name, dtype, to_dims(shape))
    }

    #[pyo3(signature = (value, name = None))]
    fn add_output(&mut self, value: &str, name: Option<&str>) -> PyResult<String> {
        self.model.graph.add_output(value, name).map_err(py_err)
    }

    #[pyo3(signature = (data, dtype, shape, hint = "const"))]
    fn add_constant(
        &mut self,
        data: Vec<u8>,
        dtype: i32,
        shape: Vec<i64>,
        hint: &str,
    ) -> PyResult<String> {
        self.model
            .graph
            .add_constant(hint, dtype, shape, data)
            .map_err(py_err)
    }

    #[pyo3(signature = (op_type, inputs, outputs = None, attrs = None, domain = "", name = None))]
    fn add_node(
        &mut self,
        op_type: &str,
        inputs: Vec<String>,
        outputs: Option<&Bound<'_, PyAny>>,
        attrs: Option<&Bound<'_, PyDict>>,
        domain: &str,
        name: Option<&str>,
    ) -> PyResult<Vec<String>> {
        let hint = op_type.to_ascii_lowercase();
        let outs: Vec<String> = match outputs {
            None => vec![hint],
            Some(o) if o.is_instance_of::<PyInt>() => {
                let n: usize = o.extract()?;
                vec![hint; n]
            }
            Some(o) => o.extract()?,
        };
        let mut attributes = Vec::new();
        if let Some(a) = attrs {
            for (k, v) in a.iter() {
                let key: String = k.extract()?;
                let value = attr_value(&key, &v)?;
                if let AttrValue::Graph(_) = &value {
                    if let Ok(sub) = v.extract::<PyRef<'_, GraphBuilder>>() {
                        self.model.merge_opsets(&sub.model.opsets);
                    }
                }
                attributes.push(Attribute { name: key, value });
            }
        }
        self.model
            .graph
            .add_node(op_type, domain, inputs, &outs, attributes, name)
            .map_err(py_err)
    }

    /// `sequence`: the value is a sequence of tensors of that type (SequenceMap's output...).
    #[pyo3(signature = (name, dtype, shape, sequence = false))]
    fn set_type(
        &mut self,
        name: &str,
        dtype: Option<i32>,
        shape: Option<Vec<Option<DimArg>>>,
        sequence: bool,
    ) -> PyResult<()> {
        self.model
            .graph
            .set_type(
                name,
                ValueType {
                    dtype,
                    shape: to_dims(shape),
                    sequence,
                },
            )
            .map_err(py_err)
    }

    fn dtype(&self, name: &str) -> Option<i32> {
        self.model.graph.value_type(name).and_then(|t| t.dtype)
    }

    fn shape(&self, py: Python<'_>, name: &str) -> PyResult<Option<Py<PyList>>> {
        match self
            .model
            .graph
            .value_type(name)
            .and_then(|t| t.shape.as_ref())
        {
            Some(dims) => Ok(Some(dims_to_py(py, dims)?)),
            None => Ok(None),
        }
    }

    fn rank(&self, name: &str) -> Option<usize> {
        self.model
            .graph
            .value_type(name)
            .and_then(|t| t.shape.as_ref())
            .map(Vec::len)
    }

    fn constant_bytes<'py>(&self, py: Python<'py>, name: &str) -> Option<Bound<'py, PyBytes>> {
        self.model
            .graph
            .constant_bytes(name)
            .map(|b| PyBytes::new(py, b))
    }

    fn subgraph(&self, name: &str) -> GraphBuilder {
        GraphBuilder {
            model: self.model.subgraph(name),
        }
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.model.graph.nodes.len()
    }

    /// The nodes `start..stop` of the top graph as `(name, op_type, inputs, outputs)`, read-only: the
    /// debug dump and the report show what the converters emitted last. Out-of-range bounds are clamped.
    #[pyo3(signature = (start = 0, stop = None))]
    fn nodes(&self, start: usize, stop: Option<usize>) -> NodeRows {
        self.node_range(start, stop)
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    n.op_type.clone(),
                    n.inputs.clone(),
                    n.outputs.clone(),
                )
            })
            .collect()
    }

    /// The names of the top graph's nodes `start..stop` (what `nodes` gives, names only: cheap enough
    /// to take after every conversion).
    #[pyo3(signature = (start = 0, stop = None))]
    fn node_names(&self, start: usize, stop: Option<usize>) -> Vec<String> {
        self.node_range(start, stop)
            .iter()
            .map(|n| n.name.clone())
            .collect()
    }

    fn input_names(&self) -> Vec<String> {
        self.model.graph.inputs.clone()
    }

    fn output_names(&self) -> Vec<String> {
        self.model.graph.outputs.clone()
    }
}
