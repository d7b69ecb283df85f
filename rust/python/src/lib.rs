//! `fastonnx._core`: the pyclass wrappers around fastonnx-core and the error → exception mapping.
//! No logic lives here; see rust/core.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastonnx_core::functions::{extract_functions, Instance};
use fastonnx_core::passes::{optimize_model_with, read_weights_as_stored, Level};
use fastonnx_core::{
    writer, AttrValue, Attribute, ByteSource, Dim, Error, Fetch, Model, Scope, SharedScopes,
    Tensor, TensorData, TiedKey, ValueType,
};
mod fx_scope;
use fx_scope::TupleTexts;

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

create_exception!(
    _core,
    FastOnnxError,
    PyException,
    "Base of every error fastonnx raises."
);
create_exception!(
    _core,
    GraphError,
    FastOnnxError,
    "The graph being built is inconsistent."
);
create_exception!(
    _core,
    SerializationError,
    FastOnnxError,
    "The model could not be written."
);
create_exception!(
    _core,
    ModelTooLargeError,
    SerializationError,
    "The protobuf would pass 2 GiB and external data was refused."
);

/// One node as Python sees it: name, op type, input names, output names.
type NodeRows = Vec<(String, String, Vec<String>, Vec<String>)>;

fn py_err(e: Error) -> PyErr {
    match e {
        Error::Graph(m) => GraphError::new_err(m),
        Error::Serialization(m) => SerializationError::new_err(m),
        e @ Error::Io { .. } => SerializationError::new_err(e.to_string()),
        e @ Error::TooLarge { .. } => ModelTooLargeError::new_err(e.to_string()),
        Error::Interrupted(m) => PyKeyboardInterrupt::new_err(m),
    }
}

/// How often a long operation takes the GIL back to run signal handlers and report progress.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The hook the bindings give long operations (`fastonnx_core::hook`), which run without the GIL: at
/// most every `WATCH_EVERY` (and at the end) it takes the GIL, runs the pending signal handlers — a
/// Ctrl-C raises KeyboardInterrupt there — and calls `progress(done, total)`. An exception stops the
/// operation; it is kept and raised unchanged once the operation has cleaned up.
struct Watch {
    progress: Option<Py<PyAny>>,
    last: Option<Instant>,
    raised: Option<PyErr>,
}

impl Watch {
    fn new(progress: Option<Py<PyAny>>) -> Self {
        Watch {
            progress,
            last: None,
            raised: None,
        }
    }

    fn step(&mut self, done: u64, total: u64) -> fastonnx_core::Result<()> {
        let now = Instant::now();
        if done < total
            && self
                .last
                .is_some_and(|t| now.duration_since(t) < WATCH_EVERY)
        {
            return Ok(());
        }
        self.last = Some(now);
        let progress = &self.progress;
        let outcome = Python::attach(|py| -> PyResult<()> {
            py.check_signals()?;
            if let Some(report) = progress {
                report.call1(py, (done, total))?;
            }
            Ok(())
        });
        outcome.map_err(|e| {
            self.raised = Some(e);
            Error::Interrupted("a Python exception stopped the operation".to_owned())
        })
    }

    /// The exception to raise for the operation's error: the one that stopped it, if any.
    fn error(&mut self, e: Error) -> PyErr {
        self.raised.take().unwrap_or_else(|| py_err(e))
    }
}

/// A Python buffer (a numpy view of torch storage, bytes…) read in place; holding it keeps the
/// exporting object, and so the memory, alive.
struct BufferSource(PyBuffer<u8>);

impl ByteSource for BufferSource {
    fn bytes(&self) -> &[u8] {
        let len = self.0.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the buffer was checked to be C-contiguous when taken; it stays valid while held.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, len) }
    }
}

/// A weight off the CPU: calling the Python callable returns a host copy of its bytes (a contiguous
/// buffer). The writer's pipeline calls it once per write, one tensor at a time (see `Fetch`).
struct PyFetch(Py<PyAny>);

impl Fetch for PyFetch {
    fn fetch(&self) -> std::io::Result<Arc<dyn ByteSource>> {
        Python::attach(|py| -> PyResult<Arc<dyn ByteSource>> {
            let host = self.0.call0(py)?;
            let buffer = PyBuffer::<u8>::get(host.bind(py))?;
            if !buffer.is_c_contiguous() {
                return Err(GraphError::new_err("the host copy is not contiguous"));
            }
            Ok(Arc::new(BufferSource(buffer)))
        })
        .map_err(|e| std::io::Error::other(format!("copying a weight to the host failed: {e}")))
    }
}

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
struct TensorAttr {
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

/// Holds one ONNX graph while it is built: names, types, shapes, nodes, initializers.
#[pyclass(module = "fastonnx._core")]
struct GraphBuilder {
    model: Model,
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

    fn has_initializer(&self, name: &str) -> bool {
        self.model.graph.is_initializer(name)
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

    /// `data` is any C-contiguous buffer (a numpy uint8 view of torch storage); it is held, not copied.
    fn add_initializer(
        &mut self,
        hint: &str,
        data: &Bound<'_, PyAny>,
        dtype: i32,
        shape: Vec<i64>,
    ) -> PyResult<String> {
        let buffer = PyBuffer::<u8>::get(data).map_err(|e| {
            GraphError::new_err(format!(
                "initializer {hint:?}: data is not a byte buffer: {e}"
            ))
        })?;
        if !buffer.is_c_contiguous() {
            return Err(GraphError::new_err(format!(
                "initializer {hint:?}: data is not contiguous"
            )));
        }
        let key = TiedKey {
            address: buffer.buf_ptr() as usize,
            len: buffer.len_bytes(),
            dtype,
            dims: shape.clone(),
        };
        // empty buffers may share an address without sharing anything
        let tied = (key.len > 0).then_some(key);
        self.model
            .graph
            .add_initializer(
                hint,
                dtype,
                shape,
                TensorData::Borrowed(Arc::new(BufferSource(buffer))),
                tied,
            )
            .map_err(py_err)
    }

    /// A weight whose `nbytes` bytes are not in host memory (a GPU tensor): `fetch()` returns a host
    /// copy of them (a contiguous buffer) and is called while the file is written, one tensor at a
    /// time. `address` (the tensor's device address) ties weights that share memory.
    fn add_fetched_initializer(
        &mut self,
        hint: &str,
        fetch: Py<PyAny>,
        nbytes: usize,
        dtype: i32,
        shape: Vec<i64>,
        address: usize,
    ) -> PyResult<String> {
        let tied = (nbytes > 0).then(|| TiedKey {
            address,
            len: nbytes,
            dtype,
            dims: shape.clone(),
        });
        self.model
            .graph
            .add_initializer(
                hint,
                dtype,
                shape,
                TensorData::Fetched {
                    fetch: Arc::new(PyFetch(fetch)),
                    len: nbytes,
                    permuted: None,
                },
                tied,
            )
            .map_err(py_err)
    }

    /// A weight without bytes (meta device): its place in the external data file is left empty.
    fn add_deferred_initializer(
        &mut self,
        hint: &str,
        dtype: i32,
        shape: Vec<i64>,
    ) -> PyResult<String> {
        self.model
            .graph
            .add_deferred_initializer(hint, dtype, shape)
            .map_err(py_err)
    }

    /// Points initializer `name` at `length` bytes at `offset` of `location` (a file beside the model,
    /// e.g. a safetensors shard): saved as external data there, nothing written. False (and nothing
    /// changed) when its bytes are not as stored (transposed, scaled, computed).
    fn reference_initializer(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        length: u64,
    ) -> PyResult<bool> {
        self.model
            .graph
            .reference_initializer(name, location, offset, length)
            .map_err(py_err)
    }

    /// Referenced tensors with `location` point into the file `path`: a save into another folder
    /// hard-links it beside the model.
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the path as an owned value
    fn set_reference_source(&mut self, location: &str, path: PathBuf) -> PyResult<()> {
        if location.is_empty() || location.contains('/') || location.contains('\\') {
            return Err(GraphError::new_err(format!(
                "{location:?} must be a plain file name beside the model"
            )));
        }
        self.model
            .reference_sources
            .insert(location.to_owned(), path);
        Ok(())
    }

    /// The initializer `name`, held in a checkpoint as float type `stored`, referenced there behind a
    /// Cast to its own type (`reference_initializer` when the types agree).
    fn reference_cast_initializer(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        stored: i32,
    ) -> PyResult<bool> {
        self.model
            .graph
            .reference_cast_initializer(name, location, offset, stored)
            .map_err(py_err)
    }

    /// The initializer `name` written from the elements of float type `stored` at `offset` of the file
    /// `path`, converted to its own type as they are written.
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the path as an owned value
    fn convert_initializer(
        &mut self,
        name: &str,
        path: PathBuf,
        offset: u64,
        stored: i32,
    ) -> PyResult<bool> {
        let file = std::fs::File::open(&path).map_err(|e| {
            GraphError::new_err(format!(
                "initializer {name:?}: cannot open {}: {e}",
                path.display()
            ))
        })?;
        self.model
            .graph
            .convert_initializer(name, file, offset, stored)
            .map_err(py_err)
    }

    /// Before `optimize(level)`: the products reading one of the Linear weights `names` through a
    /// Transpose read it as stored instead (Gemm / FusedMatMul with transB); returns how many.
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the list as an owned value
    fn read_weights_as_stored(&mut self, names: Vec<String>, level: &str) -> PyResult<usize> {
        let level: Level = level.parse().map_err(py_err)?;
        Ok(read_weights_as_stored(&mut self.model, &names, level))
    }

    fn set_metadata(&mut self, key: &str, value: &str) {
        self.model.metadata.insert(key.to_owned(), value.to_owned());
    }

    /// `GraphProto.metadata_props[key] = value`.
    fn set_graph_metadata(&mut self, key: &str, value: &str) {
        self.model
            .graph
            .metadata
            .insert(key.to_owned(), value.to_owned());
    }

    /// Adds `(key, value)` to the metadata of an input, output or initializer (a key it has stays).
    fn add_value_metadata(&mut self, name: &str, key: &str, value: &str) -> PyResult<()> {
        self.model
            .graph
            .add_value_metadata(name, key, value)
            .map_err(py_err)
    }

    /// Adds `values[i][k]` under `keys[k]` to the metadata of input or initializer `names[i]`, for
    /// every i (a key it has stays): the walker's value metadata in one call.
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands extracted arguments over by value
    fn add_values_metadata(
        &mut self,
        keys: Vec<String>,
        names: Vec<String>,
        values: Vec<Vec<String>>,
    ) -> PyResult<()> {
        if names.len() != values.len() || values.iter().any(|v| v.len() != keys.len()) {
            return Err(GraphError::new_err(format!(
                "add_values_metadata: {} names, {} value rows, {} keys per row expected",
                names.len(),
                values.len(),
                keys.len()
            )));
        }
        let rows = names
            .iter()
            .map(String::as_str)
            .zip(values.iter().map(Vec::as_slice));
        self.model
            .graph
            .add_values_metadata(&keys, rows)
            .map_err(py_err)
    }

    /// See `Graph::assign_scopes`: the nodes made from `starts[i]` on get scope `first + keys[i]`
    /// (`first + i` without `keys`), of scopes added bare; returns `first`.
    #[pyo3(signature = (starts, keys = None))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands extracted arguments over by value
    fn assign_scopes(&mut self, starts: Vec<u32>, keys: Option<Vec<u32>>) -> PyResult<u32> {
        let keys =
            keys.unwrap_or_else(|| (0..u32::try_from(starts.len()).unwrap_or(u32::MAX)).collect());
        self.model
            .graph
            .assign_scopes(&starts, &keys)
            .map_err(py_err)
    }

    /// A new scope (shared with subgraphs): node names `{prefix}/{op_type}`, `props` their
    /// `metadata_props` (none yet: see `set_scope_props`). Returns its index for `set_scope`.
    #[pyo3(signature = (prefix, props = Vec::new()))]
    fn add_scope(&mut self, prefix: String, props: Vec<(String, String)>) -> u32 {
        self.model.graph.scopes.add(Scope { prefix, props })
    }

    /// The scopes the nodes of the graph (its subgraphs and local functions included) are made in,
    /// ascending.
    fn used_scopes(&self) -> Vec<u32> {
        // local functions' bodies hold nodes of the same scope table
        let mut used = self.model.graph.used_scopes();
        for f in &self.model.functions {
            used.extend(f.graph.used_scopes());
        }
        used.sort_unstable();
        used.dedup();
        used
    }

    /// The builder's scope table, shared: its metadata can be composed while the builder optimizes
    /// (`optimize(alongside=...)`).
    fn scope_table(&self) -> ScopeTable {
        ScopeTable {
            scopes: self.model.graph.scopes.clone(),
        }
    }

    /// Adds a scope and makes the nodes added from now on in it, the walker's call per FX node of a
    /// subgraph (the top graph's are marked, then given their scopes by `assign_scopes`):
    /// its name prefix and metadata come later, through `scope_table()`, and the nodes' names from
    /// `name_nodes_by_scope`.
    fn enter_new_scope(&mut self) -> u32 {
        self.model.graph.enter_new_scope()
    }

    /// Names the nodes made in scopes `{prefix}/{op_type}`, unique in graph order (see
    /// `Model::name_nodes_by_scope`): once the passes are done and the prefixes set.
    fn name_nodes_by_scope(&mut self) {
        self.model.name_nodes_by_scope();
    }

    /// The scope of each top-graph node, in order (None: made outside any scope).
    fn node_scopes(&self) -> Vec<Option<u32>> {
        self.model.graph.nodes.iter().map(|n| n.scope).collect()
    }

    /// Nodes added from now on are made in scope `index` (None: op-type names, no metadata).
    #[pyo3(signature = (index))]
    fn set_scope(&mut self, index: Option<u32>) -> PyResult<()> {
        self.model.graph.set_scope(index).map_err(py_err)
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

    #[pyo3(signature = (name, dtype, shape))]
    fn set_type(
        &mut self,
        name: &str,
        dtype: Option<i32>,
        shape: Option<Vec<Option<DimArg>>>,
    ) -> PyResult<()> {
        self.model
            .graph
            .set_type(
                name,
                ValueType {
                    dtype,
                    shape: to_dims(shape),
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

    #[getter]
    fn num_initializers(&self) -> usize {
        self.model.graph.initializers.len()
    }

    fn input_names(&self) -> Vec<String> {
        self.model.graph.inputs.clone()
    }

    fn output_names(&self) -> Vec<String> {
        self.model.graph.outputs.clone()
    }

    /// `progress(stages_done, stages)` is called between stages (at most every 0.1 s); pending
    /// signals are handled there too, so a Ctrl-C stops the optimization between two passes.
    ///
    /// `alongside()`, when given, runs on a second thread (taking the GIL) while the passes run on this
    /// one (without it): fastonnx composes the node metadata there, through `scope_table()`, which
    /// then costs no wall time on a machine with a second core. Its exception, or one raised by a
    /// signal handler or `progress` while the passes run, stops them at the next stage and is raised
    /// once `alongside` has returned.
    #[pyo3(signature = (level, progress = None, alongside = None))]
    fn optimize(
        &mut self,
        py: Python<'_>,
        level: &str,
        progress: Option<Py<PyAny>>,
        alongside: Option<Py<PyAny>>,
    ) -> PyResult<BTreeMap<String, usize>> {
        let level: Level = level.parse().map_err(py_err)?;
        let model = &mut self.model;
        let mut watch = Watch::new(progress);
        let Some(alongside) = alongside else {
            return py
                .detach(|| optimize_model_with(model, level, &mut |d, t| watch.step(d, t)))
                .map_err(|e| watch.error(e));
        };
        // the passes stay on this thread, already running: a thread just made may wait for a core
        // (on a VM, for its virtual CPU to be woken), and the shorter work waiting costs less. The
        // watch first takes the GIL from `alongside` after its interval.
        watch.last = Some(Instant::now());
        let stop = AtomicBool::new(false);
        let (outcome, composed) = py.detach(|| {
            std::thread::scope(|s| {
                let composer = s.spawn(|| {
                    let composed = Python::attach(|py| alongside.call0(py).map(drop));
                    if composed.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    composed
                });
                let mut hook = |d: u64, t: u64| -> fastonnx_core::Result<()> {
                    if stop.load(Ordering::Relaxed) {
                        return Err(Error::Interrupted(
                            "a Python exception stopped the operation".to_owned(),
                        ));
                    }
                    watch.step(d, t)
                };
                let outcome = optimize_model_with(model, level, &mut hook);
                // `alongside` ends by itself (its Python cannot be stopped from here)
                let composed = composer.join().unwrap_or_else(|_| {
                    Err(GraphError::new_err(
                        "composing alongside the passes panicked: please report this model",
                    ))
                });
                (outcome, composed)
            })
        });
        // the exception of `alongside` first: the passes' error is then only that it stopped them
        composed?;
        let counts = outcome.map_err(|e| watch.error(e))?;
        Ok(counts)
    }

    /// Carves module instances out of the top graph as local functions (see `fastonnx.functions`):
    /// `paths[i]` lists the instances node `i` belongs to, outermost first; `instances[k]` is
    /// (domain, class name, scope of the call node, label). Returns (calls made, one message per
    /// instance left inline).
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the lists as owned values
    fn extract_functions(
        &mut self,
        paths: Vec<Vec<u32>>,
        instances: Vec<(String, String, Option<u32>, String)>,
    ) -> PyResult<(usize, Vec<String>)> {
        let instances: Vec<Instance> = instances
            .into_iter()
            .map(|(domain, class_name, scope, label)| Instance {
                domain,
                class_name,
                scope,
                label,
            })
            .collect();
        let carved = extract_functions(&mut self.model, paths, &instances).map_err(py_err)?;
        Ok((carved.calls, carved.inlined))
    }

    /// (domain, name, node count) of each local function.
    fn functions(&self) -> Vec<(String, String, usize)> {
        self.model
            .functions
            .iter()
            .map(|f| (f.domain.clone(), f.name.clone(), f.graph.nodes.len()))
            .collect()
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let model = &self.model;
        let bytes = py.detach(|| writer::to_bytes(model)).map_err(py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// `durable`: the files are flushed to the disk before the save returns. `progress(written,
    /// total)` is called with byte counts while writing (at most every 0.1 s); pending signals are
    /// handled there too, so a Ctrl-C stops the write, removes the temporaries and keeps the old files.
    #[pyo3(signature = (path, external_data = None, location = None, *, durable = false, progress = None))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the path as an owned value
    fn save<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        external_data: Option<bool>,
        location: Option<&str>,
        durable: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let model = &self.model;
        let options = writer::SaveOptions {
            external: external_data,
            location,
            durable,
        };
        let mut watch = Watch::new(progress);
        let info = py
            .detach(|| writer::save_with(model, &path, &options, &mut |d, t| watch.step(d, t)))
            .map_err(|e| watch.error(e))?;
        let d = PyDict::new(py);
        d.set_item("path", info.path.display().to_string())?;
        d.set_item("data_path", info.data_path.map(|p| p.display().to_string()))?;
        d.set_item("external_data", info.external_data)?;
        d.set_item("switched_to_external", info.switched_to_external)?;
        d.set_item("model_bytes", info.model_bytes)?;
        d.set_item("data_bytes", info.data_bytes)?;
        d.set_item("external_tensors", info.external_tensors)?;
        d.set_item("referenced_tensors", info.referenced_tensors)?;
        d.set_item("referenced_bytes", info.referenced_bytes)?;
        let linked: Vec<String> = info
            .linked
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        d.set_item("linked", linked)?;
        let swept: Vec<String> = info.swept.iter().map(|p| p.display().to_string()).collect();
        d.set_item("swept", swept)?;
        Ok(d)
    }
}

/// The scope table of a builder (`GraphBuilder.scope_table()`), shared with it: node metadata is
/// composed through it, also from Python while the builder optimizes on another thread.
#[pyclass(module = "fastonnx._core", frozen)]
struct ScopeTable {
    scopes: SharedScopes,
}

#[pymethods]
impl ScopeTable {
    /// Gives scope `index` the metadata `props` (its prefix stays).
    fn set_scope_props(&self, index: u32, props: Vec<(String, String)>) -> PyResult<()> {
        if self.scopes.set_props(index, props) {
            Ok(())
        } else {
            Err(GraphError::new_err(format!(
                "set_scope_props: there is no scope {index}"
            )))
        }
    }

    /// Gives scope `indices[i]` the name prefix `prefixes[i]` (their metadata stays).
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands extracted arguments over by value
    fn set_prefixes(&self, indices: Vec<u32>, prefixes: Vec<String>) -> PyResult<()> {
        if indices.len() != prefixes.len() {
            return Err(GraphError::new_err(format!(
                "set_prefixes: {} indices but {} prefixes",
                indices.len(),
                prefixes.len()
            )));
        }
        for (index, prefix) in indices.into_iter().zip(prefixes) {
            if !self.scopes.set_prefix(index, prefix) {
                return Err(GraphError::new_err(format!(
                    "set_prefixes: there is no scope {index}"
                )));
            }
        }
        Ok(())
    }

    /// Composes the metadata of FX-call scopes in bulk (see fx_scope.rs): scope `indices[i]` gets
    /// the metadata of the FX node `nodes[i]` under the module stack whose (namespace, class hierarchy
    /// head, name scopes head) are `levels[i]`, with the target's (str, repr, FX printer text)
    /// `targets[i]`. Parallel lists, not a tuple per node: nothing per node for the garbage collector.
    /// Returns the positions it left to the caller (an argument whose text must come from torch's
    /// printer), which then uses `set_scope_props`.
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands extracted arguments over by value
    fn compose_fx_scopes(
        &self,
        keys: [String; 5],
        indices: Vec<u32>,
        levels: &Bound<'_, PyList>,
        nodes: &Bound<'_, PyList>,
        targets: &Bound<'_, PyList>,
    ) -> PyResult<Vec<usize>> {
        let n = indices.len();
        if levels.len() != n || nodes.len() != n || targets.len() != n {
            return Err(GraphError::new_err(format!(
                "compose_fx_scopes: {n} indices but {} levels, {} nodes and {} targets",
                levels.len(),
                nodes.len(),
                targets.len()
            )));
        }
        let mut left = Vec::new();
        let (mut level_texts, mut target_texts) = (TupleTexts::default(), TupleTexts::default());
        for (position, &index) in indices.iter().enumerate() {
            let level = level_texts.get(&levels.get_item(position)?)?;
            let target = target_texts.get(&targets.get_item(position)?)?;
            match fx_scope::compose(&keys, &level, &nodes.get_item(position)?, &target)? {
                Some(props) => {
                    if !self.scopes.set_props(index, props) {
                        return Err(GraphError::new_err(format!(
                            "compose_fx_scopes: there is no scope {index}"
                        )));
                    }
                }
                None => left.push(position),
            }
        }
        Ok(left)
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FastOnnxError", py.get_type::<FastOnnxError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    m.add("ModelTooLargeError", py.get_type::<ModelTooLargeError>())?;
    m.add_class::<GraphBuilder>()?;
    m.add_class::<ScopeTable>()?;
    m.add_class::<TensorAttr>()?;
    Ok(())
}
