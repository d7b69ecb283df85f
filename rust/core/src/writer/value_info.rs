//! `GraphProto.value_info` (`Model::value_info`): the element type and shape of every value a graph's
//! nodes make (a sequence's: those of its elements, in a `sequence_type`): the builder's type, or the
//! one `infer::Inferred` found where the builder's is not complete. Which values: [`typed_values`].
//! Two forms of the same entries: prost messages (`proto::value_infos`, for the subgraphs, which are
//! built as messages) and the bytes prost would write for them, encoded straight from the builder's
//! types into the top graph's skeleton ([`encode_value_infos`]: no message is built, nothing is
//! allocated per value; building the messages cost ~0.6 us a value, most of the encoding's time of a
//! graph with metadata off).

use std::collections::HashSet;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

use crate::graph::{Dim, Graph, ValueType};
use crate::infer::Inferred;

/// GraphProto.value_info.
pub(super) const VALUE_INFO_TAG: u32 = 13;
// ValueInfoProto.name, .type; TypeProto.tensor_type, .sequence_type; TypeProto.Sequence.elem_type;
// TypeProto.Tensor.elem_type, .shape; TensorShapeProto.dim; Dimension.dim_value, .dim_param
const NAME_TAG: u32 = 1;
const TYPE_TAG: u32 = 2;
const TENSOR_TYPE_TAG: u32 = 1;
const SEQUENCE_TYPE_TAG: u32 = 4;
const SEQUENCE_ELEM_TAG: u32 = 1;
const ELEM_TYPE_TAG: u32 = 1;
const SHAPE_TAG: u32 = 2;
const DIM_TAG: u32 = 1;
const DIM_VALUE_TAG: u32 = 1;
const DIM_PARAM_TAG: u32 = 2;

/// The values of `g` that get a `value_info`, with their element type and dims, in node order: what
/// its nodes make, but for graph outputs (typed in `output`) and omitted optional outputs, where the
/// element type and the rank are known (a dim may be unknown: written without value or name; a
/// symbolic dim as the graph inputs write theirs, an expression of their dims' names): the builder's
/// type where complete, else the one `inferred` holds. Nothing is written that fastonnx does not
/// know. Two hash lookups a value (its type, and whether it is an output, in a foldhash set; a third
/// for a value the builder does not know completely): most of the cost of the value infos, ~0.1-0.6
/// us a value depending on how much of the graph stays in the cache.
pub(super) fn typed_values<'a>(
    g: &'a Graph,
    inferred: &'a Inferred,
) -> impl Iterator<Item = (&'a str, &'a ValueType, i32, &'a [Dim])> {
    let outputs: HashSet<&str, foldhash::fast::RandomState> =
        g.outputs.iter().map(String::as_str).collect();
    g.nodes
        .iter()
        .flat_map(|n| &n.outputs)
        .filter_map(move |name| {
            if name.is_empty() {
                return None;
            }
            let ty = inferred.type_of(g, name)?;
            let (Some(dtype), Some(dims)) = (ty.dtype, &ty.shape) else {
                return None;
            };
            if dtype <= 0 || outputs.contains(name.as_str()) {
                return None;
            }
            Some((name.as_str(), ty, dtype, dims.as_slice()))
        })
}

/// The length of a length-delimited field holding `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_len(tag: u32, len: usize, out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

/// A `Dimension` message's length.
fn dim_len(d: &Dim) -> usize {
    match d {
        Dim::Fixed(v) => key_len(DIM_VALUE_TAG) + encoded_len_varint(*v as u64),
        Dim::Sym(s) => field_len(DIM_PARAM_TAG, s.len()),
        Dim::Unknown => 0,
    }
}

/// Appends the `value_info` fields of `g` (`GraphProto` field 13, repeated) to `out`, byte for byte as
/// prost encodes [`value_infos`]; returns how many.
pub(super) fn encode_value_infos(g: &Graph, inferred: &Inferred, out: &mut Vec<u8>) -> usize {
    let mut count = 0;
    for (name, ty, dtype, dims) in typed_values(g, inferred) {
        let shape_len: usize = dims.iter().map(|d| field_len(DIM_TAG, dim_len(d))).sum();
        let tensor_len = key_len(ELEM_TYPE_TAG)
            + encoded_len_varint(dtype as u64)
            + field_len(SHAPE_TAG, shape_len);
        // a tensor's TypeProto; a sequence's holds that one as its Sequence's elem_type
        let tensor_type_len = field_len(TENSOR_TYPE_TAG, tensor_len);
        let sequence_len = field_len(SEQUENCE_ELEM_TAG, tensor_type_len);
        let type_len = if ty.sequence {
            field_len(SEQUENCE_TYPE_TAG, sequence_len)
        } else {
            tensor_type_len
        };
        let info_len = field_len(NAME_TAG, name.len()) + field_len(TYPE_TAG, type_len);
        put_len(VALUE_INFO_TAG, info_len, out);
        put_len(NAME_TAG, name.len(), out);
        out.extend_from_slice(name.as_bytes());
        put_len(TYPE_TAG, type_len, out);
        if ty.sequence {
            put_len(SEQUENCE_TYPE_TAG, sequence_len, out);
            put_len(SEQUENCE_ELEM_TAG, tensor_type_len, out);
        }
        put_len(TENSOR_TYPE_TAG, tensor_len, out);
        encode_key(ELEM_TYPE_TAG, WireType::Varint, out);
        encode_varint(dtype as u64, out);
        put_len(SHAPE_TAG, shape_len, out);
        for d in dims {
            put_len(DIM_TAG, dim_len(d), out);
            match d {
                Dim::Fixed(v) => {
                    encode_key(DIM_VALUE_TAG, WireType::Varint, out);
                    encode_varint(*v as u64, out);
                }
                Dim::Sym(s) => {
                    put_len(DIM_PARAM_TAG, s.len(), out);
                    out.extend_from_slice(s.as_bytes());
                }
                Dim::Unknown => {}
            }
        }
        count += 1;
    }
    count
}
