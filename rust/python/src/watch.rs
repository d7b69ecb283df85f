//! The hook the bindings give the core's long operations (`fastonnx_core::hook`): signals and
//! progress, with the GIL taken only between pieces of work.

use std::time::{Duration, Instant};

use fastonnx_core::Error;
use pyo3::prelude::*;

use crate::py_err;

/// How often a long operation takes the GIL back to run signal handlers and report progress.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The hook the bindings give long operations (`fastonnx_core::hook`), which run without the GIL: at
/// most every `WATCH_EVERY` (and at the end) it takes the GIL, runs the pending signal handlers — a
/// Ctrl-C raises KeyboardInterrupt there — and calls `progress(done, total)`. An exception stops the
/// operation; it is kept and raised unchanged once the operation has cleaned up.
pub(crate) struct Watch {
    progress: Option<Py<PyAny>>,
    last: Option<Instant>,
    raised: Option<PyErr>,
}

impl Watch {
    pub(crate) fn new(progress: Option<Py<PyAny>>) -> Self {
        Watch {
            progress,
            last: None,
            raised: None,
        }
    }

    /// Makes the first look wait an interval from now rather than happen at once (`optimize` leaves
    /// the GIL to `alongside` at first).
    pub(crate) fn wait_an_interval(&mut self) {
        self.last = Some(Instant::now());
    }

    pub(crate) fn step(&mut self, done: u64, total: u64) -> fastonnx_core::Result<()> {
        let now = Instant::now();
        if done < total
            && self
                .last
                .is_some_and(|t| now.duration_since(t) < WATCH_EVERY)
        {
            return Ok(());
        }
        self.last = Some(now);
        let progress = &self.progress;
        let outcome = Python::attach(|py| -> PyResult<()> {
            py.check_signals()?;
            if let Some(report) = progress {
                report.call1(py, (done, total))?;
            }
            Ok(())
        });
        outcome.map_err(|e| {
            self.raised = Some(e);
            Error::Interrupted("a Python exception stopped the operation".to_owned())
        })
    }

    /// The exception to raise for the operation's error: the one that stopped it, if any.
    pub(crate) fn error(&mut self, e: Error) -> PyErr {
        self.raised.take().unwrap_or_else(|| py_err(e))
    }
}
