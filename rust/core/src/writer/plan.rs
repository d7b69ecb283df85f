//! The plan: every length and offset known before the first byte is written — the model's header,
//! the skeleton, each initializer's header and where its bytes go (inline, at an aligned offset of the
//! data file, or referenced in another file).

use std::collections::HashMap;

use prost::encoding::{encoded_len_varint, key_len};
use prost::Message;

use super::proto::{model_header, tensor_header, value_metadata};
use super::skeleton::Skeleton;
use super::{ALIGN_LARGE, ALIGN_SMALL, EXTERNAL_MIN_BYTES, REFERENCED_INLINE};
use crate::error::{Error, Result};
use crate::infer::Inferred;
use crate::model::Model;
use crate::proto::onnx;
use crate::tensor::{Tensor, TensorData};

const LARGE_TENSOR: u64 = 1 << 20;

pub(super) const GRAPH_TAG: u32 = 7; // ModelProto.graph
pub(super) const INITIALIZER_TAG: u32 = 5; // GraphProto.initializer
pub(super) const RAW_DATA_TAG: u32 = 9; // TensorProto.raw_data

pub(super) struct TensorPlan<'a> {
    pub(super) tensor: &'a Tensor,
    pub(super) header: Vec<u8>,
    /// Offset in the data file when external, None when inline or referenced.
    pub(super) offset: Option<u64>,
    /// External data in another file: nothing of it is written.
    pub(super) referenced: bool,
    /// External data at another initializer's offset (`Graph::shared_bytes`): nothing of it is written.
    pub(super) shared: bool,
}

impl TensorPlan<'_> {
    pub(super) fn message_len(&self) -> u64 {
        let h = self.header.len() as u64;
        if self.offset.is_some() || self.referenced || self.shared {
            h
        } else {
            let n = self.tensor.data.len() as u64;
            h + key_len(RAW_DATA_TAG) as u64 + encoded_len_varint(n) as u64 + n
        }
    }
}

pub(super) struct Plan<'a> {
    pub(super) head: Vec<u8>,
    pub(super) skeleton: Skeleton,
    pub(super) tensors: Vec<TensorPlan<'a>>,
    pub(super) graph_len: u64,
    pub(super) model_len: u64,
    pub(super) data_len: u64,
}

fn align(offset: u64, len: u64) -> u64 {
    let a = if len > LARGE_TENSOR {
        ALIGN_LARGE
    } else {
        ALIGN_SMALL
    };
    offset.div_ceil(a) * a
}

pub(super) fn plan<'a>(m: &'a Model, location: Option<&str>) -> Result<Plan<'a>> {
    let head = model_header(m)?.encode_to_vec();
    let inferred = m.value_info.then(|| Inferred::of(m));
    let skeleton = Skeleton::new(&m.graph, inferred.as_ref())?;
    let mut data_len = 0u64;
    let mut tensors = Vec::with_capacity(m.graph.initializers.len());
    // initializers sharing another's bytes come last, once the offsets they share are known
    let shares = |t: &Tensor| {
        m.graph
            .shared_bytes
            .get(&t.name)
            .and_then(|of| m.graph.initializer(of))
            .filter(|of| {
                of.data.len() == t.data.len() && !m.graph.shared_bytes.contains_key(&of.name)
            })
    };
    let (sharing, own): (Vec<&Tensor>, Vec<&Tensor>) = m
        .graph
        .initializers
        .iter()
        .partition(|t| shares(t).is_some());
    let mut placed: HashMap<&str, u64> = HashMap::new();
    for t in own.into_iter().chain(sharing) {
        let mut header = tensor_header(t);
        header.metadata_props = value_metadata(&m.graph, &t.name);
        let n = t.data.len() as u64;
        let mut offset = None;
        let entry = |k: &str, v: String| onnx::StringStringEntryProto {
            key: Some(k.to_owned()),
            value: Some(v),
        };
        let at = shares(t).and_then(|of| placed.get(of.name.as_str()).copied());
        if let (Some(start), Some(loc)) = (at, location) {
            header.external_data = vec![
                entry("location", loc.to_owned()),
                entry("offset", start.to_string()),
                entry("length", n.to_string()),
            ];
            header.data_location = Some(onnx::tensor_proto::DataLocation::External as i32);
            tensors.push(TensorPlan {
                tensor: t,
                header: header.encode_to_vec(),
                offset: None,
                referenced: false,
                shared: true,
            });
            continue;
        }
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
                placed.insert(t.name.as_str(), start);
                data_len = start + n;
            }
        }
        tensors.push(TensorPlan {
            tensor: t,
            header: header.encode_to_vec(),
            offset,
            referenced: t.data.is_referenced(),
            shared: false,
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
pub(super) fn inline_tensors<'p, 'a>(p: &'p Plan<'a>) -> impl Iterator<Item = &'p TensorPlan<'a>> {
    p.tensors
        .iter()
        .filter(|t| t.offset.is_none() && !t.referenced && !t.shared)
}

pub(super) fn graph_head_len(p: &Plan<'_>) -> u64 {
    p.head.len() as u64
        + key_len(GRAPH_TAG) as u64
        + encoded_len_varint(p.graph_len) as u64
        + p.skeleton.len
}
