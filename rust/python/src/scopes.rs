//! Scopes and metadata: the scope table (one entry per FX node: node-name prefix and
//! `metadata_props`), the nodes' scopes, and model, graph and value metadata. `ScopeTable` shares the
//! table with Python, which composes the metadata through it while the passes run.

use fastonnx_core::{Scope, SharedScopes};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::fx_scope::{self, TupleTexts};
use crate::{py_err, GraphBuilder, GraphError};

#[pymethods]
impl GraphBuilder {
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
}

/// The scope table of a builder (`GraphBuilder.scope_table()`), shared with it: node metadata is
/// composed through it, also from Python while the builder optimizes on another thread.
#[pyclass(module = "fastonnx._core", frozen)]
pub(crate) struct ScopeTable {
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
