//! Tensor bytes: owned (small constants) or borrowed from memory someone else keeps alive (torch storage
//! seen through the buffer protocol), so that weights are never copied on their way to the file.

use std::fmt;
use std::io::{self, Write};
use std::sync::Arc;

/// Memory owned elsewhere and kept alive by the implementor, readable from any thread.
pub trait ByteSource: Send + Sync {
    fn bytes(&self) -> &[u8];
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
    /// A row-major (rows x cols) matrix of `item`-byte elements, stored transposed (cols x rows):
    /// the writer transposes it block by block, so the weight is never copied whole.
    Transposed {
        source: Arc<dyn ByteSource>,
        rows: usize,
        cols: usize,
        item: usize,
    },
    /// Bytes that are not here (a weight on the meta device): the writer leaves their place in the
    /// external data file empty, to be filled later (fastonnx.attach_weights).
    Deferred {
        len: usize,
    },
    /// A float32 tensor whose outer-dimension slice `o` (of `inner` elements) is multiplied by
    /// `scale[o]` as it is written: a convolution weight with a batch norm folded in, never copied whole.
    ChannelScaled {
        source: Arc<dyn ByteSource>,
        scale: Arc<Vec<f32>>,
        inner: usize,
    },
}

/// Extra memory the block transposition may use.
const TRANSPOSE_BLOCK_BYTES: usize = 8 << 20;

impl TensorData {
    /// The bytes in place, when they are stored as written (None for a lazily transposed weight).
    pub fn as_slice(&self) -> Option<&[u8]> {
        match self {
            TensorData::Owned(v) => Some(v),
            TensorData::Borrowed(b) => Some(b.bytes()),
            TensorData::Transposed { .. }
            | TensorData::Deferred { .. }
            | TensorData::ChannelScaled { .. } => None,
        }
    }

    /// The bytes as written, copied (for small tensors: attributes, folding, tests).
    pub fn to_vec(&self) -> Vec<u8> {
        match self.as_slice() {
            Some(s) => s.to_vec(),
            None => {
                let mut out = Vec::with_capacity(self.len());
                // writing to a Vec cannot fail
                let _ = self.write_to(&mut out);
                out
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorData::Owned(v) => v.len(),
            TensorData::Borrowed(b) => b.bytes().len(),
            TensorData::Transposed {
                rows, cols, item, ..
            } => rows * cols * item,
            TensorData::Deferred { len } => *len,
            TensorData::ChannelScaled { source, .. } => source.bytes().len(),
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

    /// The memory the bytes live in, for weights seen through a buffer.
    pub fn source(&self) -> Option<&Arc<dyn ByteSource>> {
        match self {
            TensorData::Owned(_) | TensorData::Deferred { .. } => None,
            TensorData::Borrowed(s)
            | TensorData::Transposed { source: s, .. }
            | TensorData::ChannelScaled { source: s, .. } => Some(s),
        }
    }

    /// Writes the bytes as they belong in the file.
    pub fn write_to<W: Write + ?Sized>(&self, w: &mut W) -> io::Result<()> {
        match self {
            TensorData::Owned(v) => w.write_all(v),
            TensorData::Borrowed(b) => w.write_all(b.bytes()),
            TensorData::Transposed {
                source,
                rows,
                cols,
                item,
            } => write_transposed(source.bytes(), *rows, *cols, *item, w),
            TensorData::Deferred { .. } => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a deferred weight (meta device) has no bytes to write",
            )),
            TensorData::ChannelScaled {
                source,
                scale,
                inner,
            } => write_scaled(source.bytes(), scale, *inner, w),
        }
    }
}

/// Writes float32 `src`, slice `o` of `inner` elements multiplied by `scale[o]`, through a small buffer.
fn write_scaled<W: Write + ?Sized>(
    src: &[u8],
    scale: &[f32],
    inner: usize,
    w: &mut W,
) -> io::Result<()> {
    if src.len() != scale.len() * inner * 4 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "scaled tensor of the wrong size",
        ));
    }
    let mut buf: Vec<u8> = Vec::with_capacity((inner * 4).min(TRANSPOSE_BLOCK_BYTES));
    for (o, s) in scale.iter().enumerate() {
        for chunk in src[o * inner * 4..(o + 1) * inner * 4].chunks(TRANSPOSE_BLOCK_BYTES) {
            buf.clear();
            buf.extend(
                chunk
                    .chunks_exact(4)
                    .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * s).to_le_bytes()),
            );
            w.write_all(&buf)?;
        }
    }
    Ok(())
}

/// Writes the (cols x rows) transpose of a row-major (rows x cols) matrix, a band of output rows at a
/// time through a buffer of at most TRANSPOSE_BLOCK_BYTES, copying tile by tile so that both the
/// reads and the writes stay in cache.
fn write_transposed<W: Write + ?Sized>(
    src: &[u8],
    rows: usize,
    cols: usize,
    item: usize,
    w: &mut W,
) -> io::Result<()> {
    if rows * cols * item != src.len() || item == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "transposed tensor of the wrong size",
        ));
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    match item {
        1 => transpose_typed::<u8, W>(src, rows, cols, w),
        2 => transpose_typed::<u16, W>(src, rows, cols, w),
        4 => transpose_typed::<u32, W>(src, rows, cols, w),
        8 => transpose_typed::<u64, W>(src, rows, cols, w),
        _ => transpose_bytes(src, rows, cols, item, w),
    }
}

/// Plain integer element types: any bit pattern is valid, so byte buffers can be viewed as them.
trait Pod: Copy + Default + Send + Sync {}
impl Pod for u8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for u64 {}

fn transpose_typed<T: Pod, W: Write + ?Sized>(
    src: &[u8],
    rows: usize,
    cols: usize,
    w: &mut W,
) -> io::Result<()> {
    // SAFETY: T is a plain integer type (every bit pattern valid); align_to only returns the aligned middle.
    let (head, typed, tail) = unsafe { src.align_to::<T>() };
    if !head.is_empty() || !tail.is_empty() {
        return transpose_bytes(src, rows, cols, std::mem::size_of::<T>(), w);
    }
    let item = std::mem::size_of::<T>();
    // two band buffers share the memory budget: one being written while the other is filled
    let band = (TRANSPOSE_BLOCK_BYTES / 2 / (rows * item)).clamp(1, cols);
    let bands: Vec<(usize, usize)> = (0..cols)
        .step_by(band)
        .map(|j0| (j0, (j0 + band).min(cols)))
        .collect();
    if bands.len() == 1 || rows * cols < PIPELINE_MIN_ELEMENTS {
        let mut buf: Vec<T> = vec![T::default(); band * rows];
        for &(j0, j1) in &bands {
            let out = &mut buf[..(j1 - j0) * rows];
            fill_band(typed, rows, cols, j0, j1, out);
            w.write_all(as_bytes(out))?;
        }
        return Ok(());
    }
    // A worker transposes band k+1 while this thread writes band k: the write (a copy into the page
    // cache, or a wait on the disk) and the transposition overlap instead of taking turns.
    std::thread::scope(|scope| {
        let (filled_tx, filled_rx) = std::sync::mpsc::sync_channel::<(Vec<T>, usize)>(1);
        let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<T>>(2);
        for _ in 0..2 {
            // cannot fail: the channel has room for both and its receiver is alive
            let _ = empty_tx.send(vec![T::default(); band * rows]);
        }
        let jobs = bands.clone();
        scope.spawn(move || {
            for (j0, j1) in jobs {
                // a closed channel means the writer stopped on an error: nothing left to do
                let Ok(mut buf) = empty_rx.recv() else { return };
                let len = (j1 - j0) * rows;
                fill_band(typed, rows, cols, j0, j1, &mut buf[..len]);
                if filled_tx.send((buf, len)).is_err() {
                    return;
                }
            }
        });
        for _ in &bands {
            let (buf, len) = filled_rx
                .recv()
                .map_err(|_| io::Error::other("the transposing thread stopped early"))?;
            w.write_all(as_bytes(&buf[..len]))?;
            let _ = empty_tx.send(buf); // the worker may have finished: the buffer is then dropped
        }
        Ok(())
    })
}

/// Matrices smaller than this are transposed and written on the calling thread alone.
const PIPELINE_MIN_ELEMENTS: usize = 1 << 18;

fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: viewing initialized plain integers as bytes is always valid.
    let (_, bytes, _) = unsafe { v.align_to::<u8>() };
    bytes
}

/// Output rows j0..j1 of the transpose (out[(j - j0) * rows + i] = src[i * cols + j]), tile by tile.
/// Each TILE x TILE tile is transposed inside a small buffer that stays in L1 (8 x 8 blocks held in
/// registers where the tile is whole), then copied out a row at a time: writing a tile straight to
/// `out` touches TILE lines `rows` elements apart, which for power-of-two sizes all fall in one
/// cache set and evict each other.
fn fill_band<T: Pod>(src: &[T], rows: usize, cols: usize, j0: usize, j1: usize, out: &mut [T]) {
    const TILE: usize = 64;
    const BLOCK: usize = 8;
    let mut tile = [T::default(); TILE * TILE];
    for ib in (0..rows).step_by(TILE) {
        let h = (ib + TILE).min(rows) - ib;
        for jb in (j0..j1).step_by(TILE) {
            let w = (jb + TILE).min(j1) - jb;
            if h == TILE && w == TILE {
                for bi in (0..TILE).step_by(BLOCK) {
                    for bj in (0..TILE).step_by(BLOCK) {
                        let mut block = [[T::default(); BLOCK]; BLOCK];
                        for (r, line) in block.iter_mut().enumerate() {
                            let at = (ib + bi + r) * cols + jb + bj;
                            line.copy_from_slice(&src[at..at + BLOCK]);
                        }
                        for c in 0..BLOCK {
                            let at = (bj + c) * TILE + bi;
                            for (r, line) in block.iter().enumerate() {
                                tile[at + r] = line[c];
                            }
                        }
                    }
                }
            } else {
                for di in 0..h {
                    let row = &src[(ib + di) * cols + jb..][..w];
                    for (dj, v) in row.iter().enumerate() {
                        tile[dj * TILE + di] = *v;
                    }
                }
            }
            for dj in 0..w {
                let at = (jb - j0 + dj) * rows + ib;
                out[at..at + h].copy_from_slice(&tile[dj * TILE..dj * TILE + h]);
            }
        }
    }
}

/// The general case (odd element sizes or unaligned memory): element by element.
fn transpose_bytes<W: Write + ?Sized>(
    src: &[u8],
    rows: usize,
    cols: usize,
    item: usize,
    w: &mut W,
) -> io::Result<()> {
    let band = (TRANSPOSE_BLOCK_BYTES / (rows * item)).clamp(1, cols);
    let mut buf = vec![0u8; band * rows * item];
    let mut j0 = 0;
    while j0 < cols {
        let j1 = (j0 + band).min(cols);
        for i in 0..rows {
            let row = &src[(i * cols + j0) * item..(i * cols + j1) * item];
            for (dj, elem) in row.chunks_exact(item).enumerate() {
                let at = (dj * rows + i) * item;
                buf[at..at + item].copy_from_slice(elem);
            }
        }
        w.write_all(&buf[..(j1 - j0) * rows * item])?;
        j0 = j1;
    }
    Ok(())
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            TensorData::Owned(_) => "owned",
            TensorData::Borrowed(_) => "borrowed",
            TensorData::Transposed { .. } => "transposed",
            TensorData::Deferred { .. } => "deferred",
            TensorData::ChannelScaled { .. } => "channel-scaled",
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

    struct Mem(Vec<u8>);
    impl ByteSource for Mem {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
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
                source: Arc::new(Mem(src)),
                rows,
                cols,
                item,
            };
            assert!(data.to_vec() == want, "{rows}x{cols}x{item}");
        }
    }
}
