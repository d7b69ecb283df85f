//! The top-level graph's nodes, encoded ahead of the write except for their metadata, which is
//! encoded from each scope's strings straight into the file, its length summed from the strings'
//! lengths (the node metadata is most of a model file's graph: ~2 KiB a node).

use std::io::Write;
use std::sync::Arc;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use super::proto::{graph_without_nodes, node_proto};
use super::value_info::encode_value_infos;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::infer::Inferred;
use crate::scopes::Scope;

const NODE_TAG: u32 = 1; // GraphProto.node
const NODE_METADATA_TAG: u32 = 9; // NodeProto.metadata_props
const ENTRY_KEY_TAG: u32 = 1; // StringStringEntryProto.key
const ENTRY_VALUE_TAG: u32 = 2; // StringStringEntryProto.value
const GRAPH_METADATA_TAG: u32 = 16; // GraphProto.metadata_props

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
pub(super) struct Skeleton {
    /// Every node's bytes but its metadata, one after the other.
    nodes: Vec<u8>,
    /// Per node: where its bytes end in `nodes`, the scope whose metadata follows them, and that
    /// metadata's encoded length.
    ends: Vec<(usize, Option<usize>, usize)>,
    scopes: Vec<Arc<Scope>>,
    /// The fields after the nodes (name, inputs, outputs, value infos, metadata).
    tail: Vec<u8>,
    pub(super) len: u64,
}

impl Skeleton {
    pub(super) fn new(g: &Graph, value_info: Option<&Inferred>) -> Result<Skeleton> {
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
            node_proto(n, &[], value_info)?
                .encode(&mut node)
                .map_err(fail)?;
            let scope = n.scope.map(|i| i as usize).filter(|&i| i < scopes.len());
            let meta = scope.map_or(0, |i| {
                *props[i].get_or_insert_with(|| props_len(&scopes[i].props))
            });
            len += bytes_field_len(NODE_TAG, node.len() + meta);
            nodes.extend_from_slice(&node);
            ends.push((nodes.len(), scope, meta));
        }
        // the fields after the nodes in prost's order: name, inputs, outputs, value infos (encoded
        // straight from the types: value_info.rs), metadata
        let mut tail = Vec::new();
        let mut rest = graph_without_nodes(g, None)?;
        let metadata = std::mem::take(&mut rest.metadata_props);
        rest.encode(&mut tail).map_err(fail)?;
        if let Some(inferred) = value_info {
            encode_value_infos(g, inferred, &mut tail);
        }
        for entry in &metadata {
            prost::encoding::message::encode(GRAPH_METADATA_TAG, entry, &mut tail);
        }
        len += tail.len();
        Ok(Skeleton {
            nodes,
            ends,
            scopes,
            tail,
            len: len as u64,
        })
    }

    pub(super) fn write<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::Skeleton;
    use crate::infer::Inferred;
    use crate::scopes::Scope;
    use crate::writer::proto::graph_skeleton;
    use crate::writer::tests::sample;

    #[test]
    fn node_metadata_is_encoded_as_prost_would() {
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
        // a value_info, between the outputs and the graph's metadata
        let r = g
            .add_node("Relu", "", vec![x.clone()], &["r".into()], vec![], None)
            .expect("relu");
        let ty = g.value_type(&x).cloned().expect("x");
        g.set_type(&r[0], ty).expect("type");
        let skeleton = graph_skeleton(g, Some(&Inferred::default())).expect("skeleton");
        assert_eq!(skeleton.value_info.len(), 1);
        assert_eq!(skeleton.node[0].metadata_props.len(), 2);
        assert!(skeleton.node[1].metadata_props.is_empty());
        assert_eq!(skeleton.input[0].metadata_props.len(), 1);
        let mut bytes = Vec::new();
        let planned = Skeleton::new(g, Some(&Inferred::default())).expect("plan");
        planned.write(&mut bytes).expect("bytes");
        assert_eq!(bytes, skeleton.encode_to_vec());
        assert_eq!(planned.len, bytes.len() as u64);
    }
}
