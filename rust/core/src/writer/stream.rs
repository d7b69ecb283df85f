//! The bytes of a planned model, to any writer: the model file (header, skeleton, initializers with
//! their inline bytes) and the data file (external tensors at their offsets, holes for deferred ones).
//! Computed tensors are produced ahead by the prefetching worker.

use std::io::{Seek, SeekFrom, Write};

use prost::encoding::{encode_key, encode_varint, WireType};

use super::plan::{inline_tensors, Plan, GRAPH_TAG, INITIALIZER_TAG, RAW_DATA_TAG};
use crate::prefetch::{with_prefetch, Prefetched};

/// The whole model file; the inline tensors' computed bytes are produced while the head is written.
pub(super) fn write_model<W: Write>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
    producing_inline(p, |ahead| {
        write_graph_head(p, w)?;
        write_initializers(p, ahead, w)
    })
}

/// Runs `f` with the inline tensors' computed bytes produced ahead (`prefetch::with_prefetch`).
pub(super) fn producing_inline(
    p: &Plan<'_>,
    f: impl FnOnce(&mut Prefetched<'_>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    with_prefetch(inline_tensors(p).map(|t| &t.tensor.data).collect(), f)
}

/// The model file up to the graph's initializers: the model's header, the graph's tag and length, the
/// skeleton (`graph_head_len` bytes).
pub(super) fn write_graph_head<W: Write>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(32);
    w.write_all(&p.head)?;
    encode_key(GRAPH_TAG, WireType::LengthDelimited, &mut buf);
    encode_varint(p.graph_len, &mut buf);
    w.write_all(&buf)?;
    p.skeleton.write(w)
}

/// The rest of the model file: the graph's initializers (their bytes when inline).
pub(super) fn write_initializers<W: Write>(
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
        if t.offset.is_none() && !t.referenced && !t.shared {
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

pub(super) fn write_data<W: Write + Seek>(p: &Plan<'_>, w: &mut W) -> std::io::Result<()> {
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
