//! The writes that take a second thread: the model file (graph and metadata, no weights) beside the
//! data file, and an inline model's graph head (its node metadata) beside its weights. This thread's
//! error is returned before the second one's (a Ctrl-C seen here is what the caller should see).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::files::{write_file, write_to};
use super::plan::{graph_head_len, inline_tensors, Plan};
use super::stream::{
    producing_inline, write_data, write_graph_head, write_initializers, write_model,
};
use crate::error::{io_err, Error, Result};
use crate::hook::Hook;
use crate::temp::TempFile;

/// What the thread writing `path` returned; a panic as an error naming the file.
fn joined(thread: std::thread::ScopedJoinHandle<'_, Result<()>>, path: &Path) -> Result<()> {
    thread.join().unwrap_or_else(|_| {
        Err(Error::Serialization(format!(
            "writing {} failed: its thread panicked",
            path.display()
        )))
    })
}

/// Skeletons at least this large are written on a second thread beside an inline model's weights.
const SPLIT_SKELETON_BYTES: u64 = 1 << 20;

/// Whether `write_model_file` writes `p`'s skeleton on a second thread: weights inline (bytes to write
/// beside it) and a skeleton large enough for a thread to pay (node metadata: ~2 KiB a node).
fn splits(p: &Plan<'_>) -> bool {
    p.skeleton.len >= SPLIT_SKELETON_BYTES && inline_tensors(p).any(|t| !t.tensor.data.is_empty())
}

/// Writes the model file `tmp` for plan `p` (its bytes count from `base` for the hook). When `splits`,
/// the graph's head (the header and the skeleton, which holds the node metadata) is written by a
/// second thread through a handle of its own while this one writes the initializers after it, at the
/// offset the plan gives: the metadata of an inline model then costs no wall time beside its weights
/// on a machine with a second core (issue 13). The same bytes either way.
pub(super) fn write_model_file(
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    p: &Plan<'_>,
) -> Result<()> {
    if !splits(p) {
        return write_file(tmp, durable, (base, total), hook, |w| write_model(p, w));
    }
    let stop = AtomicBool::new(false);
    let stopped = || {
        if stop.load(Ordering::Relaxed) {
            Err(Error::Interrupted("the write was stopped".to_owned()))
        } else {
            Ok(())
        }
    };
    let split = graph_head_len(p);
    // made before the second handle is opened on it, and not truncated after
    let file = File::create(&tmp.path).map_err(|e| io_err(&tmp.path, e))?;
    let (head, rest) = std::thread::scope(|s| {
        let head = s.spawn(|| {
            let written = OpenOptions::new()
                .write(true)
                .open(&tmp.path)
                .map_err(|e| io_err(&tmp.path, e))
                .and_then(|file| {
                    let mut hook = |_: u64, _: u64| stopped();
                    write_to(file, tmp, false, (0, 0), &mut hook, |w| {
                        write_graph_head(p, w)
                    })
                });
            if written.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            written
        });
        let mut rest_hook = |d: u64, t: u64| {
            stopped()?;
            hook(d, t)
        };
        let rest = write_to(file, tmp, false, (base, total), &mut rest_hook, |w| {
            w.seek(SeekFrom::Start(split))?;
            producing_inline(p, |ahead| write_initializers(p, ahead, w))
        });
        if rest.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        (joined(head, &tmp.path), rest)
    });
    // this thread's error first (a Ctrl-C): the head's is then only that it was stopped
    rest?;
    head?;
    if durable {
        OpenOptions::new()
            .write(true)
            .open(&tmp.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(&tmp.path, e))?;
    }
    Ok(())
}

/// Writes the data file `data` on this thread while a second one writes the model file `model` (graph
/// and metadata, no weights; its bytes count from `base` but it reports nothing: its progress is
/// given with the save's last call of the hook).
pub(super) fn write_with_data(
    p: &Plan<'_>,
    model: &TempFile,
    data: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
) -> Result<()> {
    let (data_written, model_written) = std::thread::scope(|s| {
        let model_thread = s
            .spawn(|| write_model_file(model, durable, (base, total), &mut crate::hook::ignore, p));
        let data_written = write_file(data, durable, (0, total), hook, |w| write_data(p, w));
        (data_written, joined(model_thread, &model.path))
    });
    data_written?;
    model_written
}

#[cfg(test)]
mod tests {
    use super::splits;
    use crate::error::Error;
    use crate::scopes::Scope;
    use crate::writer::plan::plan;
    use crate::writer::tests::sample;
    use crate::writer::{save_with, to_bytes, SaveOptions};

    #[test]
    fn an_inline_model_with_a_large_skeleton_is_written_in_two_parts_with_the_same_bytes() {
        let dir = tempfile::tempdir().expect("dir");
        let mut m = sample(5 << 20);
        // node metadata past SPLIT_SKELETON_BYTES: the skeleton is written by a second thread
        let scope = m.graph.scopes.add(Scope {
            prefix: "/big".into(),
            props: vec![("stack".into(), "x".repeat(700 << 10))],
        });
        for n in &mut m.graph.nodes {
            n.scope = Some(scope);
        }
        let whole = to_bytes(&m).expect("bytes");
        assert!(splits(&plan(&m, None).expect("plan")));
        for durable in [false, true] {
            let path = dir.path().join(format!("m{durable}.onnx"));
            let options = SaveOptions {
                external: Some(false),
                location: None,
                durable,
            };
            let mut calls = Vec::new();
            let info = save_with(&m, &path, &options, &mut |done, total| {
                calls.push((done, total));
                Ok(())
            })
            .expect("save");
            assert!(std::fs::read(&path).expect("model") == whole);
            let total = info.model_bytes;
            assert_eq!(calls.last(), Some(&(total, total)));
            assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{calls:?}");
        }
        // a stop between two pieces of the weights leaves no file behind
        let path = dir.path().join("stopped.onnx");
        let options = SaveOptions {
            external: Some(false),
            ..Default::default()
        };
        let stop = |done: u64, _: u64| {
            if done > 0 {
                Err(Error::Interrupted("stop".into()))
            } else {
                Ok(())
            }
        };
        assert!(save_with(&m, &path, &options, &mut { stop }).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 2);
    }
}
