//! What changes the built graph as a whole: local functions carved out, Linear weights read as
//! stored, the optimization passes. The threads and the stop of `optimize(alongside=...)` are the
//! core's (`passes::optimize_model_alongside`); this file only adapts the GIL: released while the
//! passes run, taken by `alongside` on its thread and by the watch between stages.

use std::collections::{BTreeMap, HashMap};

use fastonnx_core::functions::{extract_functions, Instance};
use fastonnx_core::hook::Outcomes;
use fastonnx_core::passes::{
    optimize_model_alongside, optimize_model_with, read_weights_as_stored, Level,
};
use pyo3::prelude::*;

use crate::watch::Watch;
use crate::{py_err, GraphBuilder, GraphError};

#[pymethods]
impl GraphBuilder {
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

    /// Before `optimize(level)`: the products reading one of the Linear weights `names` through a
    /// Transpose read it as stored instead (Gemm / FusedMatMul with transB); returns how many.
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the list as an owned value
    fn read_weights_as_stored(&mut self, names: Vec<String>, level: &str) -> PyResult<usize> {
        let level: Level = level.parse().map_err(py_err)?;
        Ok(read_weights_as_stored(&mut self.model, &names, level))
    }

    /// Before `optimize("onnxruntime")`: names the attention-mask input of a decoder whose KV caches
    /// the runtime may share with the present outputs (onnxruntime-genai's
    /// `past_present_share_buffer`); attention over those caches is then fused into
    /// `com.microsoft.GroupQueryAttention`, lengths taken from the mask.
    fn set_shared_cache_mask(&mut self, name: &str) {
        self.model.graph.shared_cache_mask = Some(name.to_owned());
    }

    /// With `set_shared_cache_mask`: the most positions the shared caches hold (the package's context
    /// length), the rows of the cos / sin tables GroupQueryAttention then rotates with itself.
    fn set_shared_cache_positions(&mut self, positions: usize) {
        self.model.graph.shared_cache_positions = Some(positions);
    }

    /// With `set_shared_cache_mask`: the sliding window of each layer that has one, by its past-key
    /// input's name (the positions a query attends to, its own included); the fused node of that
    /// layer applies it (`local_window_size`).
    fn set_shared_cache_windows(&mut self, windows: HashMap<String, u32>) {
        self.model.graph.shared_cache_windows = windows
            .into_iter()
            .map(|(name, w)| (name, i64::from(w)))
            .collect();
    }

    /// Before `optimize`: the bytes of a small initializer the writer takes from a file later, for the
    /// passes that read values (the rotary frequencies GroupQueryAttention's tables are made from).
    fn set_known_values(&mut self, name: &str, data: Vec<u8>) {
        self.model.graph.known_values.insert(name.to_owned(), data);
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
        // the watch first takes the GIL from `alongside` after its interval
        watch.wait_an_interval();
        let compose = || Python::attach(|py| alongside.call0(py).map(drop));
        let Outcomes { work, beside } = py.detach(|| {
            optimize_model_alongside(model, level, &mut |d, t| watch.step(d, t), compose)
        });
        // the exception of `alongside` first: the passes' error is then only that it stopped them
        beside.unwrap_or_else(|| {
            Err(GraphError::new_err(
                "composing alongside the passes panicked: please report this model",
            ))
        })?;
        let counts = work.map_err(|e| watch.error(e))?;
        Ok(counts)
    }
}
