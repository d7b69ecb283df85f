//! The writer's one pipeline. Bytes computed while they are written (weights stored transposed,
//! convolutions with a batch norm folded in, weights copied to the host from another device) are produced ahead by one worker thread, piece by piece
//! (see [`TensorData::pieces`]), so that computing a tensor overlaps writing the ones before it instead
//! of taking turns with the write. Borrowed weights are still written straight from their memory by
//! the calling thread.
//!
//! One memory budget: the worker fills BUFFERS piece buffers that the writer hands back once written,
//! so at most [`IN_FLIGHT_BYTES`] are in flight (more only for a transposed weight whose single output
//! row is larger than a piece).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::tensor::{piece_buffer, TensorData, PIECE_BYTES};

/// How many piece buffers exist: one being written while the others are filled.
const BUFFERS: usize = 4;

/// The bytes the pipeline holds at most, every buffer counted.
pub const IN_FLIGHT_BYTES: usize = BUFFERS * PIECE_BYTES;

/// A filled buffer and how many of its bytes are the piece.
type Filled = io::Result<(Vec<u64>, usize)>;

/// Hands out, in the order the writer asks for them, the bytes of the computed tensors.
pub struct Prefetched<'s> {
    filled: Receiver<Filled>,
    spent: SyncSender<Vec<u64>>,
    /// set when the writer is done (finished, failed or stopped by its hook): the worker stops before
    /// its next piece, even one it would not have to wait for
    stop: &'s AtomicBool,
}

impl Drop for Prefetched<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Prefetched<'_> {
    /// Writes `data`: computed tensors from the worker's pieces, the others from their memory.
    /// `data` must come in the order given to `with_prefetch`.
    pub fn write<W: Write + ?Sized>(&mut self, data: &TensorData, w: &mut W) -> io::Result<()> {
        if !data.is_computed() {
            return data.write_to(w);
        }
        let mut left = data.len();
        while left > 0 {
            let (mut buf, len) = self
                .filled
                .recv()
                .map_err(|_| io::Error::other("the prefetching thread stopped early"))??;
            if len > left {
                return Err(io::Error::other("prefetched bytes out of order"));
            }
            w.write_all(piece_buffer(&mut buf, len))?;
            left -= len;
            // cannot block: the channel has room for every buffer; if the worker is done, it drops
            let _ = self.spent.send(buf);
        }
        Ok(())
    }
}

/// Runs `body` with a worker computing, in order, the bytes of the computed tensors among `order`
/// (the tensors `body` will write, in the order it writes them).
pub fn with_prefetch<R>(
    order: Vec<&TensorData>,
    body: impl FnOnce(&mut Prefetched<'_>) -> io::Result<R>,
) -> io::Result<R> {
    let work: Vec<&TensorData> = order.into_iter().filter(|d| d.is_computed()).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (filled_tx, filled) = sync_channel(BUFFERS);
        let (spent, spent_rx) = sync_channel(BUFFERS);
        if !work.is_empty() {
            for _ in 0..BUFFERS {
                // cannot fail: the channel has room for every buffer and its receiver is alive
                let _ = spent.send(Vec::with_capacity(PIECE_BYTES / 8));
            }
            let stop = &stop;
            scope.spawn(move || produce(&work, &filled_tx, &spent_rx, stop));
        }
        // the Prefetched (and so both channel ends the worker waits on) is dropped when body returns,
        // which raises the stop flag and stops a worker left waiting after an error
        body(&mut Prefetched {
            filled,
            spent,
            stop: &stop,
        })
    })
}

fn produce(
    work: &[&TensorData],
    filled: &SyncSender<Filled>,
    spent: &Receiver<Vec<u64>>,
    stop: &AtomicBool,
) {
    for data in work {
        let pieces = match data.pieces() {
            Ok(p) => p,
            Err(e) => {
                let _ = filled.send(Err(e));
                return;
            }
        };
        // a weight off the CPU: its host copy, held while its pieces are produced, dropped after
        let host = match data.fetch().transpose() {
            Ok(h) => h,
            Err(e) => {
                let _ = filled.send(Err(e));
                return;
            }
        };
        for piece in pieces {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            // a closed channel means the writer stopped (an error on its side): nothing left to do
            let Ok(mut buf) = spent.recv() else { return };
            let out = piece_buffer(&mut buf, piece.len());
            let message = data
                .fill_from(host.as_ref(), piece, out)
                .map(|()| (buf, piece.len()));
            let failed = message.is_err();
            if filled.send(message).is_err() || failed {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn matrix(rows: usize, cols: usize, seed: u8) -> TensorData {
        let src: Vec<u8> = (0..rows * cols * 4)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        TensorData::Transposed {
            source: Arc::new(src),
            dims: vec![rows, cols],
            perm: vec![1, 0],
            item: 4,
        }
    }

    #[test]
    fn computed_bytes_arrive_in_order_between_plain_ones() {
        let scaled = TensorData::ChannelScaled {
            source: Arc::new(vec![1u8; 4 * 3 * PIECE_BYTES / 2]),
            scale: Arc::new(vec![2.0, 3.0, 0.5]),
            inner: PIECE_BYTES / 2,
        };
        let tensors = [
            matrix(300, 1000, 3),
            TensorData::Owned(vec![7; 10]),
            matrix(2, 3, 5),
            scaled,
            matrix(1024, 700, 11),
            TensorData::Owned(vec![9; 3 * PIECE_BYTES + 5]),
            matrix(9000, 70, 13),
        ];
        let want: Vec<u8> = tensors.iter().flat_map(TensorData::to_vec).collect();
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

    /// Bytes "on a device": each fetch is counted and makes a fresh host copy.
    struct Device {
        bytes: Vec<u8>,
        fetches: std::sync::atomic::AtomicUsize,
    }
    impl crate::tensor::Fetch for Device {
        fn fetch(&self) -> io::Result<Arc<dyn crate::tensor::ByteSource>> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(self.bytes.clone()))
        }
    }

    #[test]
    fn fetched_weights_are_copied_once_each_and_written_in_order() {
        let devices: Vec<Arc<Device>> = [3 * PIECE_BYTES + 7, 10, 0]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                Arc::new(Device {
                    bytes: (0..n).map(|b| (b * (i + 3) % 251) as u8).collect(),
                    fetches: 0.into(),
                })
            })
            .collect();
        let mut tensors: Vec<TensorData> = devices
            .iter()
            .map(|d| TensorData::Fetched {
                fetch: Arc::clone(d) as Arc<dyn crate::tensor::Fetch>,
                len: d.bytes.len(),
                permuted: None,
            })
            .collect();
        tensors.insert(1, matrix(300, 1000, 3));
        let want: Vec<u8> = [
            devices[0].bytes.clone(),
            tensors[1].to_vec(),
            devices[1].bytes.clone(),
            devices[2].bytes.clone(),
        ]
        .concat();
        for d in &devices {
            d.fetches.store(0, Ordering::SeqCst);
        }
        let mut got = Vec::new();
        with_prefetch(tensors.iter().collect(), |p| {
            for t in &tensors {
                p.write(t, &mut got)?;
            }
            Ok(())
        })
        .expect("write");
        assert!(got == want);
        for d in &devices {
            assert_eq!(d.fetches.load(Ordering::SeqCst), 1);
        }
        // a host copy of the wrong size is an error, not a short file
        let short = TensorData::Fetched {
            fetch: Arc::clone(&devices[1]) as Arc<dyn crate::tensor::Fetch>,
            len: 11,
            permuted: None,
        };
        let err = with_prefetch(vec![&short], |p| p.write(&short, &mut Vec::new()))
            .expect_err("must fail");
        assert!(
            err.to_string().contains("10 bytes, 11 were expected"),
            "{err}"
        );
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
        let big = matrix(4096, 4096, 1);
        let err = with_prefetch(vec![&big], |p| p.write(&big, &mut Full)).expect_err("must fail");
        assert!(err.to_string().contains("disk full"));
    }

    #[test]
    fn a_tensor_of_the_wrong_size_fails_the_write() {
        let bad = TensorData::Transposed {
            source: Arc::new(vec![0u8; 10]),
            dims: vec![2, 2],
            perm: vec![1, 0],
            item: 4,
        };
        let mut sink = Vec::new();
        let err = with_prefetch(vec![&bad], |p| p.write(&bad, &mut sink)).expect_err("must fail");
        assert!(err.to_string().contains("wrong size"));
    }
}
