//! Initializers (weights): borrowed from a Python buffer, fetched from a device, deferred (meta
//! device), referenced in a checkpoint shard or converted from it as the file is written.

use std::path::PathBuf;
use std::sync::Arc;

use fastonnx_core::{ByteSource, Fetch, TensorData, TiedKey};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::{py_err, GraphBuilder, GraphError};

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

#[pymethods]
impl GraphBuilder {
    fn has_initializer(&self, name: &str) -> bool {
        self.model.graph.is_initializer(name)
    }

    #[getter]
    fn num_initializers(&self) -> usize {
        self.model.graph.initializers.len()
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

    /// The initializer `name`, held in a checkpoint as float type `stored` and read only by Gathers,
    /// referenced there as stored with the gathered rows cast (false where that does not apply).
    fn reference_gathered_cast(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        stored: i32,
    ) -> PyResult<bool> {
        self.model
            .graph
            .reference_gathered_cast(name, location, offset, stored)
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
}
