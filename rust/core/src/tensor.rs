//! Tensor bytes: owned (small constants) or borrowed from memory someone else keeps alive (torch storage
//! seen through the buffer protocol), so that weights are never copied on their way to the file.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::dtype;
use crate::permute::{self, Layout, TILE};
use quantize::Quantized;

pub mod quantize;

/// Memory owned elsewhere and kept alive by the implementor, readable from any thread.
pub trait ByteSource: Send + Sync {
    fn bytes(&self) -> &[u8];
}

/// Bytes that live elsewhere (a weight on a GPU or another accelerator) and are copied to the host when
/// they are written, one tensor at a time: the copy is made by the writer's prefetching worker (see
/// `prefetch`), held while that tensor is written and dropped after, so the host never holds the
/// whole model.
pub trait Fetch: Send + Sync {
    /// A host copy of the bytes.
    fn fetch(&self) -> io::Result<Arc<dyn ByteSource>>;
}

/// Bytes a pass computed, shared by lazily transformed tensors like borrowed memory is.
impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

macro_rules! le_decoder {
    ($name:ident, $t:ty) => {
        /// Little-endian elements of raw tensor bytes (a trailing partial element is ignored).
        pub fn $name(bytes: &[u8]) -> Vec<$t> {
            const N: usize = std::mem::size_of::<$t>();
            bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    <$t>::from_le_bytes(a)
                })
                .collect()
        }
    };
}
le_decoder!(le_f32s, f32);
le_decoder!(le_f64s, f64);
le_decoder!(le_i32s, i32);
le_decoder!(le_i64s, i64);

#[derive(Clone)]
pub enum TensorData {
    Owned(Vec<u8>),
    Borrowed(Arc<dyn ByteSource>),
    /// A row-major tensor of shape `dims` and `item`-byte elements, stored permuted as ONNX `Transpose`
    /// with `perm` gives it (output axis k is axis `perm[k]`; `[1, 0]` for a matrix, `[0, 2, 1]` for
    /// batched expert weights): the writer permutes it band by band (see `permute`), so the weight is
    /// never copied whole. Build it with [`TensorData::transposed`].
    Transposed {
        source: Arc<dyn ByteSource>,
        dims: Vec<usize>,
        perm: Vec<usize>,
        item: usize,
    },
    /// `len` bytes copied to the host only while they are written (see [`Fetch`]), permuted as they are
    /// written when read through a Transpose (as [`TensorData::Transposed`] is).
    Fetched {
        fetch: Arc<dyn Fetch>,
        len: usize,
        permuted: Option<Arc<Permutation>>,
    },
    /// Bytes that are not here (a weight on the meta device): the writer leaves their place in the
    /// external data file empty, to be filled later (fastonnx.attach_weights).
    Deferred {
        len: usize,
    },
    /// Bytes that already sit in another file beside the model (a safetensors shard): the writer
    /// emits an external-data entry pointing at them (`location`, `offset`, `len`) and writes nothing.
    Referenced {
        location: Arc<str>,
        offset: u64,
        len: usize,
    },
    /// A float32 tensor whose outer-dimension slice `o` (of `inner` elements) is multiplied by
    /// `scale[o]` as it is written: a convolution weight with a batch norm folded in, never copied whole.
    ChannelScaled {
        source: Arc<dyn ByteSource>,
        scale: Arc<Vec<f32>>,
        inner: usize,
    },
    /// `count` float elements of type `from` at `offset` of another file (a checkpoint shard), written
    /// converted to the tensor's float type `to` a piece at a time: never read whole into memory.
    Converted {
        file: Arc<File>,
        offset: u64,
        count: usize,
        from: i32,
        to: i32,
    },
    /// One tensor (codes, scales or zero points) of a float weight quantized per block as it is
    /// written (`to_onnx(quantize=...)`): computed a run of whole blocks at a time from the float
    /// source (memory or a checkpoint shard), see [`quantize`].
    Quantized(Arc<Quantized>),
}

/// How a tensor's bytes are read through ONNX `Transpose`: source `dims` (row-major, `item`-byte
/// elements) and `perm` (output axis k is source axis `perm[k]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    pub dims: Vec<usize>,
    pub perm: Vec<usize>,
    pub item: usize,
}

/// The most bytes of a computed tensor (transposed or scaled as it is written) produced at a time: the
/// writer's pipeline holds a few such pieces (see `prefetch`). A band of a transposed weight holds one
/// output row (its last axis) at least, so a weight whose single output row is larger makes larger pieces.
pub const PIECE_BYTES: usize = 2 << 20;

/// A part of a computed tensor's bytes, produced on its own and written in order: a band of output
/// rows of a transposed weight (`first..end` are output rows, every output axis but the last
/// flattened), or a range of a scaled one's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    first: usize,
    end: usize,
    len: usize,
}

impl Piece {
    /// Units `first..end` (what a unit is depends on the tensor) making `len` bytes.
    pub(crate) fn new(first: usize, end: usize, len: usize) -> Piece {
        Piece { first, end, len }
    }

    /// Its units, `first..end`.
    pub(crate) fn range(&self) -> (usize, usize) {
        (self.first, self.end)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl TensorData {
    /// `source` (row-major, shape `dims`, `item`-byte elements) read through ONNX `Transpose`'s `perm`:
    /// the same memory when only axes of size 1 move, a lazily permuted tensor otherwise. `perm` must
    /// be a permutation of the axes (see [`permute::is_permutation`]).
    pub fn transposed(
        source: Arc<dyn ByteSource>,
        dims: Vec<usize>,
        perm: Vec<usize>,
        item: usize,
    ) -> TensorData {
        if permute::is_identity(&dims, &perm) {
            TensorData::Borrowed(source)
        } else {
            TensorData::Transposed {
                source,
                dims,
                perm,
                item,
            }
        }
    }

    /// The bytes in place, when they are stored as written (None for a lazily transposed weight).
    pub fn as_slice(&self) -> Option<&[u8]> {
        match self {
            TensorData::Owned(v) => Some(v),
            TensorData::Borrowed(b) => Some(b.bytes()),
            TensorData::Transposed { .. }
            | TensorData::Fetched { .. }
            | TensorData::Deferred { .. }
            | TensorData::Referenced { .. }
            | TensorData::ChannelScaled { .. }
            | TensorData::Converted { .. }
            | TensorData::Quantized(_) => None,
        }
    }

    /// The bytes as written, copied (for small tensors: attributes, folding, tests).
    pub fn to_vec(&self) -> Vec<u8> {
        if let Some(s) = self.as_slice() {
            s.to_vec()
        } else {
            let mut out = Vec::with_capacity(self.len());
            // writing to a Vec cannot fail
            let _ = self.write_to(&mut out);
            out
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorData::Owned(v) => v.len(),
            TensorData::Borrowed(b) => b.bytes().len(),
            TensorData::Transposed { dims, item, .. } => dims.iter().product::<usize>() * item,
            TensorData::Deferred { len }
            | TensorData::Referenced { len, .. }
            | TensorData::Fetched { len, .. } => *len,
            TensorData::ChannelScaled { source, .. } => source.bytes().len(),
            TensorData::Converted { count, to, .. } => count * dtype::item_size(*to).unwrap_or(0),
            TensorData::Quantized(q) => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_borrowed(&self) -> bool {
        !matches!(self, TensorData::Owned(_))
    }

    pub fn is_deferred(&self) -> bool {
        matches!(self, TensorData::Deferred { .. })
    }

    /// Whether the bytes are referenced in another file, not written (see [`TensorData::Referenced`]).
    pub fn is_referenced(&self) -> bool {
        matches!(self, TensorData::Referenced { .. })
    }

    /// The memory the bytes live in, for weights seen through a buffer.
    pub fn source(&self) -> Option<&Arc<dyn ByteSource>> {
        match self {
            TensorData::Owned(_)
            | TensorData::Fetched { .. }
            | TensorData::Deferred { .. }
            | TensorData::Referenced { .. }
            | TensorData::Converted { .. }
            | TensorData::Quantized(_) => None,
            TensorData::Borrowed(s)
            | TensorData::Transposed { source: s, .. }
            | TensorData::ChannelScaled { source: s, .. } => Some(s),
        }
    }

    /// Whether the bytes take work to produce (anything but a plain copy of memory in place): such
    /// tensors are produced piece by piece, see [`TensorData::pieces`].
    pub fn is_computed(&self) -> bool {
        matches!(
            self,
            TensorData::Transposed { .. }
                | TensorData::ChannelScaled { .. }
                | TensorData::Fetched { .. }
                | TensorData::Converted { .. }
                | TensorData::Quantized(_)
        )
    }

    /// A host copy of a fetched tensor's bytes, checked against its length (None for the other kinds).
    pub fn fetch(&self) -> Option<io::Result<Arc<dyn ByteSource>>> {
        let TensorData::Fetched { fetch, len, .. } = self else {
            return None;
        };
        Some(fetch.fetch().and_then(|host| {
            if host.bytes().len() == *len {
                Ok(host)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a weight copied to the host has {} bytes, {len} were expected",
                        host.bytes().len()
                    ),
                ))
            }
        }))
    }

    /// The pieces a computed tensor's bytes are produced in, in order (none for the other kinds).
    pub fn pieces(&self) -> io::Result<Vec<Piece>> {
        match self {
            TensorData::Transposed {
                source,
                dims,
                perm,
                item,
            } => {
                if *item == 0 || self.len() != source.bytes().len() {
                    return Err(wrong_size("transposed"));
                }
                Ok(band_pieces(&Layout::new(dims, perm)?, *item))
            }
            TensorData::Fetched {
                permuted: Some(p), ..
            } => Ok(band_pieces(&Layout::new(&p.dims, &p.perm)?, p.item)),
            TensorData::Fetched { len, .. } => Ok((0..*len)
                .step_by(PIECE_BYTES)
                .map(|first| {
                    let end = (first + PIECE_BYTES).min(*len);
                    Piece {
                        first,
                        end,
                        len: end - first,
                    }
                })
                .collect()),
            TensorData::ChannelScaled {
                source,
                scale,
                inner,
            } => {
                let n = source.bytes().len();
                if scale
                    .len()
                    .checked_mul(*inner)
                    .and_then(|e| e.checked_mul(4))
                    != Some(n)
                {
                    return Err(wrong_size("scaled"));
                }
                let per = PIECE_BYTES / 4;
                let elements = n / 4;
                Ok((0..elements)
                    .step_by(per)
                    .map(|first| {
                        let end = (first + per).min(elements);
                        Piece {
                            first,
                            end,
                            len: (end - first) * 4,
                        }
                    })
                    .collect())
            }
            TensorData::Converted {
                count, from, to, ..
            } => {
                let (Some(a), Some(b)) = (dtype::item_size(*from), dtype::item_size(*to)) else {
                    return Err(wrong_size("converted"));
                };
                let per = PIECE_BYTES / a.max(b);
                Ok((0..*count)
                    .step_by(per)
                    .map(|first| {
                        let end = (first + per).min(*count);
                        Piece {
                            first,
                            end,
                            len: (end - first) * b,
                        }
                    })
                    .collect())
            }
            TensorData::Quantized(q) => Ok(q.pieces()),
            _ => Ok(Vec::new()),
        }
    }

    /// Produces `piece` (one of [`TensorData::pieces`]) into `out`, exactly `piece.len()` bytes; the
    /// fast paths need `out` aligned to 8 bytes (as [`piece_buffer`] gives it). A fetched tensor's
    /// pieces come from its host copy, `host` (see [`TensorData::fetch`]).
    pub fn fill_from(
        &self,
        host: Option<&Arc<dyn ByteSource>>,
        piece: Piece,
        out: &mut [u8],
    ) -> io::Result<()> {
        match (self, host) {
            (TensorData::Fetched { .. }, Some(host)) => match self.on_host(Arc::clone(host)) {
                TensorData::Borrowed(b) => {
                    if out.len() != piece.len {
                        return Err(io::Error::other("piece buffer of the wrong size"));
                    }
                    out.copy_from_slice(&b.bytes()[piece.first..piece.end]);
                    Ok(())
                }
                permuted => permuted.fill(piece, out),
            },
            _ => self.fill(piece, out),
        }
    }

    /// A fetched tensor's bytes as read from its host copy `host`: the copy itself, or the copy
    /// permuted as it is written (other kinds are returned as they are).
    fn on_host(&self, host: Arc<dyn ByteSource>) -> TensorData {
        match self {
            TensorData::Fetched {
                permuted: Some(p), ..
            } => TensorData::Transposed {
                source: host,
                dims: p.dims.clone(),
                perm: p.perm.clone(),
                item: p.item,
            },
            TensorData::Fetched { permuted: None, .. } => TensorData::Borrowed(host),
            other => other.clone(),
        }
    }

    /// Produces `piece` (one of [`TensorData::pieces`]) into `out`, exactly `piece.len()` bytes; the
    /// fast paths need `out` aligned to 8 bytes (as [`piece_buffer`] gives it).
    pub fn fill(&self, piece: Piece, out: &mut [u8]) -> io::Result<()> {
        if out.len() != piece.len {
            return Err(io::Error::other("piece buffer of the wrong size"));
        }
        match self {
            TensorData::Transposed {
                source,
                dims,
                perm,
                item,
            } => {
                let layout = Layout::new(dims, perm)?;
                let (src, item) = (source.bytes(), *item);
                let (r0, r1) = (piece.first, piece.end);
                let done = match item {
                    1 => permute::fill_typed::<u8>(&layout, src, r0, r1, out),
                    2 => permute::fill_typed::<u16>(&layout, src, r0, r1, out),
                    4 => permute::fill_typed::<u32>(&layout, src, r0, r1, out),
                    8 => permute::fill_typed::<u64>(&layout, src, r0, r1, out),
                    _ => false,
                };
                if !done {
                    permute::fill_bytes(&layout, src, item, r0, r1, out);
                }
                Ok(())
            }
            TensorData::ChannelScaled {
                source,
                scale,
                inner,
            } => {
                let src = &source.bytes()[piece.first * 4..piece.end * 4];
                for ((e, c), o) in (piece.first..)
                    .zip(src.chunks_exact(4))
                    .zip(out.chunks_exact_mut(4))
                {
                    let s = scale[e / *inner];
                    let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * s;
                    o.copy_from_slice(&v.to_le_bytes());
                }
                Ok(())
            }
            TensorData::Converted {
                file,
                offset,
                from,
                to,
                ..
            } => {
                let item = dtype::item_size(*from).unwrap_or(0);
                let mut src = vec![0u8; (piece.end - piece.first) * item];
                file.read_exact_at(&mut src, offset + (piece.first * item) as u64)?;
                convert_floats(&src, *from, *to, out)
            }
            TensorData::Quantized(q) => q.fill(piece, out),
            _ => Err(io::Error::other(
                "only computed tensors are produced piece by piece",
            )),
        }
    }

    /// Writes the bytes as they belong in the file (a computed tensor through one piece buffer, on
    /// the calling thread: the writer's pipeline produces them ahead instead, see `prefetch`).
    pub fn write_to<W: Write + ?Sized>(&self, w: &mut W) -> io::Result<()> {
        match self {
            TensorData::Owned(v) => w.write_all(v),
            TensorData::Borrowed(b) => w.write_all(b.bytes()),
            TensorData::Deferred { .. } => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a deferred weight (meta device) has no bytes to write",
            )),
            TensorData::Fetched { .. } => {
                let host = self
                    .fetch()
                    .unwrap_or_else(|| Err(io::Error::other("not fetched")))?;
                self.on_host(host).write_to(w)
            }
            TensorData::Referenced { location, .. } => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a weight referenced in {location:?} has no bytes here to write"),
            )),
            TensorData::Transposed { .. }
            | TensorData::ChannelScaled { .. }
            | TensorData::Converted { .. }
            | TensorData::Quantized(_) => {
                let mut buf = Vec::new();
                for piece in self.pieces()? {
                    let out = piece_buffer(&mut buf, piece.len());
                    self.fill(piece, out)?;
                    w.write_all(out)?;
                }
                Ok(())
            }
        }
    }
}

/// Bands of output rows of a permuted tensor, about [`PIECE_BYTES`] each (one row at least).
fn band_pieces(layout: &Layout, item: usize) -> Vec<Piece> {
    let rows = layout.rows();
    if rows == 0 {
        return Vec::new();
    }
    let row = layout.row_len() * item;
    let mut band = (PIECE_BYTES / row.max(1)).clamp(1, rows);
    if band >= TILE {
        band -= band % TILE; // whole tiles: the fast path of the transposition
    }
    (0..rows)
        .step_by(band)
        .map(|first| {
            let end = (first + band).min(rows);
            Piece {
                first,
                end,
                len: (end - first) * row,
            }
        })
        .collect()
}

/// Whether [`TensorData::Converted`] converts between these two types (float32, float16, bfloat16,
/// float64).
pub fn convertible(from: i32, to: i32) -> bool {
    let float = |t| {
        matches!(
            t,
            dtype::FLOAT | dtype::FLOAT16 | dtype::BFLOAT16 | dtype::DOUBLE
        )
    };
    float(from) && float(to)
}

/// Little-endian floats of type `from` in `src` converted to `to` into `out` (rounded to nearest
/// even, as torch's `.to()` does); every value goes through float64, which holds each of them exactly.
fn convert_floats(src: &[u8], from: i32, to: i32, out: &mut [u8]) -> io::Result<()> {
    if !convertible(from, to) {
        return Err(io::Error::other(format!(
            "no conversion from {} to {}",
            dtype::name(from),
            dtype::name(to)
        )));
    }
    let item = dtype::item_size(from).unwrap_or(1);
    let size = dtype::item_size(to).unwrap_or(1);
    for (c, o) in src.chunks_exact(item).zip(out.chunks_exact_mut(size)) {
        let v: f64 = match from {
            dtype::FLOAT => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            dtype::FLOAT16 => f64::from(half::f16::from_le_bytes([c[0], c[1]])),
            dtype::BFLOAT16 => f64::from(half::bf16::from_le_bytes([c[0], c[1]])),
            _ => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
        };
        match to {
            #[allow(clippy::cast_possible_truncation)]
            // the conversion asked for: rounds to nearest
            dtype::FLOAT => o.copy_from_slice(&(v as f32).to_le_bytes()),
            dtype::FLOAT16 => o.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            dtype::BFLOAT16 => o.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            _ => o.copy_from_slice(&v.to_le_bytes()),
        }
    }
    Ok(())
}

fn wrong_size(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{kind} tensor of the wrong size"),
    )
}

/// `len` bytes of `buf`, grown as needed: a piece buffer, 8-byte aligned (it is made of u64s) so that
/// any element type can be viewed in it.
pub fn piece_buffer(buf: &mut Vec<u64>, len: usize) -> &mut [u8] {
    buf.resize(len.div_ceil(8), 0);
    // SAFETY: any initialized u64 is valid as bytes, and u8 needs no alignment.
    let (_, bytes, _) = unsafe { buf.as_mut_slice().align_to_mut::<u8>() };
    &mut bytes[..len]
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            TensorData::Owned(_) => "owned",
            TensorData::Borrowed(_) => "borrowed",
            TensorData::Transposed { .. } => "transposed",
            TensorData::Fetched { .. } => "fetched",
            TensorData::Deferred { .. } => "deferred",
            TensorData::Referenced { .. } => "referenced",
            TensorData::ChannelScaled { .. } => "channel-scaled",
            TensorData::Converted { .. } => "converted",
            TensorData::Quantized(_) => "quantized",
        };
        write!(f, "TensorData({kind}, {} bytes)", self.len())
    }
}

/// An initializer or a tensor attribute.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: i32,
    pub dims: Vec<i64>,
    pub data: TensorData,
}

impl Tensor {
    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }
}

/// Checks that `len` bytes hold exactly a tensor of `dtype` and `dims`.
pub fn check_size(what: &str, dtype: i32, dims: &[i64], len: usize) -> crate::Result<()> {
    if let Some(d) = dims.iter().find(|d| **d < 0) {
        return Err(crate::error::graph_err(format!(
            "{what}: negative dimension {d} in shape {dims:?}"
        )));
    }
    let numel: i64 = dims.iter().product();
    let Some(expected) = crate::dtype::data_len(dtype, numel as usize) else {
        return Err(crate::error::graph_err(format!(
            "{what}: element type {dtype} ({}) cannot be stored as raw bytes",
            crate::dtype::name(dtype)
        )));
    };
    if expected != len {
        return Err(crate::error::graph_err(format!(
            "{what}: {len} bytes do not hold a {} tensor of shape {dims:?} ({expected} bytes expected)",
            crate::dtype::name(dtype)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converted_tensors_are_read_from_the_file_and_converted_in_pieces() {
        use std::io::Write as _;
        // more elements than one piece holds, behind a 5-byte prefix (an unaligned offset)
        let n = PIECE_BYTES / 4 + 7;
        let values: Vec<f32> = (0..n).map(|i| (i as f32) * 0.37 - 1000.5).collect();
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(b"head!").expect("write");
        for v in &values {
            file.write_all(&half::bf16::from_f32(*v).to_le_bytes())
                .expect("write");
        }
        let data = TensorData::Converted {
            file: Arc::new(file),
            offset: 5,
            count: n,
            from: dtype::BFLOAT16,
            to: dtype::FLOAT,
        };
        assert!(data.is_computed() && data.pieces().expect("pieces").len() > 1);
        let want: Vec<u8> = values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_f32().to_le_bytes())
            .collect();
        assert_eq!(data.len(), 4 * n);
        assert_eq!(data.to_vec(), want);
        // float32 -> float16 rounds to nearest even, as torch's .to() does
        let mut out = [0u8; 2];
        convert_floats(
            &1.000_976_6f32.to_le_bytes(),
            dtype::FLOAT,
            dtype::FLOAT16,
            &mut out,
        )
        .expect("convert");
        assert_eq!(
            half::f16::from_le_bytes(out),
            half::f16::from_f32(1.000_976_6)
        );
        assert!(convert_floats(&[0; 4], dtype::INT32, dtype::FLOAT, &mut [0; 4]).is_err());
    }

    #[test]
    fn four_bit_types_are_packed_two_per_byte() {
        use crate::dtype::{FLOAT4E2M1, FLOAT8E8M0, INT4, UINT4};
        for dtype in [FLOAT4E2M1, INT4, UINT4] {
            assert!(check_size("w", dtype, &[3, 4], 6).is_ok());
            assert!(check_size("w", dtype, &[3], 2).is_ok()); // an odd count pads the last byte
            assert!(check_size("w", dtype, &[3, 4], 12).is_err());
        }
        assert!(check_size("w", FLOAT8E8M0, &[3, 4], 12).is_ok());
    }

    #[test]
    fn transposed_weights_are_written_transposed() {
        for (rows, cols, item) in [
            (3, 5, 4),
            (1, 7, 2),
            (300, 9000, 4),
            (2048, 1100, 2),
            (128, 4096, 8),
            (2, 1, 8),
            (70, 33, 3),
            (40, 9, 1),
        ] {
            let src: Vec<u8> = (0..rows * cols * item)
                .map(|i| (i * 7 % 253) as u8)
                .collect();
            let mut want = Vec::new();
            for j in 0..cols {
                for i in 0..rows {
                    want.extend_from_slice(&src[(i * cols + j) * item..(i * cols + j + 1) * item]);
                }
            }
            let data = TensorData::Transposed {
                source: Arc::new(src),
                dims: vec![rows, cols],
                perm: vec![1, 0],
                item,
            };
            assert!(data.to_vec() == want, "{rows}x{cols}x{item}");
        }
    }

    /// Memory starting one byte into its allocation: no element type is aligned there.
    struct Unaligned(Vec<u8>);
    impl ByteSource for Unaligned {
        fn bytes(&self) -> &[u8] {
            &self.0[1..]
        }
    }

    #[test]
    fn unaligned_weights_take_the_byte_path_and_pieces_cover_them() {
        let (rows, cols) = (600, 900);
        let src: Vec<u8> = (0..=rows * cols * 4).map(|i| (i % 251) as u8).collect();
        let aligned = TensorData::Transposed {
            source: Arc::new(src[1..].to_vec()),
            dims: vec![rows, cols],
            perm: vec![1, 0],
            item: 4,
        };
        let unaligned = TensorData::Transposed {
            source: Arc::new(Unaligned(src)),
            dims: vec![rows, cols],
            perm: vec![1, 0],
            item: 4,
        };
        assert!(unaligned.to_vec() == aligned.to_vec());
        let pieces = unaligned.pieces().expect("pieces");
        assert!(pieces.len() > 1 && pieces.iter().all(|p| p.len() <= PIECE_BYTES));
        assert_eq!(
            pieces.iter().map(Piece::len).sum::<usize>(),
            unaligned.len()
        );
    }

    #[test]
    fn permuted_weights_are_written_in_bounded_pieces() {
        let dims = [3usize, 700, 600]; // 5 MB of u32: several pieces
        let src: Vec<u8> = (0..dims.iter().product::<usize>() as u32)
            .flat_map(u32::to_le_bytes)
            .collect();
        for perm in [[0usize, 2, 1], [2, 1, 0], [1, 0, 2]] {
            let data =
                TensorData::transposed(Arc::new(src.clone()), dims.to_vec(), perm.to_vec(), 4);
            let pieces = data.pieces().expect("pieces");
            assert!(pieces.len() > 1 && pieces.iter().all(|p| p.len() <= PIECE_BYTES));
            assert_eq!(pieces.iter().map(Piece::len).sum::<usize>(), src.len());
            let out = le_i32s(&data.to_vec());
            let od: Vec<usize> = perm.iter().map(|&a| dims[a]).collect();
            let mut k = 0;
            for x in 0..od[0] {
                for y in 0..od[1] {
                    for z in 0..od[2] {
                        let mut at = [0usize; 3];
                        at[perm[0]] = x;
                        at[perm[1]] = y;
                        at[perm[2]] = z;
                        let want = (at[0] * dims[1] + at[1]) * dims[2] + at[2];
                        assert_eq!(out[k] as usize, want, "perm {perm:?}");
                        k += 1;
                    }
                }
            }
        }
    }
}
