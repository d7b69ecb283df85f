//! Writing: the model as bytes, or saved to a file (atomically, weights inline or external) with
//! progress and Ctrl-C through the watch.

use std::path::PathBuf;

use fastonnx_core::writer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::watch::Watch;
use crate::{py_err, GraphBuilder};

#[pymethods]
impl GraphBuilder {
    /// Whether `to_bytes` and `save` write `value_info` (the type of every intermediate value, the
    /// builder's or inferred, subgraphs included); False for a new builder.
    #[getter]
    fn value_info(&self) -> bool {
        self.model.value_info
    }

    #[setter]
    fn set_value_info(&mut self, value: bool) {
        self.model.value_info = value;
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
