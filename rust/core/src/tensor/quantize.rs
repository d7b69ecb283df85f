//! Weight-only block quantization, computed by the writer while it streams (`to_onnx(quantize=...)`).
//!
//! A product's float weight `W` (logically `[N, K]`: `N` outputs, `K` inputs, stored `[N, K]` as a
//! Linear keeps it or `[K, N]` as a MatMul reads it) is cut along K into blocks of `block` values;
//! each block gets a scale (and, asymmetric, a zero point) and its values are rounded to the nearest
//! code (`f32::round_ties_even`, as `torch.round`):
//!
//! - symmetric: `m` the block's value of largest magnitude (the negative one when both signs reach it),
//!   `scale = m / -2^(bits-1)` (negative when `m` is: the whole code range `[-8, 7]` / `[-128, 127]`
//!   is used, `m` itself coded as -8 / -128), `q = clamp(round(w / scale), -2^(bits-1),
//!   2^(bits-1) - 1)`, `w ≈ q * scale`;
//! - asymmetric: `lo = min(min w, 0)`, `hi = max(max w, 0)`, `scale = (hi - lo) / L` (L 15 or 255),
//!   `zp = clamp(round(-lo / scale), 0, L)`, `q = clamp(round(w / scale) + zp, 0, L)`,
//!   `w ≈ (q - zp) * scale`;
//!
//! all in float32, the scale first rounded to its stored type (float16 / bfloat16 for such graphs),
//! and a block whose scale is 0 (all zeros) gets codes 0 (and zero point 0).
//!
//! The three tensors of one weight (codes, scales, zero points) are [`TensorData::Quantized`]s of
//! their own, each produced piece by piece from the float source by [`Quantized::fill`]: a piece is
//! a run of whole blocks (never a part of one, so a 4-bit byte never straddles two pieces), for which
//! the source values are read (from memory, or from a checkpoint shard with `pread`) into one float32
//! buffer of at most [`PIECE_ELEMENTS`] values, quantized, and dropped. No side buffer carries scales
//! from the codes to the scales tensor: each tensor computes a block's parameters again from the same
//! values with the same arithmetic, so they agree bit for bit whichever is written first; the source
//! is read once per tensor (two or three times per weight: the parameters' pass is a vectorized
//! min / max, cheap beside the codes'), the memory never holds more than one piece of it.
//!
//! Two layouts ([`Form`]):
//! - `DequantizeLinear` (opset 21, `axis = 0`, `block_size`): codes `[K, N]` (int4 / int8
//!   symmetric, uint4 / uint8 with zero points), scales and zero points `[ceil(K / block), N]`; a
//!   piece is a run of block rows (all N columns of `block` rows of K).
//! - `com.microsoft.MatMulNBits`: codes uint8 `[N, ceil(K / block), block * bits / 8]` (unsigned,
//!   low nibble first; symmetric codes are stored shifted by `2^(bits-1)`, the operator's default
//!   zero point; the tail block padded with zero bytes), scales `[N * ceil(K / block)]`, zero points
//!   uint8 `[N * ceil(ceil(K / block) * bits / 8)]` (4 bits: two per byte, each row padded to a
//!   byte); a piece is a run of rows of N.
//!
//! [`TensorData::Quantized`]: super::TensorData::Quantized

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::{ByteSource, Piece, PIECE_BYTES};
use crate::dtype;
use crate::error::{graph_err, Result};

/// The most float32 values of the source read for one piece (2 MiB of them), but see
/// [`Quantized::pieces`].
pub const PIECE_ELEMENTS: usize = PIECE_BYTES / 4;

/// The fewest values of each source row a DequantizeLinear piece reads (see [`Quantized::pieces`]).
pub const MIN_ROW_VALUES: usize = 512;

/// Bits, block size and symmetry of a block quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQuant {
    pub bits: u32,
    pub block: usize,
    pub symmetric: bool,
}

impl BlockQuant {
    /// Checked: 4 or 8 bits, a block a power of two from 16 to 256.
    pub fn new(bits: u32, block: usize, symmetric: bool) -> Result<BlockQuant> {
        if bits != 4 && bits != 8 {
            return Err(graph_err(format!(
                "quantization bits must be 4 or 8, not {bits}"
            )));
        }
        if !(16..=256).contains(&block) || !block.is_power_of_two() {
            return Err(graph_err(format!(
                "quantization block size must be a power of two from 16 to 256, not {block}"
            )));
        }
        Ok(BlockQuant {
            bits,
            block,
            symmetric,
        })
    }

    /// The largest signed code (symmetric).
    fn qmax(&self) -> f32 {
        if self.bits == 4 {
            7.0
        } else {
            127.0
        }
    }

    /// The largest unsigned code (asymmetric).
    fn levels(&self) -> f32 {
        if self.bits == 4 {
            15.0
        } else {
            255.0
        }
    }

    /// The scale and zero point of one block (`round_scale` rounds a scale to its stored type): the
    /// definition, against which the writer's vectorized [`BlockQuant::params_fast`] is tested.
    #[cfg(test)]
    pub fn params(&self, values: &[f32], round_scale: impl Fn(f32) -> f32) -> (f32, i32) {
        let lo = values.iter().fold(0f32, |m, &v| m.min(v));
        let hi = values.iter().fold(0f32, |m, &v| m.max(v));
        self.params_of(lo, hi, round_scale)
    }

    /// The scale and zero point of a block whose extremes (with 0) are `lo` and `hi`.
    fn params_of(&self, lo: f32, hi: f32, round_scale: impl Fn(f32) -> f32) -> (f32, i32) {
        if self.symmetric {
            let extreme = if hi > -lo { hi } else { lo };
            (round_scale(extreme / -(self.qmax() + 1.0)), 0)
        } else {
            let scale = round_scale((hi - lo) / self.levels());
            if scale == 0.0 || !scale.is_finite() {
                return (scale, 0);
            }
            let zp = (-lo / scale).round_ties_even().clamp(0.0, self.levels());
            #[allow(clippy::cast_possible_truncation)] // clamped to 0..=255
            (scale, zp as i32)
        }
    }

    /// The code of `v` in a block of `scale` and zero point `zp`: signed when symmetric, unsigned
    /// (zero point included) otherwise: the definition [`BlockQuant::codes_into`] is tested against.
    #[cfg(test)]
    pub fn code(&self, v: f32, scale: f32, zp: i32) -> i32 {
        if scale == 0.0 || !scale.is_finite() {
            return if self.symmetric { 0 } else { zp };
        }
        let r = (v / scale).round_ties_even();
        #[allow(clippy::cast_possible_truncation)] // clamped to the code range
        if self.symmetric {
            r.clamp(-self.qmax() - 1.0, self.qmax()) as i32
        } else {
            (r + zp as f32).clamp(0.0, self.levels()) as i32
        }
    }
}

/// Where a weight's float bytes are: in memory (a borrowed weight) or in a file (a checkpoint shard,
/// read with `pread` a piece at a time).
#[derive(Clone)]
pub enum FloatBytes {
    Memory(Arc<dyn ByteSource>),
    File {
        file: Arc<File>,
        offset: u64,
    },
    /// Weights of the same `k` and float type stacked along `n`, in order: the products of one input
    /// packed into one (see `passes::packed_products`); each part is read where it is.
    Stacked(Arc<[FloatMatrix]>),
}

/// A float weight of logical shape `[n, k]` (n outputs, k inputs), stored row-major `[n, k]` or, when
/// `k_major`, `[k, n]`; elements of float type `dtype` (float32, float16, bfloat16, float64).
#[derive(Clone)]
pub struct FloatMatrix {
    pub bytes: FloatBytes,
    pub dtype: i32,
    pub n: usize,
    pub k: usize,
    pub k_major: bool,
}

impl FloatMatrix {
    fn item(&self) -> io::Result<usize> {
        match self.dtype {
            dtype::FLOAT | dtype::FLOAT16 | dtype::BFLOAT16 | dtype::DOUBLE => {
                Ok(dtype::item_size(self.dtype).unwrap_or(4))
            }
            t => Err(io::Error::other(format!(
                "no quantization of {} weights",
                dtype::name(t)
            ))),
        }
    }

    /// The stored size in bytes.
    pub fn byte_len(&self) -> usize {
        self.n * self.k * self.item().unwrap_or(0)
    }

    /// Weights stacked along `n` (see [`FloatBytes::Stacked`]); None unless they share `k` and their
    /// float type.
    pub fn stacked(parts: Vec<FloatMatrix>) -> Option<FloatMatrix> {
        let first = parts.first()?;
        let (k, dtype) = (first.k, first.dtype);
        if parts.iter().any(|p| p.k != k || p.dtype != dtype) {
            return None;
        }
        Some(FloatMatrix {
            n: parts.iter().map(|p| p.n).sum(),
            k,
            dtype,
            k_major: false,
            bytes: FloatBytes::Stacked(parts.into()),
        })
    }

    /// Values `[n0, n1) x [k0, k1)` as float32, in `[n][k]` order.
    pub fn read(&self, n0: usize, n1: usize, k0: usize, k1: usize) -> io::Result<Vec<f32>> {
        if let FloatBytes::Stacked(parts) = &self.bytes {
            // each part's rows in `[n][k]` order, one part after another: the stack's rows in order
            let mut values = Vec::with_capacity(n1.saturating_sub(n0) * k1.saturating_sub(k0));
            let mut start = 0;
            for part in parts.iter() {
                let (lo, hi) = (n0.max(start), n1.min(start + part.n));
                if lo < hi {
                    values.extend(part.read(lo - start, hi - start, k0, k1)?);
                }
                start += part.n;
            }
            return Ok(values);
        }
        let item = self.item()?;
        // rows and columns as stored
        let (r0, r1, c0, c1, cols) = if self.k_major {
            (k0, k1, n0, n1, self.n)
        } else {
            (n0, n1, k0, k1, self.k)
        };
        let width = c1 - c0;
        let count = (r1 - r0) * width;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        if r1 > r0 && width > 0 {
            if let FloatBytes::Memory(m) = &self.bytes {
                if m.bytes().len() != self.byte_len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "quantized weight of the wrong size",
                    ));
                }
            }
            if c0 == 0 && c1 == cols {
                spans.push((r0 * cols * item, count * item));
            } else {
                spans.extend((r0..r1).map(|r| ((r * cols + c0) * item, width * item)));
            }
        }
        let values = match self.dtype {
            dtype::FLOAT => {
                // read straight into the float32 buffer: no byte copy to decode
                let mut v = vec![0f32; count];
                self.gather(&spans, as_bytes(&mut v))?;
                for x in &mut v {
                    *x = f32::from_bits(u32::from_le(x.to_bits())); // nothing to do on x86
                }
                v
            }
            dtype::BFLOAT16 | dtype::FLOAT16 => {
                // two-byte floats read as u16 words, widened in a loop the compiler vectorizes
                let mut words = vec![0u16; count];
                self.gather(&spans, as_bytes(&mut words))?;
                let mut v = vec![0f32; count];
                if self.dtype == dtype::BFLOAT16 {
                    // bfloat16 is the top half of a float32
                    for (x, &w) in v.iter_mut().zip(&words) {
                        *x = f32::from_bits(u32::from(u16::from_le(w)) << 16);
                    }
                } else {
                    for w in &mut words {
                        *w = u16::from_le(*w);
                    }
                    words
                        .reinterpret_cast::<half::f16>()
                        .convert_to_f32_slice(&mut v);
                }
                v
            }
            _ => {
                // float64 (the only other type `item` takes), rounded to nearest
                let mut wide = vec![0f64; count];
                self.gather(&spans, as_bytes(&mut wide))?;
                #[allow(clippy::cast_possible_truncation)] // rounds to nearest, as asked
                wide.iter()
                    .map(|&x| f64::from_bits(u64::from_le(x.to_bits())) as f32)
                    .collect()
            }
        };
        if !self.k_major {
            return Ok(values);
        }
        // stored [k][n]: to [n][k]
        let (kw, nw) = (r1 - r0, width);
        let mut out = vec![0f32; values.len()];
        for kk in 0..kw {
            for nn in 0..nw {
                out[nn * kw + kk] = values[kk * nw + nn];
            }
        }
        Ok(out)
    }
}

impl FloatMatrix {
    /// The stored bytes of `spans` (offset, length) one after another into `dst`.
    fn gather(&self, spans: &[(usize, usize)], dst: &mut [u8]) -> io::Result<()> {
        let mut at = 0;
        for &(start, len) in spans {
            let out = &mut dst[at..at + len];
            match &self.bytes {
                FloatBytes::Memory(m) => out.copy_from_slice(&m.bytes()[start..start + len]),
                FloatBytes::File { file, offset } => {
                    file.read_exact_at(out, offset + start as u64)?;
                }
                FloatBytes::Stacked(_) => {
                    return Err(io::Error::other("stacked weights are read part by part"));
                }
            }
            at += len;
        }
        Ok(())
    }
}

/// Number types every bit pattern of which is a value.
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for f64 {}

/// The bytes of a buffer of plain numbers (to read file bytes straight into it).
fn as_bytes<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: u8 has alignment 1, so the whole buffer is the middle slice; every bit pattern is a
    // valid value of a Plain type
    let (_, bytes, _) = unsafe { v.align_to_mut::<u8>() };
    bytes
}

/// The graph form the quantized weight is read by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `DequantizeLinear(axis = 0, block_size)` of `[K, N]` codes, then MatMul.
    Dequantize,
    /// `com.microsoft.MatMulNBits`.
    MatMulNBits,
}

/// Which of a quantized weight's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Codes,
    Scales,
    ZeroPoints,
}

/// One tensor of a quantized weight, computed from its float source as it is written.
#[derive(Clone)]
pub struct Quantized {
    pub source: FloatMatrix,
    pub quant: BlockQuant,
    pub form: Form,
    pub part: Part,
    /// float32, float16 or bfloat16: the type the scales are stored in (the graph's)
    pub scale_dtype: i32,
}

impl Quantized {
    /// Number of blocks along K.
    pub fn blocks(&self) -> usize {
        self.source.k.div_ceil(self.quant.block)
    }

    fn blob(&self) -> usize {
        self.quant.block * self.quant.bits as usize / 8
    }

    /// Bytes of one MatMulNBits zero-point row.
    fn zp_row(&self) -> usize {
        (self.blocks() * self.quant.bits as usize).div_ceil(8)
    }

    /// The ONNX element type of this tensor.
    pub fn dtype(&self) -> i32 {
        let q = self.quant;
        match (self.part, self.form) {
            (Part::Scales, _) => self.scale_dtype,
            (_, Form::MatMulNBits) => dtype::UINT8,
            (Part::Codes, Form::Dequantize) if q.symmetric => {
                if q.bits == 4 {
                    dtype::INT4
                } else {
                    dtype::INT8
                }
            }
            _ => {
                if q.bits == 4 {
                    dtype::UINT4
                } else {
                    dtype::UINT8
                }
            }
        }
    }

    /// The tensor's dims.
    pub fn dims(&self) -> Vec<i64> {
        let (n, k, nb) = (self.source.n, self.source.k, self.blocks());
        let d = |v: usize| v as i64;
        match (self.form, self.part) {
            (Form::Dequantize, Part::Codes) => vec![d(k), d(n)],
            (Form::Dequantize, _) => vec![d(nb), d(n)],
            (Form::MatMulNBits, Part::Codes) => vec![d(n), d(nb), d(self.blob())],
            (Form::MatMulNBits, Part::Scales) => vec![d(n * nb)],
            (Form::MatMulNBits, Part::ZeroPoints) => vec![d(n * self.zp_row())],
        }
    }

    /// The tensor's size in bytes.
    pub fn len(&self) -> usize {
        let numel = self.dims().iter().product::<i64>().max(0) as usize;
        dtype::data_len(self.dtype(), numel).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of the piece unit: block rows of K (DequantizeLinear) or rows of N (MatMulNBits).
    fn units(&self) -> usize {
        match self.form {
            Form::Dequantize => self.blocks(),
            Form::MatMulNBits => self.source.n,
        }
    }

    /// Source values one unit reads.
    fn unit_elements(&self) -> usize {
        match self.form {
            Form::Dequantize => self.quant.block * self.source.n,
            Form::MatMulNBits => self.source.k,
        }
    }

    /// Byte offset in the tensor where unit `u` starts (`u` even for 4-bit DequantizeLinear
    /// zero points, see [`Quantized::pieces_of`]).
    fn offset(&self, u: usize) -> usize {
        let (n, k, nb) = (self.source.n, self.source.k, self.blocks());
        let elements = |e: usize| dtype::data_len(self.dtype(), e).unwrap_or(0);
        match (self.form, self.part) {
            (Form::Dequantize, Part::Codes) => elements((u * self.quant.block).min(k) * n),
            (Form::Dequantize, _) => elements(u * n),
            (Form::MatMulNBits, Part::Codes) => u * nb * self.blob(),
            (Form::MatMulNBits, Part::Scales) => elements(u * nb),
            (Form::MatMulNBits, Part::ZeroPoints) => u * self.zp_row(),
        }
    }

    /// The pieces, each at most `budget` source values (one unit at least; an even number of units
    /// where 4-bit values of two units could share a byte).
    pub fn pieces_of(&self, budget: usize) -> Vec<Piece> {
        let units = self.units();
        let mut step = (budget / self.unit_elements().max(1)).clamp(1, units.max(1));
        // 4-bit zero points of `[blocks, N]`: an odd N puts two block rows in one byte
        let shared_bytes = self.form == Form::Dequantize && self.part == Part::ZeroPoints;
        if shared_bytes && self.quant.bits == 4 && step % 2 == 1 && step < units {
            step += 1;
        }
        (0..units)
            .step_by(step)
            .map(|first| {
                let end = (first + step).min(units);
                Piece::new(first, end, self.offset(end) - self.offset(first))
            })
            .collect()
    }

    /// The pieces the writer produces: at most [`PIECE_ELEMENTS`] source values, except that a
    /// DequantizeLinear piece reads at least [`MIN_ROW_VALUES`] values of each of the N source rows
    /// (each row is one read: a few dozen bytes a read made a wide weight's standard form 3x slower
    /// than its MatMulNBits form); so a weight with N above 1024 takes pieces of up to
    /// `512 * N` float32 values (16 MiB at N = 8192).
    pub fn pieces(&self) -> Vec<Piece> {
        let budget = match self.form {
            Form::Dequantize => PIECE_ELEMENTS.max(MIN_ROW_VALUES * self.source.n),
            Form::MatMulNBits => PIECE_ELEMENTS,
        };
        self.pieces_of(budget)
    }

    fn round_scale(&self) -> impl Fn(f32) -> f32 {
        let t = self.scale_dtype;
        move |s: f32| match t {
            dtype::FLOAT16 => half::f16::from_f32(s).to_f32(),
            dtype::BFLOAT16 => half::bf16::from_f32(s).to_f32(),
            _ => s,
        }
    }

    fn put_scale(&self, out: &mut [u8], index: usize, s: f32) {
        match self.scale_dtype {
            dtype::FLOAT16 => {
                out[index * 2..index * 2 + 2]
                    .copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
            }
            dtype::BFLOAT16 => {
                out[index * 2..index * 2 + 2]
                    .copy_from_slice(&half::bf16::from_f32(s).to_le_bytes());
            }
            _ => out[index * 4..index * 4 + 4].copy_from_slice(&s.to_le_bytes()),
        }
    }

    /// Rows `r0..r1` of the piece `first..end` (rows of N; of the piece's N rows for MatMulNBits):
    /// their values read, every block's parameters, and, for the codes, the codes (a byte each, in
    /// the values' order `[row][k]`: two's complement when symmetric).
    fn compute_rows(&self, first: usize, end: usize, r0: usize, r1: usize) -> io::Result<Rows> {
        let q = self.quant;
        let (k, bs) = (self.source.k, q.block);
        let (kw, values) = match self.form {
            Form::Dequantize => {
                let (k0, k1) = ((first * bs).min(k), (end * bs).min(k));
                (k1 - k0, self.source.read(r0, r1, k0, k1)?)
            }
            Form::MatMulNBits => (k, self.source.read(first + r0, first + r1, 0, k)?),
        };
        let round = self.round_scale();
        let mut params = Vec::with_capacity((r1 - r0) * kw.div_ceil(bs));
        for row in values.chunks(kw.max(1)) {
            params.extend(row.chunks(bs).map(|b| q.params_fast(b, &round)));
        }
        let mut codes = Vec::new();
        if self.part == Part::Codes {
            codes = vec![0u8; values.len()];
            let per_row = kw.div_ceil(bs);
            for row in 0..(r1 - r0) {
                for j in 0..per_row {
                    let at = row * kw + j * bs;
                    let len = bs.min(kw - j * bs);
                    let (scale, zp) = params[row * per_row + j];
                    q.codes_into(&values[at..at + len], scale, zp, &mut codes[at..at + len]);
                }
            }
        }
        Ok((params, codes))
    }

    /// Produces units `piece.first..piece.end` into `out` (exactly the piece's length).
    ///
    /// The piece's float values are read once into `[rows][kw]` (rows of N, K within the piece),
    /// every block's parameters computed in one pass over them, and, for the codes, each block's
    /// codes computed into a byte buffer in the same order, then laid out (transposed to `[K, N]` for
    /// DequantizeLinear, row by row for MatMulNBits) and packed two to a byte for 4 bits.
    pub fn fill(&self, piece: Piece, out: &mut [u8]) -> io::Result<()> {
        let (first, end) = piece.range();
        if out.len() != self.offset(end) - self.offset(first) || end > self.units() {
            return Err(io::Error::other("piece buffer of the wrong size"));
        }
        out.fill(0);
        let q = self.quant;
        let (n, k, bs) = (self.source.n, self.source.k, q.block);
        let (rows, kw) = match self.form {
            Form::Dequantize => (n, (end * bs).min(k) - (first * bs).min(k)),
            Form::MatMulNBits => (end - first, k),
        };
        // blocks per row within the piece
        let per_row = kw.div_ceil(bs);
        // the rows split among threads (reads included): each row's blocks are its own
        let threads = quantizing_threads(rows * kw).min(rows.max(1));
        let (params, codes) = if threads <= 1 {
            self.compute_rows(first, end, 0, rows)?
        } else {
            let step = rows.div_ceil(threads);
            // the other rows on new threads, the first on this one, already running (a new thread
            // may wait for a core: see hook::run_beside)
            let parts: Vec<io::Result<Rows>> = std::thread::scope(|s| {
                let handles: Vec<_> = (step..rows)
                    .step_by(step)
                    .map(|r0| {
                        s.spawn(move || self.compute_rows(first, end, r0, (r0 + step).min(rows)))
                    })
                    .collect();
                let mine = self.compute_rows(first, end, 0, step.min(rows));
                std::iter::once(mine)
                    .chain(handles.into_iter().map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(io::Error::other("a quantizing thread panicked"))
                        })
                    }))
                    .collect()
            });
            let (mut params, mut codes) = (Vec::new(), Vec::new());
            for part in parts {
                let (p, c) = part?;
                params.extend(p);
                codes.extend(c);
            }
            (params, codes)
        };
        let bits = q.bits as usize;
        let nb = self.blocks();
        // the nibble (4 bits) or byte (8 bits) at element `e` of `out`
        let put = |out: &mut [u8], e: usize, v: u8| {
            if bits == 4 {
                out[e / 2] |= (v & 0x0F) << (4 * (e % 2));
            } else {
                out[e] = v;
            }
        };
        // where block `j` of row `r` of the piece goes among the piece's scales / zero points
        let param_index = |r: usize, j: usize| match self.form {
            Form::Dequantize => j * n + r,
            Form::MatMulNBits => r * nb + j,
        };
        match self.part {
            Part::Scales => {
                for (i, &(scale, _)) in params.iter().enumerate() {
                    self.put_scale(out, param_index(i / per_row, i % per_row), scale);
                }
            }
            Part::ZeroPoints => {
                for (i, &(_, zp)) in params.iter().enumerate() {
                    let (r, j) = (i / per_row, i % per_row);
                    let e = match self.form {
                        // each MatMulNBits row of zero points starts on a byte
                        Form::MatMulNBits => r * self.zp_row() * (8 / bits) + j,
                        Form::Dequantize => param_index(r, j),
                    };
                    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)] // 0..=255
                    put(out, e, zp as u8);
                }
            }
            Part::Codes => {
                // the codes as compute_rows made them (a byte each, `[row][k]`, two's complement
                // when symmetric), shifted to unsigned by MatMulNBits' default zero point
                let shift = if self.form == Form::MatMulNBits && q.symmetric {
                    1u8 << (q.bits - 1)
                } else {
                    0
                };
                match self.form {
                    Form::Dequantize => pack_transposed(&codes, n, kw, bits, out),
                    Form::MatMulNBits => {
                        let blob = self.blob();
                        for r in 0..rows {
                            for (j, block) in codes[r * kw..(r + 1) * kw].chunks(bs).enumerate() {
                                let base = (r * nb + j) * blob * (8 / bits);
                                for (t, &c) in block.iter().enumerate() {
                                    put(out, base + t, c.wrapping_add(shift));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Some rows' block parameters (scale, zero point) and codes (empty unless computing the codes).
type Rows = (Vec<(f32, i32)>, Vec<u8>);

/// Threads for a piece of `values` float values: one below 128 Ki values (a thread's start costs more
/// than it saves), else as many as the machine has, at most 4.
fn quantizing_threads(values: usize) -> usize {
    if values < 1 << 17 {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Codes `[n][kw]` (one byte each) written to `out` as `[kw][n]` elements of `bits` (4: two to a
/// byte, low nibble first, consecutive elements sharing a byte even across rows).
fn pack_transposed(codes: &[u8], n: usize, kw: usize, bits: usize, out: &mut [u8]) {
    if bits == 8 {
        for kk in 0..kw {
            for (nn, o) in out[kk * n..(kk + 1) * n].iter_mut().enumerate() {
                *o = codes[nn * kw + kk];
            }
        }
    } else if n.is_multiple_of(2) {
        // rows of an even N start on a byte: pairs of N share one
        let half = n / 2;
        for kk in 0..kw {
            for (p, o) in out[kk * half..(kk + 1) * half].iter_mut().enumerate() {
                let lo = codes[2 * p * kw + kk] & 0x0F;
                let hi = codes[(2 * p + 1) * kw + kk] & 0x0F;
                *o = lo | (hi << 4);
            }
        }
    } else {
        for kk in 0..kw {
            for nn in 0..n {
                let e = kk * n + nn;
                out[e / 2] |= (codes[nn * kw + kk] & 0x0F) << (4 * (e % 2));
            }
        }
    }
}

/// `x` rounded to the nearest integer, ties to even, for `|x| <= 2^22` (the codes' range, clamped
/// before): adding and taking away 1.5 * 2^23 leaves no fraction bits, and the addition rounds as the
/// FPU does by default, to nearest even. `f32::round_ties_even` compiles to a call to `rintf` on
/// x86-64 without SSE4.1, once per value; this is two vectorizable additions.
#[inline(always)]
fn round_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (x + MAGIC) - MAGIC
}

/// The smallest and largest of `values` and 0, NaN ignored, in eight lanes the compiler vectorizes.
fn extremes(values: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
    let mut chunks = values.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lo[i] = if c[i] < lo[i] { c[i] } else { lo[i] };
            hi[i] = if c[i] > hi[i] { c[i] } else { hi[i] };
        }
    }
    for &v in chunks.remainder() {
        lo[0] = if v < lo[0] { v } else { lo[0] };
        hi[0] = if v > hi[0] { v } else { hi[0] };
    }
    let low = lo.iter().fold(0f32, |m, &v| if v < m { v } else { m });
    let high = hi.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    (low, high)
}

impl BlockQuant {
    /// [`BlockQuant::params`] with the extremes found in vectorizable lanes (equal results).
    fn params_fast(&self, values: &[f32], round_scale: impl Fn(f32) -> f32) -> (f32, i32) {
        let (lo, hi) = extremes(values);
        self.params_of(lo, hi, round_scale)
    }

    /// The codes of one block as bytes (two's complement when symmetric), equal to
    /// [`BlockQuant::code`] of each value.
    fn codes_into(&self, values: &[f32], scale: f32, zp: i32, out: &mut [u8]) {
        if scale == 0.0 || !scale.is_finite() {
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)] // 0..=255
            out.fill(if self.symmetric { 0 } else { zp as u8 });
            return;
        }
        if self.symmetric {
            let (lo, hi) = (-self.qmax() - 1.0, self.qmax());
            for (o, &v) in out.iter_mut().zip(values) {
                // rounding after clamping to integer bounds equals clamping after rounding
                let r = round_even_small((v / scale).clamp(lo, hi));
                #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)] // -128..=127
                {
                    *o = r as i32 as u8;
                }
            }
        } else {
            let levels = self.levels();
            #[allow(clippy::cast_precision_loss)] // 0..=255
            let zp = zp as f32;
            for (o, &v) in out.iter_mut().zip(values) {
                // |v / scale| beyond 512 lands on a bound either way (zp <= 255)
                let r = round_even_small((v / scale).clamp(-512.0, 512.0));
                #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)] // 0..=255
                {
                    *o = (r + zp).clamp(0.0, levels) as u8;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(values: &[f32], n: usize, k: usize, k_major: bool) -> FloatMatrix {
        FloatMatrix {
            bytes: FloatBytes::Memory(Arc::new(
                values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )),
            dtype: dtype::FLOAT,
            n,
            k,
            k_major,
        }
    }

    fn tensor(m: &FloatMatrix, quant: BlockQuant, form: Form, part: Part) -> Quantized {
        Quantized {
            source: m.clone(),
            quant,
            form,
            part,
            scale_dtype: dtype::FLOAT,
        }
    }

    fn whole(t: &Quantized, budget: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for p in t.pieces_of(budget) {
            let mut buf = vec![0xAAu8; p.len()];
            t.fill(p, &mut buf).expect("fill");
            out.extend_from_slice(&buf);
        }
        assert_eq!(out.len(), t.len());
        out
    }

    #[test]
    fn stacked_weights_quantize_as_their_rows_one_after_another() {
        // parts of 3, 1 and 2 rows (one stored [k, n]); k = 40 ends in a partial block; pieces of
        // one row cross the parts' bounds
        let k = 40;
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|r| {
                (0..k)
                    .map(|c| ((r * 7 + c * 3) % 11) as f32 - 5.3)
                    .collect()
            })
            .collect();
        let part = |range: std::ops::Range<usize>, k_major: bool| {
            let n = range.len();
            let values: Vec<f32> = if k_major {
                (0..k)
                    .flat_map(|c| range.clone().map(move |r| (r, c)))
                    .map(|(r, c)| rows[r][c])
                    .collect()
            } else {
                range.flat_map(|r| rows[r].clone()).collect()
            };
            matrix(&values, n, k, k_major)
        };
        let stacked =
            FloatMatrix::stacked(vec![part(0..3, false), part(3..4, true), part(4..6, false)])
                .expect("same k and type");
        let flat: Vec<f32> = rows.concat();
        let plain = matrix(&flat, 6, k, false);
        for symmetric in [true, false] {
            let q = BlockQuant::new(4, 16, symmetric).expect("settings");
            for form in [Form::Dequantize, Form::MatMulNBits] {
                for p in [Part::Codes, Part::Scales, Part::ZeroPoints] {
                    assert_eq!(
                        whole(&tensor(&stacked, q, form, p), k),
                        whole(&tensor(&plain, q, form, p), usize::MAX),
                        "symmetric {symmetric} {form:?} {p:?}"
                    );
                }
            }
        }
        assert!(
            FloatMatrix::stacked(vec![part(0..3, false), matrix(&[0.0; 8], 1, 8, false)]).is_none()
        );
        assert!(FloatMatrix::stacked(Vec::new()).is_none());
    }

    #[test]
    fn settings_are_checked() {
        assert!(BlockQuant::new(3, 32, true).is_err());
        assert!(BlockQuant::new(4, 7, true).is_err());
        assert!(BlockQuant::new(4, 48, true).is_err());
        assert!(BlockQuant::new(8, 512, true).is_err());
        assert!(BlockQuant::new(8, 16, false).is_ok());
    }

    #[test]
    fn one_block_by_hand() {
        // symmetric int4: 3.5 and -3.5 reach |w| = 3.5, the negative one is coded -8: scale -3.5 / -8
        // = 0.4375; codes round(w / 0.4375), clamped to [-8, 7] (3.5 -> 8 -> 7)
        let q = BlockQuant::new(4, 16, true).expect("settings");
        let id = |s: f32| s;
        let w = [3.5f32, -3.5, 0.2, -0.3, 1.1, 0.0];
        let (s, zp) = q.params(&w, id);
        assert_eq!((s, zp), (0.4375, 0));
        let codes: Vec<i32> = w.iter().map(|&v| q.code(v, s, zp)).collect();
        assert_eq!(codes, [7, -8, 0, -1, 3, 0]);
        // a positive extreme: scale negative, the extreme coded -8
        let (s, _) = q.params(&[2.0, -1.0], id);
        assert_eq!(s, -0.25);
        assert_eq!((q.code(2.0, s, 0), q.code(-1.0, s, 0)), (-8, 4));
        // asymmetric uint4: lo -1, hi 2 -> scale 0.2, zp round(5) = 5; q = round(w / 0.2) + 5
        let q = BlockQuant::new(4, 16, false).expect("settings");
        let w = [-1.0f32, 2.0, 0.33, 0.0];
        let (s, zp) = q.params(&w, id);
        assert_eq!(zp, 5);
        assert!((s - 0.2).abs() < 1e-7);
        let codes: Vec<i32> = w.iter().map(|&v| q.code(v, s, zp)).collect();
        assert_eq!(codes, [0, 15, 7, 5]);
        // all positive: lo is 0 (zero stays exact), zp 0
        let (s, zp) = q.params(&[1.5, 3.0], id);
        assert_eq!((s, zp), (0.2, 0));
        // int8 symmetric: extreme 12.7 -> scale 12.7 / -128; -1 / s = 10.08 -> 10
        let q = BlockQuant::new(8, 16, true).expect("settings");
        let (s, _) = q.params(&[12.7, -1.0], id);
        assert_eq!(s, 12.7 / -128.0);
        assert_eq!(q.code(-1.0, s, 0), 10);
        assert_eq!(q.code(12.7, s, 0), -128);
        // an all-zero block: scale 0, codes 0
        assert_eq!(q.params(&[0.0, 0.0], id), (0.0, 0));
        assert_eq!(q.code(0.0, 0.0, 0), 0);
    }

    #[test]
    fn vectorized_blocks_equal_the_reference() {
        // values of every kind a block meets: ties at half codes, the extremes, zeros of both signs,
        // a NaN, an infinity, huge and tiny ones; params_fast / codes_into against params / code
        let mut state = 0x2545_f491_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let specials = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            1e30,
            -1e-30,
            0.5,
            -2.5,
            7.5,
        ];
        for &(bits, symmetric) in &[(4, true), (4, false), (8, true), (8, false)] {
            let q = BlockQuant::new(bits, 16, symmetric).expect("settings");
            for case in 0..400 {
                let len = 1 + (next() as usize) % 37;
                let mut block: Vec<f32> = (0..len)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                if case % 3 == 0 {
                    // half-code ties of the block's own scale
                    let (s, _) = q.params(&block, |s| s);
                    for (i, v) in block.iter_mut().enumerate().skip(1) {
                        *v = s * ((i % 9) as f32 - 4.5);
                    }
                }
                if case % 5 == 0 {
                    block[(next() as usize) % len] = specials[case / 5 % specials.len()];
                }
                let id = |s: f32| s;
                let (s, zp) = q.params(&block, id);
                let (fs, fzp) = q.params_fast(&block, id);
                assert_eq!((s.to_bits(), zp), (fs.to_bits(), fzp), "{block:?}");
                let mut got = vec![0u8; len];
                q.codes_into(&block, s, zp, &mut got);
                for (&v, &c) in block.iter().zip(&got) {
                    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
                    let want = q.code(v, s, zp) as u8;
                    assert_eq!(c, want, "{v} in {block:?}");
                }
            }
        }
    }

    #[test]
    fn dequantize_layout_by_hand() {
        // W [n=3, k=20] stored [N, K]; block 16: blocks k 0..16 and the tail 16..20
        let (n, k) = (3, 20);
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let (r, c) = (i / k, i % k);
                // block 0 of row r: -7 (r + 1) .. 8 (r + 1) -> scale 8 (r + 1) / -8 = -(r + 1)
                if c < 16 {
                    (c as f32 - 7.0) * (r as f32 + 1.0)
                } else {
                    (c as f32 - 17.0) * 0.5 // tail: -0.5 .. 1.0 -> scale 1 / -8
                }
            })
            .collect();
        let q = BlockQuant::new(4, 16, true).expect("settings");
        let m = matrix(&w, n, k, false);
        let scales = tensor(&m, q, Form::Dequantize, Part::Scales);
        assert_eq!(scales.dims(), [2, 3]);
        let s = super::super::le_f32s(&whole(&scales, usize::MAX));
        for r in 0..n {
            assert_eq!(s[r], -(r as f32 + 1.0));
            assert_eq!(s[n + r], -0.125);
        }
        let codes = tensor(&m, q, Form::Dequantize, Part::Codes);
        assert_eq!(codes.dims(), [20, 3]);
        let bytes = whole(&codes, 1); // one block row per piece
        assert_eq!(bytes.len(), 30);
        let nib = |e: usize| {
            let b = bytes[e / 2] >> (4 * (e % 2)) & 0x0F;
            i32::from(b) - if b >= 8 { 16 } else { 0 }
        };
        for r in 0..n {
            for c in 0..k {
                let v = w[r * k + c];
                let scale = s[(c / 16) * n + r];
                let want = (v / scale).round_ties_even().clamp(-8.0, 7.0) as i32;
                assert_eq!(nib(c * n + r), want, "({r}, {c})");
            }
        }
        // the K-major source of the same matrix gives the same bytes
        let mut t = vec![0f32; n * k];
        for r in 0..n {
            for c in 0..k {
                t[c * n + r] = w[r * k + c];
            }
        }
        let mt = matrix(&t, n, k, true);
        assert_eq!(
            whole(&tensor(&mt, q, Form::Dequantize, Part::Codes), 40),
            bytes
        );
    }

    #[test]
    fn matmul_nbits_layout_by_hand() {
        // one row, k = 20, block 16, asymmetric 4 bits: two blocks, the tail padded
        let w: Vec<f32> = (0..20).map(|c| c as f32 * 0.25 - 1.0).collect();
        let q = BlockQuant::new(4, 16, false).expect("settings");
        let m = matrix(&w, 1, 20, false);
        let codes = whole(&tensor(&m, q, Form::MatMulNBits, Part::Codes), 1);
        assert_eq!(codes.len(), 16); // [1, 2, 8]
                                     // block 0: lo -1, hi 2.75 -> scale 0.25, zp 4; code(c) = c
        for c in 0..16 {
            let b = codes[c / 2] >> (4 * (c % 2)) & 0x0F;
            assert_eq!(usize::from(b), c);
        }
        // block 1: values 3, 3.25, 3.5, 3.75: lo 0 -> scale 0.25, zp 0, codes 12..15; padding 0
        assert_eq!(&codes[8..], &[0xDC, 0xFE, 0, 0, 0, 0, 0, 0]);
        let zps = whole(&tensor(&m, q, Form::MatMulNBits, Part::ZeroPoints), 1);
        assert_eq!(zps, [0x04]); // zp 4 low, 0 high
        let scales =
            super::super::le_f32s(&whole(&tensor(&m, q, Form::MatMulNBits, Part::Scales), 1));
        assert_eq!(scales, [0.25, 0.25]);
        // symmetric: stored shifted by 8; -7 is the extreme (scale 0.875): codes 7 (8 clamped), -8, 1
        let q = BlockQuant::new(4, 16, true).expect("settings");
        let m = matrix(&[7.0, -7.0, 1.0], 1, 3, false);
        let codes = whole(&tensor(&m, q, Form::MatMulNBits, Part::Codes), 1);
        assert_eq!(codes[..2], [0x0F, 0x09]); // 15, 0, 9
    }

    #[test]
    fn pieces_cover_odd_tails_in_any_budget() {
        // odd n and k, several blocks, budgets that cut nowhere near a block's source bytes
        let (n, k) = (7, 83);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.3) * 0.013)
            .collect();
        for (bits, symmetric) in [(4, true), (4, false), (8, true), (8, false)] {
            let q = BlockQuant::new(bits, 16, symmetric).expect("settings");
            for k_major in [false, true] {
                let mut src = w.clone();
                if k_major {
                    for r in 0..n {
                        for c in 0..k {
                            src[c * n + r] = w[r * k + c];
                        }
                    }
                }
                let m = matrix(&src, n, k, k_major);
                for form in [Form::Dequantize, Form::MatMulNBits] {
                    for part in [Part::Codes, Part::Scales, Part::ZeroPoints] {
                        let t = tensor(&m, q, form, part);
                        let all = whole(&t, usize::MAX);
                        for budget in [1, 17, 16 * 7 + 5, 100, 1000] {
                            assert_eq!(
                                whole(&t, budget),
                                all,
                                "{bits} {symmetric} {form:?} {part:?} {budget}"
                            );
                        }
                        if t.pieces_of(1).len() > 1 {
                            assert!(t.pieces_of(1).iter().all(|p| p.len() < t.len()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn checkpoint_bytes_are_read_from_the_file() {
        use std::io::Write as _;
        let (n, k) = (5, 40);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.77).sin()).collect();
        let q = BlockQuant::new(8, 16, false).expect("settings");
        // two-byte floats (their own decoding paths), stored [n, k] or [k, n], at an odd offset
        for dtype in [dtype::BFLOAT16, dtype::FLOAT16] {
            let to_bytes = |v: f32| match dtype {
                dtype::BFLOAT16 => half::bf16::from_f32(v).to_le_bytes(),
                _ => half::f16::from_f32(v).to_le_bytes(),
            };
            let round = |v: f32| match dtype {
                dtype::BFLOAT16 => half::bf16::from_f32(v).to_f32(),
                _ => half::f16::from_f32(v).to_f32(),
            };
            let rounded: Vec<f32> = w.iter().map(|&v| round(v)).collect();
            let in_memory = matrix(&rounded, n, k, false);
            for k_major in [false, true] {
                let mut file = tempfile::tempfile().expect("temp file");
                file.write_all(b"abc").expect("write");
                for i in 0..n * k {
                    // element i of the file: [n][k] order, or [k][n]
                    let (r, c) = if k_major {
                        (i % n, i / n)
                    } else {
                        (i / k, i % k)
                    };
                    file.write_all(&to_bytes(w[r * k + c])).expect("write");
                }
                let from_file = FloatMatrix {
                    bytes: FloatBytes::File {
                        file: Arc::new(file),
                        offset: 3,
                    },
                    dtype,
                    n,
                    k,
                    k_major,
                };
                for form in [Form::Dequantize, Form::MatMulNBits] {
                    for part in [Part::Codes, Part::Scales, Part::ZeroPoints] {
                        assert_eq!(
                            whole(&tensor(&from_file, q, form, part), 50),
                            whole(&tensor(&in_memory, q, form, part), usize::MAX),
                            "{dtype} k_major {k_major} {form:?} {part:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pieces_split_among_threads_equal_pieces_made_by_one() {
        // one piece of 600 x 520 values (threads when the machine has cores) against pieces of under
        // 128 Ki values (one thread each); odd tails in both directions
        let (n, k) = (600, 520);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        for k_major in [false, true] {
            let m = matrix(&w, n, k, k_major);
            for &(bits, symmetric) in &[(4, true), (8, false)] {
                let q = BlockQuant::new(bits, 32, symmetric).expect("settings");
                for form in [Form::Dequantize, Form::MatMulNBits] {
                    for part in [Part::Codes, Part::Scales, Part::ZeroPoints] {
                        let t = tensor(&m, q, form, part);
                        assert_eq!(
                            whole(&t, usize::MAX),
                            whole(&t, 60_000),
                            "{form:?} {part:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn float64_weights_are_rounded_to_float32_first() {
        let (n, k) = (3, 40);
        let w: Vec<f64> = (0..n * k).map(|i| (i as f64 * 0.37).cos() / 3.0).collect();
        #[allow(clippy::cast_possible_truncation)]
        let rounded: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        let wide = FloatMatrix {
            bytes: FloatBytes::Memory(Arc::new(
                w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
            )),
            dtype: dtype::DOUBLE,
            n,
            k,
            k_major: false,
        };
        let q = BlockQuant::new(4, 16, true).expect("settings");
        for part in [Part::Codes, Part::Scales] {
            assert_eq!(
                whole(&tensor(&wide, q, Form::Dequantize, part), usize::MAX),
                whole(
                    &tensor(&matrix(&rounded, n, k, false), q, Form::Dequantize, part),
                    usize::MAX
                )
            );
        }
    }

    #[test]
    fn a_wide_weight_reads_at_least_512_values_a_row() {
        // N = 8192: 2 MiB of float32 would be 64 values a row; the standard form's pieces take 512
        let m = FloatMatrix {
            bytes: FloatBytes::Memory(Arc::new(Vec::<u8>::new())),
            dtype: dtype::FLOAT,
            n: 8192,
            k: 3072,
            k_major: false,
        };
        let q = BlockQuant::new(4, 32, true).expect("settings");
        let codes = tensor(&m, q, Form::Dequantize, Part::Codes);
        let pieces = codes.pieces();
        assert_eq!(pieces.len(), 3072 / MIN_ROW_VALUES);
        assert_eq!(pieces[0].range(), (0, MIN_ROW_VALUES / 32));
        // MatMulNBits reads whole rows of K: 2 MiB of them
        let nbits = tensor(&m, q, Form::MatMulNBits, Part::Codes);
        assert_eq!(nbits.pieces()[0].range(), (0, PIECE_ELEMENTS / 3072));
    }
}
