//! The graph being built: values with their types, nodes, initializers (the model around it is in
//! `model.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dtype;
use crate::error::{graph_err, Result};
use crate::names::NameTable;
use crate::scopes::{node_name_hint, Scope, SharedScopes};
use crate::tensor::{check_size, Tensor, TensorData};

/// One dimension of a value's shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(i64),
    /// A named symbol or an expression of symbols ("batch", "seq+1").
    Sym(String),
    Unknown,
}

/// What is known about a value: element type and shape (None: unknown rank); for a sequence of
/// tensors (ONNX's `seq(tensor)`, made by SequenceMap, SplitToSequence...) those of its elements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueType {
    pub dtype: Option<i32>,
    pub shape: Option<Vec<Dim>>,
    /// A sequence of tensors of this type rather than a tensor.
    pub sequence: bool,
}

#[derive(Debug, Clone)]
pub enum AttrValue {
    Int(i64),
    Float(f32),
    String(Vec<u8>),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<Vec<u8>>),
    Tensor(Tensor),
    Graph(Box<Graph>),
}

#[derive(Debug, Clone)]
pub struct Attribute {
    pub name: String,
    pub value: AttrValue,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: Vec<Attribute>,
    /// Index of the scope (the FX node) the node was made in: its metadata, see `scopes.rs`.
    pub scope: Option<u32>,
}

impl Node {
    pub fn attr(&self, name: &str) -> Option<&AttrValue> {
        self.attrs.iter().find(|a| a.name == name).map(|a| &a.value)
    }

    pub fn subgraphs(&self) -> impl Iterator<Item = &Graph> {
        self.attrs.iter().filter_map(|a| match &a.value {
            AttrValue::Graph(g) => Some(g.as_ref()),
            _ => None,
        })
    }
}

/// Key of a weight seen through its memory: the same bytes at the same address with the same
/// meaning are the same initializer (tied weights). `w` and `w[:3]` share an address, not a shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TiedKey {
    pub address: usize,
    pub len: usize,
    pub dtype: i32,
    pub dims: Vec<i64>,
}

type ConstKey = (i32, Vec<i64>, Vec<u8>);

/// Names are shared by a graph and its subgraphs: ONNX wants every name unique across scopes.
#[derive(Debug, Default, Clone)]
pub struct SharedNames {
    values: Arc<Mutex<NameTable>>,
    nodes: Arc<Mutex<NameTable>>,
}

fn lock(m: &Mutex<NameTable>) -> MutexGuard<'_, NameTable> {
    // A panic while holding the lock cannot leave the table half-updated in a harmful way.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SharedNames {
    pub fn unique_value(&self, hint: &str) -> String {
        lock(&self.values).unique(hint)
    }
    pub fn unique_node(&self, hint: &str) -> String {
        lock(&self.nodes).unique(hint)
    }
    pub fn is_value(&self, name: &str) -> bool {
        lock(&self.values).contains(name)
    }
    /// Replaces the node names taken with `table` (`Model::name_nodes_by_scope` names every node anew).
    pub(crate) fn set_node_names(&self, table: NameTable) {
        *lock(&self.nodes) = table;
    }
}

#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub nodes: Vec<Node>,
    pub initializers: Vec<Tensor>,
    pub types: HashMap<String, ValueType>,
    pub names: SharedNames,
    pub scopes: SharedScopes,
    /// `GraphProto.metadata_props`, in key order.
    pub metadata: BTreeMap<String, String>,
    /// `metadata_props` of inputs, outputs (`ValueInfoProto`) and initializers (`TensorProto`).
    pub value_metadata: HashMap<String, Vec<(String, String)>>,
    /// The attention-mask input of a decoder whose KV caches the runtime may hand in as buffers of
    /// the maximum length, shared with the present outputs (onnxruntime-genai's
    /// `past_present_share_buffer`): lengths then come from this mask, never from a cache's shape.
    /// Set by the package layer; the onnxruntime level then fuses attention over the caches into
    /// `com.microsoft.GroupQueryAttention` (`passes::attention::shared_cache`).
    pub shared_cache_mask: Option<String>,
    /// The most positions those shared caches hold (the package's context length): the rows of the
    /// cos / sin tables `GroupQueryAttention` rotates with (`passes::attention::gqa_rotary`).
    pub shared_cache_positions: Option<usize>,
    /// The sliding windows of those caches' layers, by past-key input name: the positions a query
    /// attends to, its own included (transformers' `sliding_window`), which the fused node takes as
    /// `local_window_size`. A layer absent here attends to its whole past.
    pub shared_cache_windows: HashMap<String, i64>,
    /// The bytes of small initializers written later from a file (deferred: a checkpoint's or the
    /// package's own tensors), handed in for the passes that read values (`set_known_values`); the
    /// writer still references the file.
    pub known_values: HashMap<String, Vec<u8>>,
    /// Initializers whose bytes are another initializer's, read in other dims (a tied embedding's
    /// 2-D view of its head's MatMulNBits codes): the writer points both at the same external data
    /// (`writer::plan`), and writes the bytes twice only where there is no data file to share.
    pub shared_bytes: HashMap<String, String>,
    /// The scope new nodes are made in (set per FX node by the walker).
    current_scope: Option<(u32, Arc<Scope>)>,
    init_index: HashMap<String, usize>,
    const_index: HashMap<ConstKey, String>,
    tied_index: HashMap<TiedKey, String>,
}

/// Constants up to this size are deduplicated by content.
const DEDUP_LIMIT: usize = 1 << 16;

impl Graph {
    pub fn new(name: &str) -> Self {
        Graph {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    /// An empty graph for a subgraph attribute (If / Loop / Scan body), sharing this graph's names.
    pub fn subgraph(&self, name: &str) -> Graph {
        Graph {
            name: name.to_owned(),
            names: self.names.clone(),
            scopes: self.scopes.clone(),
            ..Default::default()
        }
    }

    /// A fresh value name from `hint`, recorded with its type.
    pub(crate) fn new_value(&mut self, hint: &str, ty: ValueType) -> String {
        let name = self.names.unique_value(hint);
        self.types.insert(name.clone(), ty);
        name
    }

    /// True when `name` is a value of this graph or of an enclosing one.
    pub fn has_value(&self, name: &str) -> bool {
        self.types.contains_key(name) || self.names.is_value(name)
    }

    pub fn value_type(&self, name: &str) -> Option<&ValueType> {
        self.types.get(name)
    }

    pub fn is_initializer(&self, name: &str) -> bool {
        self.init_index.contains_key(name)
    }

    pub fn initializer(&self, name: &str) -> Option<&Tensor> {
        self.init_index.get(name).map(|&i| &self.initializers[i])
    }

    pub fn add_input(&mut self, name: &str, dtype: i32, shape: Option<Vec<Dim>>) -> String {
        let name = self.new_value(
            name,
            ValueType {
                dtype: Some(dtype),
                shape,
                sequence: false,
            },
        );
        self.inputs.push(name.clone());
        name
    }

    fn push_initializer(&mut self, name: String, dtype: i32, dims: Vec<i64>, data: TensorData) {
        let shape = Some(dims.iter().map(|&d| Dim::Fixed(d)).collect());
        self.types.insert(
            name.clone(),
            ValueType {
                dtype: Some(dtype),
                shape,
                sequence: false,
            },
        );
        self.init_index
            .insert(name.clone(), self.initializers.len());
        self.initializers.push(Tensor {
            name,
            dtype,
            dims,
            data,
        });
    }

    /// A weight whose bytes stay where they are. A second call with the same memory, dtype and shape
    /// returns the first initializer's name (tied weights are stored once).
    pub fn add_initializer(
        &mut self,
        hint: &str,
        dtype: i32,
        dims: Vec<i64>,
        data: TensorData,
        tied: Option<TiedKey>,
    ) -> Result<String> {
        check_size(&format!("initializer {hint:?}"), dtype, &dims, data.len())?;
        if let Some(key) = &tied {
            if let Some(existing) = self.tied_index.get(key) {
                return Ok(existing.clone());
            }
        }
        let name = self.names.unique_value(hint);
        self.push_initializer(name.clone(), dtype, dims, data);
        if let Some(key) = tied {
            self.tied_index.insert(key, name.clone());
        }
        Ok(name)
    }

    /// A weight whose bytes are not available (meta device): written as a hole in the data file.
    pub fn add_deferred_initializer(
        &mut self,
        hint: &str,
        dtype: i32,
        dims: Vec<i64>,
    ) -> Result<String> {
        let numel = dims.iter().product::<i64>().max(0) as usize;
        let len = dtype::data_len(dtype, numel).ok_or_else(|| {
            graph_err(format!(
                "initializer {hint:?}: element type {dtype} has no fixed size"
            ))
        })?;
        let name = self.names.unique_value(hint);
        self.push_initializer(name.clone(), dtype, dims, TensorData::Deferred { len });
        Ok(name)
    }

    pub fn has_deferred(&self) -> bool {
        self.initializers.iter().any(|t| t.data.is_deferred())
    }

    /// Whether some initializer's bytes are referenced in another file (see [`Graph::reference_initializer`]).
    pub fn has_referenced(&self) -> bool {
        self.initializers.iter().any(|t| t.data.is_referenced())
    }

    /// Points initializer `name` at `length` bytes at `offset` of the file `location` beside the model
    /// (a safetensors shard): the writer then references them instead of writing them. Only a weight
    /// whose bytes are as stored (borrowed memory or deferred, not transposed, scaled or computed) can
    /// be referenced: returns false and leaves the others as they are (they are written as usual).
    pub fn reference_initializer(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        length: u64,
    ) -> Result<bool> {
        let &i = self
            .init_index
            .get(name)
            .ok_or_else(|| graph_err(format!("no initializer named {name:?}")))?;
        let t = &mut self.initializers[i];
        if !matches!(
            t.data,
            TensorData::Borrowed(_)
                | TensorData::Fetched { permuted: None, .. }
                | TensorData::Deferred { .. }
                | TensorData::Referenced { .. }
        ) {
            return Ok(false);
        }
        if t.data.len() as u64 != length {
            return Err(graph_err(format!(
                "initializer {name:?} has {} bytes, {length} are referenced in {location:?}",
                t.data.len()
            )));
        }
        if location.is_empty() || location.contains('/') || location.contains('\\') {
            return Err(graph_err(format!(
                "initializer {name:?}: {location:?} must be a plain file name beside the model"
            )));
        }
        t.data = TensorData::Referenced {
            location: Arc::from(location),
            offset,
            len: t.data.len(),
        };
        Ok(true)
    }

    /// [`Graph::reference_initializer`] for a checkpoint holding initializer `name` as another float
    /// type `stored`: the referenced bytes become an initializer of that type and a `Cast` to the
    /// graph's type writes `name` (onnxruntime folds it when it loads the model). Returns false (and
    /// changes nothing) for an initializer whose bytes are not as stored, like `reference_initializer`.
    pub fn reference_cast_initializer(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        stored: i32,
    ) -> Result<bool> {
        let (dtype, dims) = self.stored_as(name, stored)?;
        let numel = dims.iter().product::<i64>().max(0) as usize;
        let len = dtype::data_len(stored, numel).unwrap_or(0) as u64;
        if dtype == stored {
            return self.reference_initializer(name, location, offset, len);
        }
        let Some(raw) = self.retype_as_stored(name, stored, &dims, len) else {
            return Ok(false);
        };
        let cast = self.cast_node(name, &raw, name, dtype, None);
        self.nodes.insert(0, cast);
        self.reference_initializer(&raw, location, offset, len)
    }

    /// Initializer `name` renamed to a fresh `{name}_stored` of float type `stored`, its `len` bytes
    /// deferred (to be referenced); None (nothing changed) where its bytes are not as stored.
    fn retype_as_stored(
        &mut self,
        name: &str,
        stored: i32,
        dims: &[i64],
        len: u64,
    ) -> Option<String> {
        let i = self.init_index[name];
        if !matches!(
            self.initializers[i].data,
            TensorData::Borrowed(_) | TensorData::Deferred { .. }
        ) {
            return None;
        }
        let raw = self.names.unique_value(&format!("{name}_stored"));
        self.types.insert(
            raw.clone(),
            ValueType {
                dtype: Some(stored),
                shape: Some(dims.iter().map(|d| Dim::Fixed(*d)).collect()),
                sequence: false,
            },
        );
        let t = &mut self.initializers[i];
        t.name.clone_from(&raw);
        t.dtype = stored;
        t.data = TensorData::Deferred { len: len as usize };
        self.retain_initializers(|_| true); // the index knows the new name
        Some(raw)
    }

    /// A `Cast` of `input` to type `to` writing `output`, named after `hint`.
    fn cast_node(
        &self,
        hint: &str,
        input: &str,
        output: &str,
        to: i32,
        scope: Option<u32>,
    ) -> Node {
        Node {
            name: self.names.unique_node(&format!("{hint}_cast")),
            op_type: "Cast".to_owned(),
            domain: String::new(),
            inputs: vec![input.to_owned()],
            outputs: vec![output.to_owned()],
            attrs: vec![Attribute {
                name: "to".to_owned(),
                value: AttrValue::Int(i64::from(to)),
            }],
            scope,
        }
    }

    /// Whether every reader of `name` is a (standard) `Gather` taking it as its data, in this graph's
    /// own nodes: none in a subgraph, none a graph output.
    pub fn gathered_only(&self, name: &str) -> bool {
        fn read_below(g: &Graph, name: &str) -> bool {
            g.nodes.iter().any(|n| {
                n.inputs.iter().any(|i| i == name) || n.subgraphs().any(|s| read_below(s, name))
            })
        }
        let mut any = false;
        for n in &self.nodes {
            if n.subgraphs().any(|s| read_below(s, name)) {
                return false;
            }
            for (k, i) in n.inputs.iter().enumerate() {
                if i == name {
                    if n.op_type != "Gather" || !n.domain.is_empty() || k != 0 {
                        return false;
                    }
                    any = true;
                }
            }
        }
        any && !self.outputs.iter().any(|o| o == name)
    }

    /// Initializer `name`, held in a checkpoint as float type `stored` and read only by `Gather`s
    /// (`gathered_only`: an embedding table), referenced there as stored with each Gather's rows cast
    /// to its own type after it: a table too large for onnxruntime to fold its Cast at load
    /// (checkpoints.py's `ORT_FOLD_LIMIT`) is neither cast at every run nor written converted (twice
    /// the bytes of a bf16 table). Returns false where it does not apply (then nothing changed).
    pub fn reference_gathered_cast(
        &mut self,
        name: &str,
        location: &str,
        offset: u64,
        stored: i32,
    ) -> Result<bool> {
        let (dtype, dims) = self.stored_as(name, stored)?;
        if dtype == stored || !self.gathered_only(name) {
            return Ok(false);
        }
        let numel = dims.iter().product::<i64>().max(0) as usize;
        let len = dtype::data_len(stored, numel).unwrap_or(0) as u64;
        let Some(raw) = self.retype_as_stored(name, stored, &dims, len) else {
            return Ok(false);
        };
        let mut i = 0;
        while i < self.nodes.len() {
            if self.nodes[i].op_type == "Gather"
                && self.nodes[i].inputs.first().is_some_and(|x| x == name)
            {
                let out = self.nodes[i].outputs[0].clone();
                let ty = ValueType {
                    dtype: Some(stored),
                    shape: self.types.get(&out).and_then(|t| t.shape.clone()),
                    sequence: false,
                };
                let rows = self.new_value(&format!("{out}_stored"), ty);
                self.nodes[i].inputs[0].clone_from(&raw);
                self.nodes[i].outputs[0].clone_from(&rows);
                let after = self.cast_node(&out, &rows, &out, dtype, self.nodes[i].scope);
                self.nodes.insert(i + 1, after);
                i += 1;
            }
            i += 1;
        }
        self.types.remove(name);
        self.reference_initializer(&raw, location, offset, len)
    }

    /// Initializer `name` (of float type) written from `count` elements of float type `stored` at
    /// `offset` of `file` (a checkpoint shard), converted as they are written (see
    /// [`TensorData::Converted`]). Returns false for an initializer whose bytes are not as stored.
    pub fn convert_initializer(
        &mut self,
        name: &str,
        file: std::fs::File,
        offset: u64,
        stored: i32,
    ) -> Result<bool> {
        let (dtype, dims) = self.stored_as(name, stored)?;
        let i = self.init_index[name];
        let t = &mut self.initializers[i];
        if !matches!(
            t.data,
            TensorData::Borrowed(_) | TensorData::Deferred { .. }
        ) {
            return Ok(false);
        }
        t.data = TensorData::Converted {
            file: Arc::new(file),
            offset,
            count: dims.iter().product::<i64>().max(0) as usize,
            from: stored,
            to: dtype,
        };
        Ok(true)
    }

    /// The type and dims of initializer `name`, checked convertible from `stored`.
    fn stored_as(&self, name: &str, stored: i32) -> Result<(i32, Vec<i64>)> {
        let &i = self
            .init_index
            .get(name)
            .ok_or_else(|| graph_err(format!("no initializer named {name:?}")))?;
        let t = &self.initializers[i];
        if t.dtype != stored && !crate::tensor::convertible(stored, t.dtype) {
            return Err(graph_err(format!(
                "initializer {name:?} is {}: no conversion from {}",
                dtype::name(t.dtype),
                dtype::name(stored)
            )));
        }
        Ok((t.dtype, t.dims.clone()))
    }

    /// A small constant, stored once per (dtype, shape, bytes).
    pub fn add_constant(
        &mut self,
        hint: &str,
        dtype: i32,
        dims: Vec<i64>,
        data: Vec<u8>,
    ) -> Result<String> {
        check_size(&format!("constant {hint:?}"), dtype, &dims, data.len())?;
        if data.len() > DEDUP_LIMIT {
            let name = self.names.unique_value(hint);
            self.push_initializer(name.clone(), dtype, dims, TensorData::Owned(data));
            return Ok(name);
        }
        let key = (dtype, dims, data);
        if let Some(existing) = self.const_index.get(&key) {
            return Ok(existing.clone());
        }
        let name = self.names.unique_value(hint);
        self.push_initializer(
            name.clone(),
            key.0,
            key.1.clone(),
            TensorData::Owned(key.2.clone()),
        );
        self.const_index.insert(key, name.clone());
        Ok(name)
    }

    /// Bytes of an owned constant (None for weights, inputs and computed values).
    pub fn constant_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.initializer(name)?;
        match &t.data {
            TensorData::Owned(v) => Some(v),
            _ => None,
        }
    }

    /// Adds a node. `outputs` are name hints (requested names kept when free). Returns output names.
    pub fn add_node(
        &mut self,
        op_type: &str,
        domain: &str,
        inputs: Vec<String>,
        outputs: &[String],
        attrs: Vec<Attribute>,
        name: Option<&str>,
    ) -> Result<Vec<String>> {
        if op_type.is_empty() {
            return Err(graph_err("a node needs an op_type"));
        }
        for (i, input) in inputs.iter().enumerate() {
            if !input.is_empty() && !self.has_value(input) {
                return Err(graph_err(format!(
                    "input {i} of {op_type} is {input:?}, which is not a value of the graph"
                )));
            }
        }
        for (i, a) in attrs.iter().enumerate() {
            if attrs[..i].iter().any(|b| b.name == a.name) {
                return Err(graph_err(format!(
                    "{op_type} has the attribute {:?} twice",
                    a.name
                )));
            }
        }
        let input_types: Vec<Option<i32>> = inputs
            .iter()
            .map(|n| self.types.get(n).and_then(|t| t.dtype))
            .collect();
        let dt = infer_dtype(op_type, domain, &input_types, &attrs);
        let out_names: Vec<String> = outputs
            .iter()
            .enumerate()
            .map(|(i, hint)| {
                if hint.is_empty() {
                    return String::new(); // an omitted optional output
                }
                let ty = ValueType {
                    dtype: if i == 0 { dt } else { None },
                    shape: None,
                    sequence: false,
                };
                self.new_value(hint, ty)
            })
            .collect();
        let scope = self.current_scope.as_ref();
        let node_name = match name {
            Some(n) => self.names.unique_node(n),
            None => self
                .names
                .unique_node(&node_name_hint(scope.map(|s| s.1.as_ref()), op_type)),
        };
        let scope = scope.map(|s| s.0);
        self.nodes.push(Node {
            name: node_name,
            op_type: op_type.to_owned(),
            domain: domain.to_owned(),
            inputs,
            outputs: out_names.clone(),
            attrs,
            scope,
        });
        Ok(out_names)
    }

    /// The scopes the nodes of this graph and of its subgraphs are made in, ascending, each once.
    pub fn used_scopes(&self) -> Vec<u32> {
        fn collect(g: &Graph, out: &mut Vec<u32>) {
            for n in &g.nodes {
                out.extend(n.scope);
                for sub in n.subgraphs() {
                    collect(sub, out);
                }
            }
        }
        let mut out = Vec::new();
        collect(self, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Nodes added from now on are made in scope `index` (None: no scope, names are op types).
    pub fn set_scope(&mut self, index: Option<u32>) -> Result<()> {
        self.current_scope = match index {
            None => None,
            Some(i) => Some((
                i,
                self.scopes
                    .get(i)
                    .ok_or_else(|| graph_err(format!("set_scope: there is no scope {i}")))?,
            )),
        };
        Ok(())
    }

    /// Gives the nodes made from `starts[i]` on (up to the next start; the last up to the end) that have
    /// no scope the scope `first + keys[i]`, of `max(keys) + 1` scopes added bare (prefix and metadata
    /// come later, as for `enter_new_scope`); returns `first`. The walker marks where each FX node's
    /// nodes start (a list append, no call) and assigns the scopes once the top graph is walked:
    /// entering a scope per FX node cost ~0.4 us each (issue 13). A key seen again (an FX node whose
    /// nodes came in two runs) names the same scope.
    pub fn assign_scopes(&mut self, starts: &[u32], keys: &[u32]) -> Result<u32> {
        if starts.len() != keys.len() {
            return Err(graph_err(format!(
                "assign_scopes: {} starts but {} keys",
                starts.len(),
                keys.len()
            )));
        }
        let n = self.nodes.len();
        if starts.windows(2).any(|w| w[0] > w[1]) || starts.last().is_some_and(|&s| s as usize > n)
        {
            return Err(graph_err(format!(
                "assign_scopes: the starts must ascend, up to the {n} nodes made"
            )));
        }
        let count = keys.iter().max().map_or(0, |&k| k as usize + 1);
        let first = self.scopes.add_bare(count);
        let ends = starts.iter().skip(1).map(|&s| s as usize).chain([n]);
        for ((&start, end), &key) in starts.iter().zip(ends).zip(keys) {
            for node in &mut self.nodes[start as usize..end] {
                if node.scope.is_none() {
                    node.scope = Some(first + key);
                }
            }
        }
        Ok(first)
    }

    /// Adds a scope without prefix or metadata (both come later: `SharedScopes::set_prefix` and
    /// `set_props`, then `Model::name_nodes_by_scope`) and makes the nodes added from now on in it;
    /// returns its index. The walker's call per FX node of a subgraph (the top graph's FX nodes are
    /// marked, their scopes given at the end: `assign_scopes`).
    pub fn enter_new_scope(&mut self) -> u32 {
        let scope = Arc::new(Scope::default());
        let index = self.scopes.add_shared(Arc::clone(&scope));
        self.current_scope = Some((index, scope));
        index
    }

    /// `add_value_metadata` of `keys[k]` and `values[k]` for every `(name, values)` of `rows`: the name
    /// checked and its entry found once per row.
    pub fn add_values_metadata<'a>(
        &mut self,
        keys: &[String],
        rows: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> Result<()> {
        for (name, values) in rows {
            if values.len() != keys.len() {
                return Err(graph_err(format!(
                    "value metadata of {name:?}: {} values for {} keys",
                    values.len(),
                    keys.len()
                )));
            }
            if !self.has_value(name) {
                return Err(graph_err(format!(
                    "value metadata {:?}: {name:?} is not a value of the graph",
                    keys.first().map_or("", String::as_str)
                )));
            }
            let props = match self.value_metadata.get_mut(name) {
                Some(props) => props,
                None => self.value_metadata.entry(name.to_owned()).or_default(),
            };
            for (key, value) in keys.iter().zip(values) {
                if !props.iter().any(|(k, _)| k == key) {
                    props.push((key.clone(), value.clone()));
                }
            }
        }
        Ok(())
    }

    /// Adds `(key, value)` to the `metadata_props` of the input, output or initializer `name`; a key it
    /// already has keeps its first value (a tied weight keeps the metadata of its first name).
    pub fn add_value_metadata(&mut self, name: &str, key: &str, value: &str) -> Result<()> {
        let values = [value.to_owned()];
        self.add_values_metadata(&[key.to_owned()], [(name, &values[..])])
    }

    pub fn set_type(&mut self, name: &str, ty: ValueType) -> Result<()> {
        match self.types.get_mut(name) {
            Some(t) => {
                if self.init_index.contains_key(name) {
                    // an initializer's type is its tensor's; keep it
                    return Ok(());
                }
                *t = ty;
                Ok(())
            }
            None => Err(graph_err(format!(
                "set_type: {name:?} is not a value of this graph"
            ))),
        }
    }

    /// Marks `value` as a graph output named `name` (or its own name). The value is renamed when that
    /// is free and safe; otherwise an Identity node carries it. Returns the output's name.
    pub fn add_output(&mut self, value: &str, name: Option<&str>) -> Result<String> {
        if !self.has_value(value) {
            return Err(graph_err(format!(
                "output {value:?} is not a value of the graph"
            )));
        }
        let produced_here = !self.inputs.iter().any(|i| i == value)
            && !self.is_initializer(value)
            && !self.outputs.iter().any(|o| o == value)
            && self.types.contains_key(value);
        let wanted = name.unwrap_or(value);
        if wanted == value && produced_here {
            self.outputs.push(value.to_owned());
            return Ok(value.to_owned());
        }
        let ty = self.types.get(value).cloned().unwrap_or_default();
        if produced_here && !self.names.is_value(wanted) {
            let new = self.names.unique_value(wanted);
            self.rename(value, &new);
            self.types.insert(new.clone(), ty);
            self.types.remove(value);
            self.outputs.push(new.clone());
            return Ok(new);
        }
        let out = self.add_node(
            "Identity",
            "",
            vec![value.to_owned()],
            &[wanted.to_owned()],
            vec![],
            None,
        )?;
        let out_name = out.into_iter().next().unwrap_or_default();
        self.types.insert(out_name.clone(), ty);
        self.outputs.push(out_name.clone());
        Ok(out_name)
    }

    /// Renames a value everywhere it is produced or read, subgraphs included.
    pub fn rename(&mut self, old: &str, new: &str) {
        rename_in(&mut self.nodes, old, new);
        if let Some(props) = self.value_metadata.remove(old) {
            self.value_metadata.insert(new.to_owned(), props);
        }
        for o in &mut self.outputs {
            if o == old {
                *o = new.to_owned();
            }
        }
    }

    /// Adds an initializer computed by a pass under a name already reserved (a folded node's output).
    pub(crate) fn insert_initializer(&mut self, t: Tensor) {
        self.push_initializer(t.name.clone(), t.dtype, t.dims, t.data);
    }

    /// Rebuilds the lookup tables after a pass removed initializers.
    pub(crate) fn retain_initializers(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.initializers.len();
        self.initializers.retain(|t| keep(&t.name));
        self.init_index = self
            .initializers
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let index = &self.init_index;
        self.const_index.retain(|_, n| index.contains_key(n));
        self.tied_index.retain(|_, n| index.contains_key(n));
        before - self.initializers.len()
    }
}

pub(crate) fn rename_in(nodes: &mut [Node], old: &str, new: &str) {
    for node in nodes.iter_mut() {
        for name in node.inputs.iter_mut().chain(node.outputs.iter_mut()) {
            if name == old {
                *name = new.to_owned();
            }
        }
        for a in &mut node.attrs {
            if let AttrValue::Graph(g) = &mut a.value {
                g.rename(old, new);
            }
        }
    }
}

/// The element type of a node's first output when the op makes it obvious; the interpreter sets
/// the real type from torch's metadata afterwards. Used by converters to skip needless Casts.
fn infer_dtype(
    op_type: &str,
    domain: &str,
    inputs: &[Option<i32>],
    attrs: &[Attribute],
) -> Option<i32> {
    if !domain.is_empty() {
        return None;
    }
    let first = || inputs.first().copied().flatten();
    match op_type {
        "Cast" => match attrs.iter().find(|a| a.name == "to").map(|a| &a.value) {
            Some(AttrValue::Int(t)) => i32::try_from(*t).ok(),
            _ => None,
        },
        "CastLike" => inputs.get(1).copied().flatten(),
        "Shape" | "Size" | "ArgMax" | "ArgMin" | "NonZero" => Some(dtype::INT64),
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Not" | "And" | "Or"
        | "Xor" | "IsNaN" | "IsInf" => Some(dtype::BOOL),
        "ConstantOfShape" => match attrs.iter().find(|a| a.name == "value").map(|a| &a.value) {
            Some(AttrValue::Tensor(t)) => Some(t.dtype),
            _ => Some(dtype::FLOAT),
        },
        "Where" => inputs.get(1).copied().flatten(),
        "Range" | "Add" | "Sub" | "Mul" | "Div" | "Neg" | "Abs" | "Relu" | "Sigmoid" | "Tanh"
        | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Pow" | "Erf" | "Sin" | "Cos" | "Softmax"
        | "LogSoftmax" | "MatMul" | "Gemm" | "Conv" | "ConvTranspose" | "MaxPool"
        | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" | "BatchNormalization"
        | "LayerNormalization" | "Reshape" | "Transpose" | "Unsqueeze" | "Squeeze" | "Flatten"
        | "Concat" | "Slice" | "Gather" | "GatherElements" | "GatherND" | "Expand" | "Tile"
        | "Identity" | "Split" | "Min" | "Max" | "Clip" | "ReduceSum" | "ReduceMean"
        | "ReduceMax" | "ReduceMin" | "ReduceProd" | "Floor" | "Ceil" | "Round" | "Mod" | "Pad"
        | "Trilu" | "CumSum" | "ScatterElements" | "ScatterND" | "Sign" | "Einsum" | "Resize"
        | "TopK" | "Softplus" | "Elu" | "Selu" | "Celu" | "LeakyRelu" | "HardSigmoid"
        | "HardSwish" | "Gelu" | "Mish" | "PRelu" | "Softsign" | "Erfc" | "BitShift"
        | "DepthToSpace" | "SpaceToDepth" => first(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn constants_are_deduplicated_by_content() {
        let mut g = Graph::new("g");
        let a = g
            .add_constant("c", dtype::FLOAT, vec![2], f32_bytes(&[1.0, 2.0]))
            .expect("a");
        let b = g
            .add_constant("c", dtype::FLOAT, vec![2], f32_bytes(&[1.0, 2.0]))
            .expect("b");
        let c = g
            .add_constant("c", dtype::FLOAT, vec![1, 2], f32_bytes(&[1.0, 2.0]))
            .expect("c");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(g.initializers.len(), 2);
    }

    #[test]
    fn tied_weights_are_stored_once() {
        let mut g = Graph::new("g");
        let key = |dims: Vec<i64>, len| TiedKey {
            address: 4096,
            len,
            dtype: dtype::FLOAT,
            dims,
        };
        let data = || TensorData::Owned(vec![0; 24]);
        let a = g
            .add_initializer(
                "w",
                dtype::FLOAT,
                vec![2, 3],
                data(),
                Some(key(vec![2, 3], 24)),
            )
            .expect("a");
        let b = g
            .add_initializer(
                "w",
                dtype::FLOAT,
                vec![2, 3],
                data(),
                Some(key(vec![2, 3], 24)),
            )
            .expect("b");
        let c = g
            .add_initializer("w", dtype::FLOAT, vec![6], data(), Some(key(vec![6], 24)))
            .expect("c");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(g.initializers.len(), 2);
    }

    #[test]
    fn wrong_sizes_and_unknown_inputs_are_errors() {
        let mut g = Graph::new("g");
        let err = g
            .add_constant("c", dtype::FLOAT, vec![3], vec![0; 8])
            .expect_err("size");
        assert!(err.to_string().contains("12 bytes expected"), "{err}");
        let err = g
            .add_node("Relu", "", vec!["nope".into()], &["y".into()], vec![], None)
            .expect_err("unknown input");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn types_are_tracked_and_inferred() {
        let mut g = Graph::new("g");
        let x = g.add_input(
            "x",
            dtype::FLOAT16,
            Some(vec![Dim::Sym("batch".into()), Dim::Fixed(4)]),
        );
        let y = g
            .add_node("Relu", "", vec![x.clone()], &["y".into()], vec![], None)
            .expect("relu");
        assert_eq!(
            g.value_type(&y[0]).and_then(|t| t.dtype),
            Some(dtype::FLOAT16)
        );
        let s = g
            .add_node("Shape", "", vec![x.clone()], &["s".into()], vec![], None)
            .expect("shape");
        assert_eq!(
            g.value_type(&s[0]).and_then(|t| t.dtype),
            Some(dtype::INT64)
        );
        let t = g.value_type(&x).cloned().expect("x");
        assert_eq!(t.shape.expect("shape")[0], Dim::Sym("batch".into()));
    }

    #[test]
    fn outputs_rename_or_use_identity() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let y = g
            .add_node("Relu", "", vec![x.clone()], &["relu".into()], vec![], None)
            .expect("relu");
        let z = g
            .add_node("Neg", "", vec![y[0].clone()], &["neg".into()], vec![], None)
            .expect("neg");
        assert_eq!(g.add_output(&y[0], Some("out")).expect("out"), "out");
        assert_eq!(g.nodes[1].inputs[0], "out", "readers follow the rename");
        // an input returned as output, and the same value twice, go through Identity
        let a = g.add_output(&x, Some("x")).expect("x out");
        assert_eq!(a, "x_1");
        let b = g.add_output("out", None).expect("twice");
        assert_ne!(b, "out");
        assert_eq!(g.add_output(&z[0], None).expect("neg"), "neg");
        assert_eq!(g.outputs, vec!["out", "x_1", b.as_str(), "neg"]);
    }

    #[test]
    fn subgraphs_share_names() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let mut body = g.subgraph("body");
        let y = body
            .add_node("Relu", "", vec![x.clone()], &["x".into()], vec![], None)
            .expect("outer read");
        assert_eq!(y[0], "x_1");
    }

    #[test]
    fn used_scopes_count_subgraph_nodes_once_each() {
        use crate::scopes::Scope;
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let s: Vec<u32> = (0..4).map(|_| g.scopes.add(Scope::default())).collect();
        let mut body = g.subgraph("body");
        body.set_scope(Some(s[3])).expect("scope");
        body.add_node("Relu", "", vec![x.clone()], &["r".into()], vec![], None)
            .expect("body node");
        g.set_scope(Some(s[1])).expect("scope");
        let attrs = vec![Attribute {
            name: "body".into(),
            value: AttrValue::Graph(Box::new(body)),
        }];
        g.add_node("Loop", "", vec![x.clone()], &["l".into()], attrs, None)
            .expect("loop");
        g.add_node("Neg", "", vec![x], &["n".into()], vec![], None)
            .expect("neg");
        assert_eq!(g.used_scopes(), vec![s[1], s[3]]);
    }

    #[test]
    fn assigned_scopes_follow_the_marks_and_keep_scopes_already_set() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let add = |g: &mut Graph, op: &str| {
            g.add_node(op, "", vec![x.clone()], &[], vec![], None)
                .expect("node");
        };
        add(&mut g, "Neg"); // before the first mark: no scope
        let entered = g.enter_new_scope();
        add(&mut g, "Abs"); // entered: keeps its scope
        g.set_scope(None).expect("none");
        add(&mut g, "Relu");
        add(&mut g, "Sin");
        add(&mut g, "Cos"); // marked again with the first key
        let first = g.assign_scopes(&[1, 3, 4], &[0, 1, 0]).expect("assign");
        let scopes: Vec<Option<u32>> = g.nodes.iter().map(|n| n.scope).collect();
        assert_eq!(
            scopes,
            [
                None,
                Some(entered),
                Some(first),
                Some(first + 1),
                Some(first)
            ]
        );
        assert_eq!(g.scopes.len(), first as usize + 2, "one scope per key");
        assert!(g.assign_scopes(&[0], &[0, 1]).is_err(), "lengths differ");
        assert!(g.assign_scopes(&[3, 2], &[0, 1]).is_err(), "starts descend");
        assert!(g.assign_scopes(&[6], &[0]).is_err(), "past the nodes");
        assert_eq!(g.assign_scopes(&[], &[]).expect("nothing"), first + 2);
    }
}
