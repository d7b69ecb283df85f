//! An N-D transpose (ONNX `Transpose`'s `perm`) of a row-major tensor, produced band by band of output
//! rows so that a weight stored permuted is never copied whole (see `TensorData::Transposed`).
//!
//! The permutation is first reduced: axes of size 1 are dropped and source axes that stay next to each
//! other merge, so `[experts, in, out] -> [experts, out, in]` is a batch of 2-D transposes and a 2-D
//! transpose is what it always was. An output row (every output axis but the last fixed) is then either
//! a contiguous run of the source (the last axis stays last: one copy per row) or a strided column of
//! it; such columns are gathered in tiles against the source's last axis, which is contiguous in the
//! source, so both sides of a tile are read and written a cache line at a time.

use std::io;

/// A reduced permutation: source `dims` (row-major) read through `perm` (output axis k is source axis
/// `perm[k]`), no axis of size 1 and no two source axes that could merge; rank 1 when it is no
/// permutation at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    dims: Vec<usize>,
    perm: Vec<usize>,
    /// element strides of the source axes
    strides: Vec<usize>,
    numel: usize,
}

/// Whether `perm` is a permutation of `0..rank`.
pub fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true))
}

/// Whether reading `dims` through `perm` leaves the bytes in place (only axes of size 1 move).
pub fn is_identity(dims: &[usize], perm: &[usize]) -> bool {
    Layout::new(dims, perm).is_ok_and(|l| l.dims.len() <= 1)
}

impl Layout {
    pub(crate) fn new(dims: &[usize], perm: &[usize]) -> io::Result<Layout> {
        if !is_permutation(perm, dims.len()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("perm {perm:?} is not a permutation of the axes of shape {dims:?}"),
            ));
        }
        let numel = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "tensor too large"))?;
        // source axes in output order, size-1 axes dropped; runs of consecutive source axes merge
        let kept: Vec<usize> = perm.iter().copied().filter(|&a| dims[a] != 1).collect();
        let mut groups: Vec<(usize, usize)> = Vec::new(); // (first source axis, merged size)
        for (k, &a) in kept.iter().enumerate() {
            let follows = k > 0 && {
                let prev = kept[k - 1];
                // the previous output axis is the source axis right before a, size-1 axes between skipped
                prev < a && (prev + 1..a).all(|b| dims[b] == 1)
            };
            match groups.last_mut() {
                Some(last) if follows => last.1 *= dims[a],
                _ => groups.push((a, dims[a])),
            }
        }
        if groups.len() <= 1 {
            return Ok(Layout {
                dims: vec![numel],
                perm: vec![0],
                strides: vec![1],
                numel,
            });
        }
        // number the groups in source order
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by_key(|&g| groups[g].0);
        let mut rank_of = vec![0; groups.len()];
        for (r, &g) in order.iter().enumerate() {
            rank_of[g] = r;
        }
        let reduced_dims: Vec<usize> = order.iter().map(|&g| groups[g].1).collect();
        let reduced_perm: Vec<usize> = rank_of;
        let mut strides = vec![1; reduced_dims.len()];
        for i in (0..reduced_dims.len() - 1).rev() {
            strides[i] = strides[i + 1] * reduced_dims[i + 1];
        }
        Ok(Layout {
            dims: reduced_dims,
            perm: reduced_perm,
            strides,
            numel,
        })
    }

    fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Elements of one output row (the output's last axis; one element when nothing is permuted).
    pub(crate) fn row_len(&self) -> usize {
        if self.rank() == 1 {
            1
        } else {
            self.dims[self.perm[self.rank() - 1]]
        }
    }

    /// How many output rows there are.
    pub(crate) fn rows(&self) -> usize {
        if self.numel == 0 {
            0
        } else {
            self.numel / self.row_len()
        }
    }

    /// Produces output rows `r0..r1` (`(r1 - r0) * row_len` elements from 0 in the output), through
    /// `copy(src, out, len)` (a contiguous run) and `tile(block)` (a strided 2-D transpose); offsets
    /// are in elements.
    pub(crate) fn band(
        &self,
        r0: usize,
        r1: usize,
        copy: &mut impl FnMut(usize, usize, usize),
        tile: &mut impl FnMut(Block),
    ) {
        let n = self.rank();
        if r0 >= r1 {
            return;
        }
        if n == 1 {
            copy(r0, 0, r1 - r0);
            return;
        }
        let len = self.row_len();
        let out_dims: Vec<usize> = self.perm.iter().map(|&a| self.dims[a]).collect();
        let last = n - 1;
        if self.perm[last] == last {
            // the source's last axis stays last: each output row is a contiguous run of the source
            let mut index = Self::row_index(r0, &out_dims[..last]);
            let mut src = self.offset(&index, 0);
            for r in r0..r1 {
                copy(src, (r - r0) * len, len);
                for k in (0..last).rev() {
                    let stride = self.strides[self.perm[k]];
                    index[k] += 1;
                    src += stride;
                    if index[k] < out_dims[k] {
                        break;
                    }
                    index[k] = 0;
                    src -= out_dims[k] * stride;
                }
            }
            return;
        }
        // the source's last axis lands at output axis q: output rows stepping along it read
        // consecutive source elements, and are `inner` rows apart in the output
        let q = self
            .perm
            .iter()
            .position(|&a| a == last)
            .unwrap_or_default();
        let inner: usize = out_dims[q + 1..last].iter().product();
        let span = out_dims[q] * inner;
        let src_stride = self.strides[self.perm[last]];
        if (r1 - r0) / inner < MIN_RUN {
            // too few steps along q in the band for contiguous reads: tile along the output's
            // second-to-last axis instead (rows next to each other, a strided read on both sides)
            let step = self.strides[self.perm[last - 1]];
            let along = out_dims[last - 1];
            let mut r = r0;
            while r < r1 {
                let index = Self::row_index(r, &out_dims[..last]);
                let nj = (along - index[last - 1]).min(r1 - r);
                tile(Block {
                    src: self.offset(&index, 0),
                    src_stride,
                    src_step: step,
                    ni: len,
                    nj,
                    out: (r - r0) * len,
                    out_stride: len,
                });
                r += nj;
            }
            return;
        }
        for h in r0 / span..=(r1 - 1) / span {
            let base = h * span;
            for m in 0..inner {
                // output rows base + j * inner + m in r0..r1
                let first = base + m;
                let j_lo = if r0 > first {
                    (r0 - first).div_ceil(inner)
                } else {
                    0
                };
                let j_hi = if r1 > first {
                    (r1 - first).div_ceil(inner).min(out_dims[q])
                } else {
                    0
                };
                if j_lo >= j_hi {
                    continue;
                }
                let mut index = Self::row_index(first, &out_dims[..last]);
                index[q] = j_lo;
                tile(Block {
                    src: self.offset(&index, 0),
                    src_stride,
                    src_step: 1,
                    ni: len,
                    nj: j_hi - j_lo,
                    out: (first + j_lo * inner - r0) * len,
                    out_stride: inner * len,
                });
            }
        }
    }

    /// The output index (axes before the last) of output row `r`.
    fn row_index(mut r: usize, row_dims: &[usize]) -> Vec<usize> {
        let mut index = vec![0; row_dims.len()];
        for k in (0..row_dims.len()).rev() {
            index[k] = r % row_dims[k];
            r /= row_dims[k];
        }
        index
    }

    /// The source element at output index `index` (axes before the last) and `i` along the last.
    fn offset(&self, index: &[usize], i: usize) -> usize {
        index
            .iter()
            .zip(&self.perm)
            .map(|(&x, &a)| x * self.strides[a])
            .sum::<usize>()
            + i * self.strides[self.perm[self.rank() - 1]]
    }
}

/// A strided 2-D transpose: `out[out + j * out_stride + i] = src[src + i * src_stride + j * src_step]`
/// for `i < ni`, `j < nj` (offsets and strides in elements; `src_step` 1 is the fast case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub src: usize,
    pub src_stride: usize,
    pub src_step: usize,
    pub ni: usize,
    pub nj: usize,
    pub out: usize,
    pub out_stride: usize,
}

/// The fewest consecutive source elements a band reads along the source's last axis (per output
/// column) for the contiguous tiles to pay; below it the band tiles along its own rows.
const MIN_RUN: usize = 16;

/// Plain integer element types: any bit pattern is valid, so byte buffers can be viewed as them.
pub(crate) trait Pod: Copy + Default + Send + Sync {}
impl Pod for u8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for u64 {}

/// Output rows r0..r1 of `layout` into `out` as `T` elements; false (nothing done) when the source or
/// `out` is not aligned for `T`.
pub(crate) fn fill_typed<T: Pod>(
    layout: &Layout,
    src: &[u8],
    r0: usize,
    r1: usize,
    out: &mut [u8],
) -> bool {
    // SAFETY: T is a plain integer type (every bit pattern valid); align_to only returns the aligned middle.
    let (head, src, tail) = unsafe { src.align_to::<T>() };
    // SAFETY: the same, for the output buffer.
    let (out_head, out, out_tail) = unsafe { out.align_to_mut::<T>() };
    if !head.is_empty() || !tail.is_empty() || !out_head.is_empty() || !out_tail.is_empty() {
        return false;
    }
    // both closures write into `out`: one cell, borrowed in turn
    let out = std::cell::RefCell::new(out);
    layout.band(
        r0,
        r1,
        &mut |s, o, len| out.borrow_mut()[o..o + len].copy_from_slice(&src[s..s + len]),
        &mut |b| transpose_block(src, b, &mut out.borrow_mut()),
    );
    true
}

/// Output rows r0..r1 of `layout` element by element (odd element sizes or unaligned memory).
pub(crate) fn fill_bytes(
    layout: &Layout,
    src: &[u8],
    item: usize,
    r0: usize,
    r1: usize,
    out: &mut [u8],
) {
    let out = std::cell::RefCell::new(out);
    layout.band(
        r0,
        r1,
        &mut |s, o, len| {
            out.borrow_mut()[o * item..(o + len) * item]
                .copy_from_slice(&src[s * item..(s + len) * item]);
        },
        &mut |b| {
            let mut out = out.borrow_mut();
            for i in 0..b.ni {
                for j in 0..b.nj {
                    let from = (b.src + i * b.src_stride + j * b.src_step) * item;
                    let at = (b.out + j * b.out_stride + i) * item;
                    out[at..at + item].copy_from_slice(&src[from..from + item]);
                }
            }
        },
    );
}

/// Tiles of the transposition: TILE x TILE elements, copied through a small buffer that stays in L1.
pub(crate) const TILE: usize = 64;

/// One strided block, tile by tile. Each TILE x TILE tile is transposed inside a small buffer that
/// stays in L1 (8 x 8 blocks held in registers where the tile is whole), then copied out a row at a
/// time: writing a tile straight to `out` touches TILE lines `out_stride` elements apart, which for
/// power-of-two sizes all fall in one cache set and evict each other.
fn transpose_block<T: Pod>(src: &[T], b: Block, out: &mut [T]) {
    const BLOCK: usize = 8;
    let mut tile = [T::default(); TILE * TILE];
    for ib in (0..b.ni).step_by(TILE) {
        let h = (ib + TILE).min(b.ni) - ib;
        for jb in (0..b.nj).step_by(TILE) {
            let w = (jb + TILE).min(b.nj) - jb;
            if b.src_step != 1 {
                for di in 0..h {
                    let at = b.src + (ib + di) * b.src_stride + jb * b.src_step;
                    for dj in 0..w {
                        tile[dj * TILE + di] = src[at + dj * b.src_step];
                    }
                }
            } else if h == TILE && w == TILE {
                for bi in (0..TILE).step_by(BLOCK) {
                    for bj in (0..TILE).step_by(BLOCK) {
                        let mut block = [[T::default(); BLOCK]; BLOCK];
                        for (r, line) in block.iter_mut().enumerate() {
                            let at = b.src + (ib + bi + r) * b.src_stride + jb + bj;
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
                    let row = &src[b.src + (ib + di) * b.src_stride + jb..][..w];
                    for (dj, v) in row.iter().enumerate() {
                        tile[dj * TILE + di] = *v;
                    }
                }
            }
            for dj in 0..w {
                let at = b.out + (jb + dj) * b.out_stride + ib;
                out[at..at + h].copy_from_slice(&tile[dj * TILE..dj * TILE + h]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every permutation of `0..n`, in lexicographic order.
    pub(crate) fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        let mut all = Vec::new();
        for rest in permutations(n - 1) {
            for at in 0..=rest.len() {
                let mut p = rest.clone();
                p.insert(at, n - 1);
                all.push(p);
            }
        }
        all.sort();
        all
    }

    #[test]
    fn permutations_are_recognised() {
        assert!(is_permutation(&[2, 0, 1], 3));
        assert!(!is_permutation(&[0, 0, 1], 3));
        assert!(!is_permutation(&[0, 3, 1], 3));
        assert!(!is_permutation(&[0, 1], 3));
        assert_eq!(permutations(4).len(), 24);
    }

    #[test]
    fn layouts_reduce_to_the_axes_that_move() {
        let l = Layout::new(&[4, 3, 5], &[0, 2, 1]).expect("layout");
        assert_eq!(
            (l.dims.clone(), l.perm.clone()),
            (vec![4, 3, 5], vec![0, 2, 1])
        );
        // two source axes that stay together merge: a 2-D transpose
        let l = Layout::new(&[2, 3, 5], &[2, 0, 1]).expect("layout");
        assert_eq!((l.dims.clone(), l.perm.clone()), (vec![6, 5], vec![1, 0]));
        // moving a size-1 axis moves no byte
        assert!(is_identity(&[1, 7, 3], &[1, 0, 2]));
        assert!(is_identity(&[4, 1, 1, 9], &[0, 2, 3, 1]));
        assert!(!is_identity(&[4, 1, 9], &[2, 1, 0]));
        let l = Layout::new(&[4, 1, 9], &[2, 1, 0]).expect("layout");
        assert_eq!((l.dims.clone(), l.perm.clone()), (vec![4, 9], vec![1, 0]));
        assert!(Layout::new(&[2, 3], &[0, 0]).is_err());
    }

    /// The permuted bytes, element by element from the definition (out[i] = src[j] with
    /// j[perm[k]] = i[k]).
    fn naive(src: &[u8], dims: &[usize], perm: &[usize], item: usize) -> Vec<u8> {
        let out_dims: Vec<usize> = perm.iter().map(|&a| dims[a]).collect();
        let numel: usize = dims.iter().product();
        let mut out = Vec::with_capacity(numel * item);
        let mut index = vec![0; dims.len()];
        for _ in 0..numel {
            let mut at = 0;
            for (a, &d) in dims.iter().enumerate() {
                let k = perm.iter().position(|&b| b == a).expect("axis");
                at = at * d + index[k];
            }
            out.extend_from_slice(&src[at * item..(at + 1) * item]);
            for k in (0..index.len()).rev() {
                index[k] += 1;
                if index[k] < out_dims[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        out
    }

    /// The output produced in bands of `band` rows, typed where `typed` and byte by byte otherwise.
    fn by_bands(src: &[u8], layout: &Layout, item: usize, band: usize, typed: bool) -> Vec<u8> {
        let (rows, row) = (layout.rows(), layout.row_len() * item);
        let mut out = Vec::new();
        for r0 in (0..rows).step_by(band.max(1)) {
            let r1 = (r0 + band).min(rows);
            let mut buf = vec![0u64; ((r1 - r0) * row).div_ceil(8)];
            // SAFETY: initialized u64s are valid bytes
            let (_, bytes, _) = unsafe { buf.align_to_mut::<u8>() };
            let bytes = &mut bytes[..(r1 - r0) * row];
            let done = typed
                && match item {
                    2 => fill_typed::<u16>(layout, src, r0, r1, bytes),
                    4 => fill_typed::<u32>(layout, src, r0, r1, bytes),
                    8 => fill_typed::<u64>(layout, src, r0, r1, bytes),
                    1 => fill_typed::<u8>(layout, src, r0, r1, bytes),
                    _ => false,
                };
            if !done {
                fill_bytes(layout, src, item, r0, r1, bytes);
            }
            out.extend_from_slice(bytes);
        }
        out
    }

    #[test]
    fn every_perm_of_3d_and_4d_tensors_matches_the_definition() {
        let shapes: [&[usize]; 7] = [
            &[3, 5, 7],
            &[4, 1, 6],
            &[2, 70, 67],
            &[5, 3, 130],
            &[2, 3, 4, 5],
            &[3, 1, 70, 9],
            &[2, 66, 3, 65],
        ];
        for dims in shapes {
            let numel: usize = dims.iter().product();
            for perm in permutations(dims.len()) {
                let layout = Layout::new(dims, &perm).expect("layout");
                for item in [1, 2, 3, 4, 8] {
                    // u64 storage: aligned for every element type
                    let words: Vec<u64> = (0..(numel * item).div_ceil(8) as u64)
                        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                        .collect();
                    // SAFETY: u64s are valid bytes
                    let (_, src, _) = unsafe { words.align_to::<u8>() };
                    let src = &src[..numel * item];
                    let want = naive(src, dims, &perm, item);
                    for band in [1, 2, 7, 64, layout.rows()] {
                        for typed in [true, false] {
                            let got = by_bands(src, &layout, item, band, typed);
                            assert!(
                                got == want,
                                "dims {dims:?} perm {perm:?} item {item} band {band} typed {typed}"
                            );
                        }
                    }
                }
            }
        }
    }
}
