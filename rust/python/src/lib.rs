//! `fastonnx._core`: the pyclass wrappers around fastonnx-core and the error → exception mapping.
//! What the bindings do is adapt: Python objects to core values and back, the GIL around the core's
//! long operations, core errors to exceptions. The work (building, passes, threads, writing) is the
//! core's.
//!
//! `GraphBuilder`'s methods are spread over one `#[pymethods]` block per role (pyo3's
//! `multiple-pymethods` feature): `build` (values and nodes), `weights` (initializers and
//! references), `scopes` (scopes and metadata, with `ScopeTable`), `optimize` (local functions and
//! the passes), `save` (bytes and files); `watch` is the hook the long operations get. One block per
//! role keeps each method's signature, docstring and body together in the file of its role; a single
//! block delegating to per-role functions would have split every method in two places.

mod build;
mod fx_scope;
mod optimize;
mod quantize;
mod save;
mod scopes;
mod watch;
mod weights;

use fastonnx_core::{Error, Model};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;

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

fn py_err(e: Error) -> PyErr {
    match e {
        Error::Graph(m) => GraphError::new_err(m),
        Error::Serialization(m) => SerializationError::new_err(m),
        e @ Error::Io { .. } => SerializationError::new_err(e.to_string()),
        e @ Error::TooLarge { .. } => ModelTooLargeError::new_err(e.to_string()),
        Error::Interrupted(m) => PyKeyboardInterrupt::new_err(m),
    }
}

/// Holds one ONNX graph while it is built: names, types, shapes, nodes, initializers.
#[pyclass(module = "fastonnx._core")]
struct GraphBuilder {
    model: Model,
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
    m.add_class::<scopes::ScopeTable>()?;
    m.add_class::<build::TensorAttr>()?;
    Ok(())
}
