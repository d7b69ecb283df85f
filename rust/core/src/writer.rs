//! Serialization. Everything but the weights' bytes is encoded with prost; the weights are written
//! straight from their borrowed memory after length-prefixed headers, so a model is never assembled
//! in memory. Files are written to temporary names in the target folder and renamed at the end, the
//! `.onnx` last, so that a failed or interrupted save never leaves a model pointing at wrong data.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::error::{io_err, Error, Result};
use crate::functions::function_opsets;
use crate::graph::{AttrValue, Dim, Graph, Node, ValueType};
use crate::hook::Hook;
use crate::model::{Function, Model};
use crate::prefetch::{with_prefetch, Prefetched};
use crate::proto::onnx;
use crate::scopes::Scope;
use crate::temp::{self, TempFile};
use crate::tensor::{Tensor, TensorData};

/// Protobuf messages must stay under 2 GiB (readers use signed 32-bit sizes).
pub const PROTOBUF_LIMIT: u64 = (1 << 31) - 1;
/// Tensors at least this large go to the data file when external data is used.
pub const EXTERNAL_MIN_BYTES: usize = 1024;
/// Offsets of external tensors over 1 MiB are aligned to 64 KiB (mmap-friendly on every platform).
pub const ALIGN_LARGE: u64 = 1 << 16;
pub const ALIGN_SMALL: u64 = 64;
const LARGE_TENSOR: u64 = 1 << 20;

const GRAPH_TAG: u32 = 7; // ModelProto.graph
const INITIALIZER_TAG: u32 = 5; // GraphProto.initializer
const RAW_DATA_TAG: u32 = 9; // TensorProto.raw_data

const DEFERRED_INLINE: &str =
    "the model has weights on the meta device (no bytes yet): it can only be \
     saved with external data, whose holes fastonnx.attach_weights fills later";
const REFERENCED_INLINE: &str =
    "the model references weights in other files (safetensors shards): it can only be \
     saved with external data";

/// What a save wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveInfo {
    pub path: PathBuf,
    pub data_path: Option<PathBuf>,
    pub external_data: bool,
    pub switched_to_external: bool,
    pub model_bytes: u64,
    pub data_bytes: u64,
    pub external_tensors: usize,
    /// Tensors whose external data points into other files (not written), and their bytes.
    pub referenced_tensors: usize,
    pub referenced_bytes: u64,
    /// Temporaries of killed processes that were removed from the folder before writing.
    pub swept: Vec<PathBuf>,
    /// Files referenced tensors point into, hard-linked beside the model by this save.
    pub linked: Vec<PathBuf>,
}

// ---- prost conversions --------------------------------------------------------------------------

fn type_proto(ty: &ValueType) -> onnx::TypeProto {
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
    onnx::TypeProto {
        value: Some(onnx::type_proto::Value::TensorType(
            onnx::type_proto::Tensor {
                elem_type: ty.dtype,
                shape,
            },
        )),
        denotation: None,
    }
}

fn value_info(graph: &Graph, name: &str) -> Result<onnx::ValueInfoProto> {
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

fn entries<'a>(
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
fn value_metadata(graph: &Graph, name: &str) -> Vec<onnx::StringStringEntryProto> {
    graph
        .value_metadata
        .get(name)
        .map(|props| entries(props.iter().map(|(k, v)| (k, v))))
        .unwrap_or_default()
}

fn tensor_header(t: &Tensor) -> onnx::TensorProto {
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

fn attribute(name: &str, value: &AttrValue) -> Result<onnx::AttributeProto> {
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
            a.g = Some(graph_full(g)?);
            T::Graph
        }
    };
    a.r#type = Some(ty as i32);
    Ok(a)
}

fn node_proto(n: &Node, scopes: &[Arc<Scope>]) -> Result<onnx::NodeProto> {
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
            .map(|a| attribute(&a.name, &a.value))
            .collect::<Result<_>>()?,
        metadata_props,
        ..Default::default()
    })
}

/// The graph without its initializers (they are streamed separately).
fn graph_skeleton(g: &Graph) -> Result<onnx::GraphProto> {
    let scopes = if g.nodes.iter().any(|n| n.scope.is_some()) {
        g.scopes.snapshot()
    } else {
        Vec::new()
    };
    let mut p = graph_without_nodes(g)?;
    p.node = g
        .nodes
        .iter()
        .map(|n| node_proto(n, &scopes))
        .collect::<Result<_>>()?;
    Ok(p)
}

const NODE_TAG: u32 = 1; // GraphProto.node
const NODE_METADATA_TAG: u32 = 9; // NodeProto.metadata_props
const ENTRY_KEY_TAG: u32 = 1; // StringStringEntryProto.key
const ENTRY_VALUE_TAG: u32 = 2; // StringStringEntryProto.value

/// The length of a length-delimited field holding `len` bytes.
fn bytes_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// The encoded length of `(key, value)` as a `StringStringEntryProto` (both fields set, so both written).
fn entry_len(k: &str, v: &str) -> usize {
    bytes_field_len(ENTRY_KEY_TAG, k.len()) + bytes_field_len(ENTRY_VALUE_TAG, v.len())
}

/// The encoded length of a scope's `metadata_props` entries (as `NodeProto` fields).
fn props_len(props: &[(String, String)]) -> usize {
    props
        .iter()
        .map(|(k, v)| bytes_field_len(NODE_METADATA_TAG, entry_len(k, v)))
        .sum()
}

/// Writes a scope's `metadata_props` entries as prost encodes them, straight from the scope's
/// strings: no `StringStringEntryProto` is built, and nothing is copied but into `w`.
fn write_props<W: Write>(props: &[(String, String)], w: &mut W) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(24);
    for (k, v) in props {
        head.clear();
        encode_key(NODE_METADATA_TAG, WireType::LengthDelimited, &mut head);
        encode_varint(entry_len(k, v) as u64, &mut head);
        encode_key(ENTRY_KEY_TAG, WireType::LengthDelimited, &mut head);
        encode_varint(k.len() as u64, &mut head);
        w.write_all(&head)?;
        w.write_all(k.as_bytes())?;
        head.clear();
        encode_key(ENTRY_VALUE_TAG, WireType::LengthDelimited, &mut head);
        encode_varint(v.len() as u64, &mut head);
        w.write_all(&head)?;
        w.write_all(v.as_bytes())?;
    }
    Ok(())
}

/// The top-level graph's skeleton, planned: what prost writes for `graph_skeleton` (nodes are
/// GraphProto's first field, metadata the last non-empty one of NodeProto, so a node's metadata
/// follows its other fields), with each node's metadata left to `write`, which encodes it from its
/// scope's strings straight into the file. The metadata is most of a skeleton (a scope's strings are a
/// few KiB: 7 MiB for 3,791 nodes), and encoding it into a buffer here cost ~3 ms before the first
/// byte of the weights could be written (issue 13); its length is summed from the strings' lengths.
struct Skeleton {
    /// Every node's bytes but its metadata, one after the other.
    nodes: Vec<u8>,
    /// Per node: where its bytes end in `nodes`, the scope whose metadata follows them, and that
    /// metadata's encoded length.
    ends: Vec<(usize, Option<usize>, usize)>,
    scopes: Vec<Arc<Scope>>,
    /// The fields after the nodes (inputs, outputs, name, metadata).
    tail: Vec<u8>,
    len: u64,
}

impl Skeleton {
    fn new(g: &Graph) -> Result<Skeleton> {
        let scopes = if g.nodes.iter().any(|n| n.scope.is_some()) {
            g.scopes.snapshot()
        } else {
            Vec::new()
        };
        let mut props: Vec<Option<usize>> = vec![None; scopes.len()];
        let names: usize = g
            .nodes
            .iter()
            .map(|n| {
                let io = n.inputs.iter().chain(&n.outputs).map(|s| s.len() + 2);
                16 + n.name.len() + n.op_type.len() + n.domain.len() + io.sum::<usize>()
            })
            .sum();
        let mut nodes = Vec::with_capacity(names);
        let mut ends = Vec::with_capacity(g.nodes.len());
        let mut node = Vec::new();
        let mut len = 0usize;
        let fail = |e: prost::EncodeError| Error::Serialization(e.to_string());
        for n in &g.nodes {
            node.clear();
            node_proto(n, &[])?.encode(&mut node).map_err(fail)?;
            let scope = n.scope.map(|i| i as usize).filter(|&i| i < scopes.len());
            let meta = scope.map_or(0, |i| {
                *props[i].get_or_insert_with(|| props_len(&scopes[i].props))
            });
            len += bytes_field_len(NODE_TAG, node.len() + meta);
            nodes.extend_from_slice(&node);
            ends.push((nodes.len(), scope, meta));
        }
        let mut tail = Vec::new();
        graph_without_nodes(g)?.encode(&mut tail).map_err(fail)?;
        len += tail.len();
        Ok(Skeleton {
            nodes,
            ends,
            scopes,
            tail,
            len: len as u64,
        })
    }

    fn write<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(16);
        let mut start = 0;
        for &(end, scope, meta) in &self.ends {
            let props: &[(String, String)] = scope.map_or(&[], |i| &self.scopes[i].props);
            head.clear();
            encode_key(NODE_TAG, WireType::LengthDelimited, &mut head);
            encode_varint((end - start + meta) as u64, &mut head);
            w.write_all(&head)?;
            w.write_all(&self.nodes[start..end])?;
            write_props(props, w)?;
            start = end;
        }
        w.write_all(&self.tail)
    }
}

fn graph_without_nodes(g: &Graph) -> Result<onnx::GraphProto> {
    Ok(onnx::GraphProto {
        name: Some(g.name.clone()),
        input: g
            .inputs
            .iter()
            .map(|n| value_info(g, n))
            .collect::<Result<_>>()?,
        output: g
            .outputs
            .iter()
            .map(|n| value_info(g, n))
            .collect::<Result<_>>()?,
        metadata_props: entries(&g.metadata),
        ..Default::default()
    })
}

/// A whole (sub)graph as one prost message, initializers copied in.
fn graph_full(g: &Graph) -> Result<onnx::GraphProto> {
    let mut p = graph_skeleton(g)?;
    p.initializer = g.initializers.iter().map(tensor_full).collect();
    Ok(p)
}

/// A local function: its constants become `Constant` nodes (a FunctionProto has no initializers), its
/// nodes keep their names and metadata; no `value_info` (runtimes infer the types).
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
                attribute: vec![attribute("value", &AttrValue::Tensor(t.clone()))?],
                ..Default::default()
            })
        })
        .collect::<Result<_>>()?;
    for n in &g.nodes {
        node.push(node_proto(n, &scopes)?);
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

fn model_header(m: &Model) -> Result<onnx::ModelProto> {
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

// ---- the plan: every length known before the first byte is written ---------------------------------

struct TensorPlan<'a> {
    tensor: &'a Tensor,
    header: Vec<u8>,
    /// Offset in the data file when external, None when inline or referenced.
    offset: Option<u64>,
    /// External data in another file: nothing of it is written.
    referenced: bool,
}

impl TensorPlan<'_> {
    fn message_len(&self) -> u64 {
        let h = self.header.len() as u64;
        if self.offset.is_some() || self.referenced {
            h
        } else {
            let n = self.tensor.data.len() as u64;
            h + key_len(RAW_DATA_TAG) as u64 + encoded_len_varint(n) as u64 + n
        }
    }
}

struct Plan<'a> {
    head: Vec<u8>,
    skeleton: Skeleton,
    tensors: Vec<TensorPlan<'a>>,
    graph_len: u64,
    model_len: u64,
    data_len: u64,
}

fn align(offset: u64, len: u64) -> u64 {
    let a = if len > LARGE_TENSOR {
        ALIGN_LARGE
    } else {
        ALIGN_SMALL
    };
    offset.div_ceil(a) * a
}

fn plan<'a>(m: &'a Model, location: Option<&str>) -> Result<Plan<'a>> {
    let head = model_header(m)?.encode_to_vec();
    let skeleton = Skeleton::new(&m.graph)?;
    let mut data_len = 0u64;
    let mut tensors = Vec::with_capacity(m.graph.initializers.len());
    for t in &m.graph.initializers {
        let mut header = tensor_header(t);
        header.metadata_props = value_metadata(&m.graph, &t.name);
        let n = t.data.len() as u64;
        let mut offset = None;
        let entry = |k: &str, v: String| onnx::StringStringEntryProto {
            key: Some(k.to_owned()),
            value: Some(v),
        };
        if let TensorData::Referenced {
            location: file,
            offset: at,
            len,
        } = &t.data
        {
            if location.is_none() {
                return Err(Error::Serialization(REFERENCED_INLINE.to_owned()));
            }
            header.external_data = vec![
                entry("location", file.to_string()),
                entry("offset", at.to_string()),
                entry("length", len.to_string()),
            ];
            header.data_location = Some(onnx::tensor_proto::DataLocation::External as i32);
        } else if let Some(loc) = location {
            if t.data.len() >= EXTERNAL_MIN_BYTES || t.data.is_deferred() {
                let start = align(data_len, n);
                header.external_data = vec![
                    entry("location", loc.to_owned()),
                    entry("offset", start.to_string()),
                    entry("length", n.to_string()),
                ];
                header.data_location = Some(onnx::tensor_proto::DataLocation::External as i32);
                offset = Some(start);
                data_len = start + n;
            }
        }
        tensors.push(TensorPlan {
            tensor: t,
            header: header.encode_to_vec(),
            offset,
            referenced: t.data.is_referenced(),
        });
    }
    let graph_len = skeleton.len
        + tensors
            .iter()
            .map(|t| {
                let l = t.message_len();
                key_len(INITIALIZER_TAG) as u64 + encoded_len_varint(l) as u64 + l
            })
            .sum::<u64>();
    let model_len = head.len() as u64
        + key_len(GRAPH_TAG) as u64
        + encoded_len_varint(graph_len) as u64
        + graph_len;
    Ok(Plan {
        head,
        skeleton,
        tensors,
        graph_len,
        model_len,
        data_len,
    })
}

/// The tensors whose bytes the model file holds (neither in the data file nor referenced).
fn inline_tensors<'p, 'a>(p: &'p Plan<'a>) -> impl Iterator<Item = &'p TensorPlan<'a>> {
    p.tensors
        .iter()
        .filter(|t| t.offset.is_none() && !t.referenced)
}

/// The whole model file; the inline tensors' computed bytes are produced while the head is written.
fn write_model<W: Write>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
    producing_inline(p, |ahead| {
        write_graph_head(p, w)?;
        write_initializers(p, ahead, w)
    })
}

/// Runs `f` with the inline tensors' computed bytes produced ahead (`prefetch::with_prefetch`).
fn producing_inline(
    p: &Plan<'_>,
    f: impl FnOnce(&mut Prefetched<'_>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    with_prefetch(inline_tensors(p).map(|t| &t.tensor.data).collect(), f)
}

/// The model file up to the graph's initializers: the model's header, the graph's tag and length, the
/// skeleton (`graph_head_len` bytes).
fn write_graph_head<W: Write>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(32);
    w.write_all(&p.head)?;
    encode_key(GRAPH_TAG, WireType::LengthDelimited, &mut buf);
    encode_varint(p.graph_len, &mut buf);
    w.write_all(&buf)?;
    p.skeleton.write(w)
}

fn graph_head_len(p: &Plan<'_>) -> u64 {
    p.head.len() as u64
        + key_len(GRAPH_TAG) as u64
        + encoded_len_varint(p.graph_len) as u64
        + p.skeleton.len
}

/// The rest of the model file: the graph's initializers (their bytes when inline).
fn write_initializers<W: Write>(
    p: &Plan<'_>,
    ahead: &mut Prefetched<'_>,
    w: &mut W,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(32);
    for t in &p.tensors {
        buf.clear();
        encode_key(INITIALIZER_TAG, WireType::LengthDelimited, &mut buf);
        encode_varint(t.message_len(), &mut buf);
        buf.extend_from_slice(&t.header);
        if t.offset.is_none() && !t.referenced {
            encode_key(RAW_DATA_TAG, WireType::LengthDelimited, &mut buf);
            encode_varint(t.tensor.data.len() as u64, &mut buf);
            w.write_all(&buf)?;
            ahead.write(&t.tensor.data, w)?;
        } else {
            w.write_all(&buf)?;
        }
    }
    Ok(())
}

fn write_data<W: Write + Seek>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
    let external = p
        .tensors
        .iter()
        .filter(|t| t.offset.is_some() && !t.tensor.data.is_deferred());
    with_prefetch(external.map(|t| &t.tensor.data).collect(), |ahead| {
        write_data_with(p, ahead, w)
    })
}

fn write_data_with<W: Write + Seek>(
    p: &Plan<'_>,
    ahead: &mut Prefetched<'_>,
    w: &mut W,
) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut pos = 0u64;
    for t in &p.tensors {
        let Some(offset) = t.offset else { continue };
        if t.tensor.data.is_deferred() {
            continue; // a hole: the bytes are attached later
        }
        if pos < offset && offset - pos > ZEROS.len() as u64 {
            // skip over holes left by deferred weights
            w.seek(SeekFrom::Start(offset))?;
            pos = offset;
        }
        let mut pad = offset - pos;
        while pad > 0 {
            let k = pad.min(ZEROS.len() as u64) as usize;
            w.write_all(&ZEROS[..k])?;
            pad -= k as u64;
        }
        ahead.write(&t.tensor.data, w)?;
        pos = offset + t.tensor.data.len() as u64;
    }
    if pos < p.data_len {
        // the file ends with deferred weights: give it its full size (sparse, nothing written)
        w.seek(SeekFrom::Start(p.data_len - 1))?;
        w.write_all(&[0])?;
    }
    Ok(())
}

/// The whole model as bytes, weights inline.
pub fn to_bytes(m: &Model) -> Result<Vec<u8>> {
    if m.graph.has_deferred() {
        return Err(Error::Serialization(DEFERRED_INLINE.to_owned()));
    }
    if m.graph.has_referenced() {
        return Err(Error::Serialization(REFERENCED_INLINE.to_owned()));
    }
    let p = plan(m, None)?;
    if p.model_len > PROTOBUF_LIMIT {
        return Err(Error::TooLarge { size: p.model_len });
    }
    let mut out = Vec::with_capacity(p.model_len as usize);
    write_model(&p, &mut out).map_err(|e| Error::Serialization(e.to_string()))?;
    Ok(out)
}

// ---- files: written through a meter, committed by renames ----------------------------------------

/// How many bytes are written between two calls of the hook (a tensor written in one `write_all` is
/// cut into writes this large, so that a Ctrl-C is seen within milliseconds at any disk speed).
const HOOK_BYTES: usize = 2 << 20;

/// The hook's error, carried through the `io::Result`s of the write functions.
#[derive(Debug)]
struct Stop(Error);

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Stop {}

/// The hook's error when the write was stopped by it, the file's I/O error otherwise.
fn write_err(path: &Path, e: std::io::Error) -> Error {
    if !e.get_ref().is_some_and(|inner| inner.is::<Stop>()) {
        return io_err(path, e);
    }
    match e.into_inner().map(|inner| inner.downcast::<Stop>()) {
        Some(Ok(stop)) => stop.0,
        _ => Error::Interrupted("the write was stopped".to_owned()),
    }
}

/// A file being written, counting its bytes for the hook: the bytes of the files written before it
/// (`base`) and of this one, out of `total`.
struct Metered<'a, 'h, W> {
    inner: W,
    pos: u64,
    reported: u64,
    base: u64,
    total: u64,
    hook: &'a mut Hook<'h>,
}

impl<W> Metered<'_, '_, W> {
    fn report(&mut self) -> std::io::Result<()> {
        self.reported = self.pos;
        (self.hook)(self.base + self.pos, self.total).map_err(|e| std::io::Error::other(Stop(e)))
    }
}

impl<W: Write> Write for Metered<'_, '_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(&buf[..buf.len().min(HOOK_BYTES)])?;
        self.pos += n as u64;
        if self.pos.saturating_sub(self.reported) >= HOOK_BYTES as u64 {
            self.report()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Seek> Seek for Metered<'_, '_, W> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

type FileWriter<'a, 'h> = Metered<'a, 'h, BufWriter<File>>;

/// Writes `tmp` with `f`; its bytes count from `base` for the hook. `durable`: flushed to the disk
/// before returning.
fn write_file(
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    f: impl FnOnce(&mut FileWriter<'_, '_>) -> std::io::Result<()>,
) -> Result<()> {
    let file = File::create(&tmp.path).map_err(|e| io_err(&tmp.path, e))?;
    write_to(file, tmp, durable, (base, total), hook, f)
}

/// `write_file` on `file`, the temporary `tmp` opened already.
fn write_to(
    file: File,
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    f: impl FnOnce(&mut FileWriter<'_, '_>) -> std::io::Result<()>,
) -> Result<()> {
    let mut w = Metered {
        inner: BufWriter::with_capacity(1 << 20, file),
        pos: 0,
        reported: 0,
        base,
        total,
        hook,
    };
    f(&mut w).map_err(|e| write_err(&tmp.path, e))?;
    let file = w
        .inner
        .into_inner()
        .map_err(|e| io_err(&tmp.path, e.into_error()))?;
    if durable {
        file.sync_all().map_err(|e| io_err(&tmp.path, e))?;
    }
    Ok(())
}

/// What the thread writing `path` returned; a panic as an error naming the file.
fn joined(thread: std::thread::ScopedJoinHandle<'_, Result<()>>, path: &Path) -> Result<()> {
    thread.join().unwrap_or_else(|_| {
        Err(Error::Serialization(format!(
            "writing {} failed: its thread panicked",
            path.display()
        )))
    })
}

/// Skeletons at least this large are written on a second thread beside an inline model's weights.
const SPLIT_SKELETON_BYTES: u64 = 1 << 20;

/// Whether `write_model_file` writes `p`'s skeleton on a second thread: weights inline (bytes to write
/// beside it) and a skeleton large enough for a thread to pay (node metadata: ~2 KiB a node).
fn splits(p: &Plan<'_>) -> bool {
    p.skeleton.len >= SPLIT_SKELETON_BYTES && inline_tensors(p).any(|t| !t.tensor.data.is_empty())
}

/// Writes the model file `tmp` for plan `p` (its bytes count from `base` for the hook). When `splits`,
/// the graph's head (the header and the skeleton, which holds the node metadata) is written by a
/// second thread through a handle of its own while this one writes the initializers after it, at the
/// offset the plan gives: the metadata of an inline model then costs no wall time beside its weights
/// on a machine with a second core (issue 13). The same bytes either way.
fn write_model_file(
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    p: &Plan<'_>,
) -> Result<()> {
    if !splits(p) {
        return write_file(tmp, durable, (base, total), hook, |w| write_model(p, w));
    }
    let stop = AtomicBool::new(false);
    let stopped = || {
        if stop.load(Ordering::Relaxed) {
            Err(Error::Interrupted("the write was stopped".to_owned()))
        } else {
            Ok(())
        }
    };
    let split = graph_head_len(p);
    // made before the second handle is opened on it, and not truncated after
    let file = File::create(&tmp.path).map_err(|e| io_err(&tmp.path, e))?;
    let (head, rest) = std::thread::scope(|s| {
        let head = s.spawn(|| {
            let written = OpenOptions::new()
                .write(true)
                .open(&tmp.path)
                .map_err(|e| io_err(&tmp.path, e))
                .and_then(|file| {
                    let mut hook = |_: u64, _: u64| stopped();
                    write_to(file, tmp, false, (0, 0), &mut hook, |w| {
                        write_graph_head(p, w)
                    })
                });
            if written.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            written
        });
        let mut rest_hook = |d: u64, t: u64| {
            stopped()?;
            hook(d, t)
        };
        let rest = write_to(file, tmp, false, (base, total), &mut rest_hook, |w| {
            w.seek(SeekFrom::Start(split))?;
            producing_inline(p, |ahead| write_initializers(p, ahead, w))
        });
        if rest.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        (joined(head, &tmp.path), rest)
    });
    // this thread's error first (a Ctrl-C): the head's is then only that it was stopped
    rest?;
    head?;
    if durable {
        OpenOptions::new()
            .write(true)
            .open(&tmp.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(&tmp.path, e))?;
    }
    Ok(())
}

/// How a model is saved.
#[derive(Debug, Clone, Copy, Default)]
pub struct SaveOptions<'a> {
    /// Some(true) always writes weights to `<location>` beside the model, Some(false) never
    /// (TooLarge past 2 GiB), None only when the inline protobuf would pass 2 GiB.
    pub external: Option<bool>,
    /// The data file's name beside the model (`<model file name>.data` by default).
    pub location: Option<&'a str>,
    /// Flush the data file and the model file to the disk before the renames, and the folder after:
    /// the files survive a power loss once the save returns.
    pub durable: bool,
}

/// Writes `m` to `path`. `external`: Some(true) always writes weights to `<location>` beside it,
/// Some(false) never (TooLarge past 2 GiB), None only when the inline protobuf would pass 2 GiB.
pub fn save(
    m: &Model,
    path: &Path,
    external: Option<bool>,
    location: Option<&str>,
) -> Result<SaveInfo> {
    let options = SaveOptions {
        external,
        location,
        durable: false,
    };
    save_with(m, path, &options, &mut crate::hook::ignore)
}

/// Writes `m` to `path` as `options` say. `hook` is called with (bytes written, bytes to write) every
/// 2 MiB and once before the renames; its error stops the save, which removes its temporary files,
/// leaves the files already at `path` untouched and returns that error. Temporaries that killed
/// processes of this host left in the folder are removed first (`SaveInfo::swept`).
pub fn save_with(
    m: &Model,
    path: &Path,
    options: &SaveOptions<'_>,
    hook: &mut Hook<'_>,
) -> Result<SaveInfo> {
    if path.is_dir() {
        return Err(Error::Serialization(format!(
            "cannot write {}: it is a folder",
            path.display()
        )));
    }
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .ok_or_else(|| {
            Error::Serialization(format!("cannot write {}: no file name", path.display()))
        })?;
    let default_location = format!("{file_name}.data");
    let location = options.location.unwrap_or(&default_location);
    if location.contains('/') || location.contains('\\') || location.is_empty() {
        return Err(Error::Serialization(format!(
            "external data location {location:?} must be a plain file name beside the model"
        )));
    }
    let external = options.external;

    let deferred = m.graph.has_deferred();
    if deferred && external == Some(false) {
        return Err(Error::Serialization(DEFERRED_INLINE.to_owned()));
    }
    let referenced = m.graph.has_referenced();
    if referenced && external == Some(false) {
        return Err(Error::Serialization(REFERENCED_INLINE.to_owned()));
    }
    let mut use_external = external.unwrap_or(deferred || referenced);
    let mut p = plan(m, use_external.then_some(location))?;
    // external=None: the data file only when the inline protobuf would pass 2 GiB (planned again then)
    let switched = external.is_none() && !use_external && p.model_len > PROTOBUF_LIMIT;
    if switched {
        use_external = true;
        p = plan(m, Some(location))?;
    }
    if p.model_len > PROTOBUF_LIMIT {
        return Err(Error::TooLarge { size: p.model_len });
    }
    let folder = match path.parent() {
        Some(f) if !f.as_os_str().is_empty() => f.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let swept = temp::sweep(&folder);
    let mut links = link_references(m, &folder)?;
    let data_len = if use_external { p.data_len } else { 0 };
    let total = data_len + p.model_len;
    let data_target = path.with_file_name(location);
    let mut data_tmp = None;
    // every external tensor referenced elsewhere: no data file of our own
    let own_data = p.tensors.iter().any(|t| t.offset.is_some());
    let mut model_tmp = TempFile::beside(path);
    let write_model_file = |hook: &mut Hook<'_>| {
        write_model_file(&model_tmp, options.durable, (data_len, total), hook, &p)
    };
    if use_external && own_data {
        // the model file (graph and metadata, no weights) is written on a second thread while this one
        // writes the weights: its progress is reported with the last call of the hook below
        let tmp = TempFile::beside(&data_target);
        let (data, model) = std::thread::scope(|s| {
            let model = s.spawn(|| write_model_file(&mut crate::hook::ignore));
            let data = write_file(&tmp, options.durable, (0, total), hook, |w| {
                write_data(&p, w)
            });
            (data, joined(model, &model_tmp.path))
        });
        data?;
        model?;
        data_tmp = Some(tmp);
    } else {
        write_model_file(hook)?;
    }
    // the last word before anything is renamed: a stop asked for now still leaves the old files
    hook(total, total)?;
    if let Some(mut tmp) = data_tmp {
        // An older model at `path` would read the new data file: remove it before the data moves in.
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| io_err(path, e))?;
        }
        tmp.commit(&data_target)?;
    }
    for (tmp, target) in &mut links {
        tmp.commit(target)?;
    }
    model_tmp.commit(path)?;
    if options.durable {
        temp::sync_folder(&folder)?;
    }
    Ok(SaveInfo {
        path: path.to_path_buf(),
        data_path: (use_external && own_data).then_some(data_target),
        external_data: use_external,
        switched_to_external: switched,
        model_bytes: p.model_len,
        data_bytes: p.data_len,
        external_tensors: p.tensors.iter().filter(|t| t.offset.is_some()).count(),
        referenced_tensors: p.tensors.iter().filter(|t| t.referenced).count(),
        referenced_bytes: p
            .tensors
            .iter()
            .filter(|t| t.referenced)
            .map(|t| t.tensor.data.len() as u64)
            .sum(),
        swept,
        linked: links.into_iter().map(|(_, target)| target).collect(),
    })
}

/// Hard links, made under temporary names beside the model, of the files referenced tensors point into
/// that are not in `folder` already: onnxruntime reads external data only inside the model's folder,
/// symbolic links refused. Renamed into place with the model (a file of that name there is replaced),
/// removed when the save fails; a killed save's are swept like its other temporaries.
fn link_references(m: &Model, folder: &Path) -> Result<Vec<(TempFile, PathBuf)>> {
    let used: std::collections::BTreeSet<&str> = m
        .graph
        .initializers
        .iter()
        .filter_map(|t| match &t.data {
            TensorData::Referenced { location, .. } => Some(location.as_ref()),
            _ => None,
        })
        .collect();
    let mut links = Vec::new();
    for name in used {
        // a location without a known source: the caller put the file beside the model itself
        let Some(source) = m.reference_sources.get(name) else {
            continue;
        };
        let target = folder.join(name);
        if same_file(&target, source) {
            continue;
        }
        let tmp = TempFile::beside(&target);
        std::fs::hard_link(source, &tmp.path).map_err(|e| {
            Error::Serialization(format!(
                "cannot hard-link {} into {} ({e}): onnxruntime reads external data only inside the \
                 model's folder; write the model beside the shards or on their filesystem",
                source.display(),
                folder.display()
            ))
        })?;
        links.push((tmp, target));
    }
    Ok(links)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::graph::{Attribute, Dim};
    use crate::tensor::TensorData;

    fn sample(weight_len: usize) -> Model {
        let mut m = Model::new(18, 8, "test");
        let g = &mut m.graph;
        let x = g.add_input(
            "x",
            dtype::FLOAT,
            Some(vec![Dim::Sym("n".into()), Dim::Fixed(2)]),
        );
        let w = g
            .add_initializer(
                "w",
                dtype::UINT8,
                vec![weight_len as i64],
                TensorData::Owned((0..weight_len).map(|i| (i % 251) as u8).collect()),
                None,
            )
            .expect("w");
        let c = g
            .add_constant("c", dtype::FLOAT, vec![2], vec![0, 0, 128, 63, 0, 0, 0, 64])
            .expect("c");
        let y = g
            .add_node(
                "Add",
                "",
                vec![x, c],
                &["y".into()],
                vec![Attribute {
                    name: "note".into(),
                    value: AttrValue::Ints(vec![1, 2]),
                }],
                None,
            )
            .expect("add");
        g.set_type(
            &y[0],
            ValueType {
                dtype: Some(dtype::FLOAT),
                shape: Some(vec![Dim::Sym("n".into()), Dim::Fixed(2)]),
            },
        )
        .expect("type");
        g.add_output(&y[0], None).expect("out");
        g.add_output(&w, Some("w_out")).expect("w out");
        m
    }

    #[test]
    fn streamed_bytes_decode_with_prost() {
        let m = sample(3000);
        let bytes = to_bytes(&m).expect("bytes");
        let decoded = onnx::ModelProto::decode(bytes.as_slice()).expect("decode");
        assert_eq!(decoded.ir_version, Some(8));
        let g = decoded.graph.expect("graph");
        assert_eq!(g.node.len(), 2);
        assert_eq!(g.initializer.len(), 2);
        let w = &g.initializer[0];
        assert_eq!(
            w.raw_data.as_deref(),
            Some(m.graph.initializers[0].data.to_vec().as_slice())
        );
        assert_eq!(g.input[0].name.as_deref(), Some("x"));
        // the streamed form decodes to the same message prost builds in one piece (field order differs)
        let mut whole = model_header(&m).expect("header");
        whole.graph = Some(graph_full(&m.graph).expect("full"));
        let again = onnx::ModelProto::decode(bytes.as_slice()).expect("decode");
        assert!(again == whole, "streamed model differs from prost's");
        assert!(whole.encode_to_vec().len() == bytes.len());
    }

    #[test]
    fn node_metadata_is_encoded_as_prost_would() {
        use crate::scopes::Scope;
        let mut m = sample(16);
        let g = &mut m.graph;
        let props = |v: &str| {
            vec![
                ("namespace".to_owned(), v.to_owned()),
                ("k".to_owned(), "é".to_owned()),
            ]
        };
        let a = g.scopes.add(Scope {
            prefix: "/a".into(),
            props: props("a"),
        });
        g.scopes.add(Scope {
            prefix: "/b".into(),
            props: props("b"),
        });
        g.nodes[0].scope = Some(a);
        g.metadata.insert("graph key".into(), "v".into());
        let x = g.inputs[0].clone();
        g.add_value_metadata(&x, "kind", "USER_INPUT")
            .expect("meta");
        let skeleton = graph_skeleton(g).expect("skeleton");
        assert_eq!(skeleton.node[0].metadata_props.len(), 2);
        assert!(skeleton.node[1].metadata_props.is_empty());
        assert_eq!(skeleton.input[0].metadata_props.len(), 1);
        let mut bytes = Vec::new();
        let planned = Skeleton::new(g).expect("plan");
        planned.write(&mut bytes).expect("bytes");
        assert_eq!(bytes, skeleton.encode_to_vec());
        assert_eq!(planned.len, bytes.len() as u64);
    }

    #[test]
    fn external_data_is_aligned_and_complete() {
        let dir = tempfile::tempdir().expect("dir");
        let m = sample(3 << 20);
        let path = dir.path().join("m.onnx");
        let info = save(&m, &path, Some(true), None).expect("save");
        assert!(info.external_data && info.external_tensors == 1);
        let data = std::fs::read(dir.path().join("m.onnx.data")).expect("data");
        let decoded = onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice())
            .expect("decode");
        let g = decoded.graph.expect("graph");
        let w = &g.initializer[0];
        let get = |k: &str| {
            w.external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(k))
                .and_then(|e| e.value.clone())
                .expect("entry")
        };
        let offset: usize = get("offset").parse().expect("offset");
        let length: usize = get("length").parse().expect("length");
        assert_eq!(offset % ALIGN_LARGE as usize, 0);
        assert_eq!(
            &data[offset..offset + length],
            m.graph.initializers[0].data.to_vec().as_slice()
        );
        // the small constant stays inline
        assert!(g.initializer[1].raw_data.is_some());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(std::result::Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn deferred_weights_leave_holes_in_the_data_file() {
        let dir = tempfile::tempdir().expect("dir");
        let mut m = sample(2 << 20);
        let d = m
            .graph
            .add_deferred_initializer("late", dtype::FLOAT, vec![1024, 1024])
            .expect("deferred");
        m.graph.add_output(&d, None).expect("out");
        m.metadata.insert("k".into(), "v".into());
        assert!(to_bytes(&m).is_err());
        let path = dir.path().join("m.onnx");
        assert!(save(&m, &path, Some(false), None).is_err());
        let info = save(&m, &path, None, None).expect("save");
        assert!(info.external_data && info.external_tensors == 2);
        let data = std::fs::metadata(dir.path().join("m.onnx.data")).expect("data");
        assert_eq!(data.len(), info.data_bytes);
        let decoded = onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice())
            .expect("decode");
        assert_eq!(decoded.metadata_props[0].value.as_deref(), Some("v"));
        let g = decoded.graph.expect("graph");
        let late = g
            .initializer
            .iter()
            .find(|t| t.name.as_deref() == Some("late"))
            .expect("late");
        assert_eq!(
            late.data_location,
            Some(onnx::tensor_proto::DataLocation::External as i32)
        );
    }

    fn external_entries(t: &onnx::TensorProto) -> Vec<(String, String)> {
        t.external_data
            .iter()
            .map(|e| {
                (
                    e.key.clone().unwrap_or_default(),
                    e.value.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn referenced_weights_point_into_their_file_and_write_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let mut m = sample(100);
        let d = m
            .graph
            .add_deferred_initializer("r", dtype::FLOAT, vec![4, 8])
            .expect("deferred");
        m.graph.add_output(&d, None).expect("out");
        assert!(m
            .graph
            .reference_initializer("nope", "shard.safetensors", 8, 128)
            .is_err());
        assert!(m
            .graph
            .reference_initializer("r", "shard.safetensors", 8, 100)
            .is_err());
        assert!(m
            .graph
            .reference_initializer("r", "../shard.safetensors", 8, 128)
            .is_err());
        assert!(m
            .graph
            .reference_initializer("r", "shard.safetensors", 1000, 128)
            .expect("referenced"));
        // an owned (computed or copied) weight is not as stored: it stays to be written
        assert!(!m
            .graph
            .reference_initializer("w", "shard.safetensors", 8, 100)
            .expect("kept"));
        assert!(m
            .graph
            .initializer("w")
            .expect("w")
            .data
            .as_slice()
            .is_some());
        assert!(to_bytes(&m).is_err());
        let path = dir.path().join("m.onnx");
        assert!(save(&m, &path, Some(false), None).is_err());
        let info = save(&m, &path, None, None).expect("save");
        assert!(info.external_data);
        assert_eq!((info.referenced_tensors, info.referenced_bytes), (1, 128));
        // the only external tensor is referenced: no data file of our own
        assert_eq!((info.external_tensors, info.data_path.clone()), (0, None));
        assert_eq!(listing(dir.path()), ["m.onnx"]);
        let decoded = onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice())
            .expect("decode");
        let g = decoded.graph.expect("graph");
        let r = g
            .initializer
            .iter()
            .find(|t| t.name.as_deref() == Some("r"))
            .expect("r");
        assert!(r.raw_data.is_none());
        assert_eq!(
            r.data_location,
            Some(onnx::tensor_proto::DataLocation::External as i32)
        );
        let want = [
            ("location", "shard.safetensors"),
            ("offset", "1000"),
            ("length", "128"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(external_entries(r), want);
    }

    #[test]
    fn referenced_files_are_linked_beside_a_model_written_elsewhere() {
        let shards = tempfile::tempdir().expect("dir");
        let out = tempfile::tempdir().expect("dir");
        let shard = shards.path().join("shard.safetensors");
        std::fs::write(&shard, vec![7u8; 1128]).expect("shard");
        let mut m = sample(100);
        let d = m
            .graph
            .add_deferred_initializer("r", dtype::FLOAT, vec![4, 8])
            .expect("deferred");
        m.graph.add_output(&d, None).expect("out");
        m.graph
            .reference_initializer("r", "shard.safetensors", 1000, 128)
            .expect("referenced");
        m.reference_sources
            .insert("shard.safetensors".to_owned(), shard.clone());
        // a stop before the renames: neither the model nor the link is left
        let path = out.path().join("m.onnx");
        let stop = |_: u64, _: u64| Err(Error::Serialization("stop".into()));
        let options = SaveOptions {
            external: None,
            location: None,
            durable: false,
        };
        assert!(save_with(&m, &path, &options, &mut { stop }).is_err());
        assert!(listing(out.path()).is_empty());
        let info = save(&m, &path, None, None).expect("save");
        assert_eq!(info.linked, [out.path().join("shard.safetensors")]);
        assert!(same_file(&out.path().join("shard.safetensors"), &shard));
        assert_eq!(listing(out.path()), ["m.onnx", "shard.safetensors"]);
        // beside the shard, or with the link already there: nothing to link
        let again = save(&m, &path, None, None).expect("save");
        assert!(again.linked.is_empty());
        let beside = save(&m, &shards.path().join("m.onnx"), None, None).expect("save");
        assert!(beside.linked.is_empty());
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("ls")
            .filter_map(std::result::Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_hook_error_stops_the_save_and_keeps_the_old_files() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, b"old model").expect("old");
        std::fs::write(dir.path().join("m.onnx.data"), b"old data").expect("old");
        let m = sample(64 << 20);
        for stop_at in [8u64 << 20, u64::MAX] {
            // u64::MAX: every byte written, stopped at the last call before the renames
            let mut last = (0, 0);
            let options = SaveOptions {
                external: Some(true),
                ..SaveOptions::default()
            };
            let err = save_with(&m, &path, &options, &mut |done, total| {
                last = (done, total);
                if done >= stop_at.min(total) {
                    return Err(Error::Interrupted("asked".into()));
                }
                Ok(())
            })
            .expect_err("stopped");
            assert!(
                matches!(err, Error::Interrupted(ref m) if m == "asked"),
                "{err}"
            );
            if stop_at == u64::MAX {
                assert_eq!(last.0, last.1);
            } else {
                assert!(
                    last.0 >= stop_at && last.0 < stop_at + (4 << 20),
                    "{last:?}"
                );
            }
            assert_eq!(std::fs::read(&path).expect("model"), b"old model");
            let data = std::fs::read(dir.path().join("m.onnx.data")).expect("data");
            assert_eq!(data, b"old data");
            assert_eq!(listing(dir.path()), ["m.onnx", "m.onnx.data"]);
        }
    }

    #[test]
    fn the_hook_counts_every_byte_and_durable_saves_write_the_same_files() {
        let dir = tempfile::tempdir().expect("dir");
        let m = sample(5 << 20);
        let mut files = Vec::new();
        for durable in [false, true] {
            let path = dir.path().join(format!("m{durable}.onnx"));
            let mut calls = Vec::new();
            let options = SaveOptions {
                external: Some(true),
                location: Some("w.bin"),
                durable,
            };
            let info = save_with(&m, &path, &options, &mut |done, total| {
                calls.push((done, total));
                Ok(())
            })
            .expect("save");
            let total = info.model_bytes + info.data_bytes;
            assert_eq!(calls.last(), Some(&(total, total)));
            assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{calls:?}");
            assert!(calls.len() >= 3, "{calls:?}"); // every 2 MiB of the 5 MiB weight, then the end
            files.push(std::fs::read(&path).expect("model"));
            std::fs::rename(
                dir.path().join("w.bin"),
                dir.path().join(format!("w{durable}")),
            )
            .expect("keep");
        }
        assert!(files[0] == files[1]);
        let data: Vec<Vec<u8>> = ["wfalse", "wtrue"]
            .iter()
            .map(|n| std::fs::read(dir.path().join(n)).expect("data"))
            .collect();
        assert!(data[0] == data[1]);
    }

    #[test]
    fn an_inline_model_with_a_large_skeleton_is_written_in_two_parts_with_the_same_bytes() {
        let dir = tempfile::tempdir().expect("dir");
        let mut m = sample(5 << 20);
        // node metadata past SPLIT_SKELETON_BYTES: the skeleton is written by a second thread
        let scope = m.graph.scopes.add(Scope {
            prefix: "/big".into(),
            props: vec![("stack".into(), "x".repeat(700 << 10))],
        });
        for n in &mut m.graph.nodes {
            n.scope = Some(scope);
        }
        let whole = to_bytes(&m).expect("bytes");
        assert!(splits(&plan(&m, None).expect("plan")));
        for durable in [false, true] {
            let path = dir.path().join(format!("m{durable}.onnx"));
            let options = SaveOptions {
                external: Some(false),
                location: None,
                durable,
            };
            let mut calls = Vec::new();
            let info = save_with(&m, &path, &options, &mut |done, total| {
                calls.push((done, total));
                Ok(())
            })
            .expect("save");
            assert!(std::fs::read(&path).expect("model") == whole);
            let total = info.model_bytes;
            assert_eq!(calls.last(), Some(&(total, total)));
            assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{calls:?}");
        }
        // a stop between two pieces of the weights leaves no file behind
        let path = dir.path().join("stopped.onnx");
        let options = SaveOptions {
            external: Some(false),
            ..Default::default()
        };
        let stop = |done: u64, _: u64| {
            if done > 0 {
                Err(Error::Interrupted("stop".into()))
            } else {
                Ok(())
            }
        };
        assert!(save_with(&m, &path, &options, &mut { stop }).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 2);
    }

    #[test]
    fn failed_save_leaves_existing_file_alone() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, b"old").expect("old");
        let mut m = sample(10);
        m.graph.outputs.push("ghost".into()); // no type: serialization fails before any rename
        assert!(save(&m, &path, Some(false), None).is_err());
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }
}
