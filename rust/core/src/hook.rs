//! The one way long operations (the write, the optimization) let their caller in between pieces of
//! work: to stop them (a pending Ctrl-C, seen by the Python bindings) or to show how far they are.

use crate::error::Result;

/// Called with (done, total) between pieces of work, in the operation's own unit (bytes for the write,
/// stages for the optimization), and once more with done == total before the operation commits
/// anything. An `Err` stops the operation, which cleans up and returns that error.
pub type Hook<'a> = dyn FnMut(u64, u64) -> Result<()> + 'a;

/// The hook of callers that neither stop nor watch.
pub fn ignore(_done: u64, _total: u64) -> Result<()> {
    Ok(())
}
