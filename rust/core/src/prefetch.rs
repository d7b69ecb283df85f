//! Bytes computed while they are written (weights stored transposed, convolutions with a batch norm
//! folded in) are produced ahead by a worker thread, so that computing one tensor overlaps writing
//! the tensors before it instead of taking turns with the write. Borrowed weights are still written
//! straight from their memory by the calling thread; at most PREFETCH_CHUNKS chunks of CHUNK bytes
//! are in flight.

use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::tensor::TensorData;

const CHUNK: usize = 1 << 20;
const PREFETCH_CHUNKS: usize = 8;

/// Hands out, in the order the writer asks for them, the bytes of the computed tensors.
pub struct Prefetched {
    chunks: Receiver<io::Result<Vec<u8>>>,
    spent: SyncSender<Vec<u8>>,
}

/// Whether a tensor's bytes take work to produce (anything but a plain copy of memory).
fn computed(data: &TensorData) -> bool {
    matches!(
        data,
        TensorData::Transposed { .. } | TensorData::ChannelScaled { .. }
    )
}

impl Prefetched {
    /// Writes `data`: computed tensors from the worker's chunks, the others from their memory.
    /// `data` must come in the order given to `with_prefetch`.
    pub fn write<W: Write + ?Sized>(&mut self, data: &TensorData, w: &mut W) -> io::Result<()> {
        if !computed(data) {
            return data.write_to(w);
        }
        let mut left = data.len();
        while left > 0 {
            let chunk = self
                .chunks
                .recv()
                .map_err(|_| io::Error::other("the prefetching thread stopped early"))??;
            if chunk.len() > left {
                return Err(io::Error::other("prefetched bytes out of order"));
            }
            w.write_all(&chunk)?;
            left -= chunk.len();
            let _ = self.spent.send(chunk); // the worker may be done: the buffer is then dropped
        }
        Ok(())
    }
}

/// Runs `body` with a worker computing, in order, the bytes of the computed tensors among `order`
/// (the tensors `body` will write, in the order it writes them).
pub fn with_prefetch<R>(
    order: Vec<&TensorData>,
    body: impl FnOnce(&mut Prefetched) -> io::Result<R>,
) -> io::Result<R> {
    let work: Vec<&TensorData> = order.into_iter().filter(|d| computed(d)).collect();
    std::thread::scope(|scope| {
        let (chunk_tx, chunks) = sync_channel(PREFETCH_CHUNKS);
        let (spent, spent_rx) = sync_channel(PREFETCH_CHUNKS + 2);
        if !work.is_empty() {
            scope.spawn(move || produce(work, chunk_tx, spent_rx));
        }
        body(&mut Prefetched { chunks, spent })
    })
}

fn produce(
    work: Vec<&TensorData>,
    chunks: SyncSender<io::Result<Vec<u8>>>,
    spent: Receiver<Vec<u8>>,
) {
    for data in work {
        let mut sink = ChunkSink {
            buf: Vec::new(),
            chunks: &chunks,
            spent: &spent,
            closed: false,
        };
        let result = data.write_to(&mut sink).and_then(|()| sink.flush());
        if sink.closed {
            return; // the writer stopped (an error on its side): nothing left to do
        }
        if let Err(e) = result {
            let _ = chunks.send(Err(e));
            return;
        }
    }
}

/// A `Write` that cuts what it is given into CHUNK-byte buffers and sends them to the writer.
struct ChunkSink<'a> {
    buf: Vec<u8>,
    chunks: &'a SyncSender<io::Result<Vec<u8>>>,
    spent: &'a Receiver<Vec<u8>>,
    closed: bool,
}

impl ChunkSink<'_> {
    fn send(&mut self) -> io::Result<()> {
        let mut next = self.spent.try_recv().unwrap_or_default();
        next.clear();
        let full = std::mem::replace(&mut self.buf, next);
        if self.chunks.send(Ok(full)).is_err() {
            self.closed = true;
            return Err(io::Error::other("the writer stopped"));
        }
        Ok(())
    }
}

impl Write for ChunkSink<'_> {
    fn write(&mut self, mut bytes: &[u8]) -> io::Result<usize> {
        let total = bytes.len();
        while !bytes.is_empty() {
            if self.buf.capacity() < CHUNK {
                self.buf.reserve_exact(CHUNK - self.buf.len());
            }
            let take = (CHUNK - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() == CHUNK {
                self.send()?;
            }
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn computed_bytes_arrive_in_order_between_plain_ones() {
        let matrix = |rows: usize, cols: usize, seed: u8| {
            let src: Vec<u8> = (0..rows * cols * 4)
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect();
            TensorData::Transposed {
                source: Arc::new(src),
                rows,
                cols,
                item: 4,
            }
        };
        let tensors = [
            matrix(300, 1000, 3),
            TensorData::Owned(vec![7; 10]),
            matrix(2, 3, 5),
            matrix(1024, 700, 11),
            TensorData::Owned(vec![9; 3 * CHUNK + 5]),
        ];
        let want: Vec<u8> = tensors.iter().flat_map(|t| t.to_vec()).collect();
        let mut got = Vec::new();
        with_prefetch(tensors.iter().collect(), |p| {
            for t in &tensors {
                p.write(t, &mut got)?;
            }
            Ok(())
        })
        .expect("write");
        assert!(got == want);
    }

    #[test]
    fn a_failing_writer_stops_the_worker() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let big = TensorData::Transposed {
            source: Arc::new(vec![1u8; 4096 * 4096 * 4]),
            rows: 4096,
            cols: 4096,
            item: 4,
        };
        let err = with_prefetch(vec![&big], |p| p.write(&big, &mut Full)).expect_err("must fail");
        assert!(err.to_string().contains("disk full"));
    }
}
