//! The one way long operations (the write, the optimization) let their caller in between pieces of
//! work: to stop them (a pending Ctrl-C, seen by the Python bindings) or to show how far they are.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// Called with (done, total) between pieces of work, in the operation's own unit (bytes for the write,
/// stages for the optimization), and once more with done == total before the operation commits
/// anything. An `Err` stops the operation, which cleans up and returns that error.
pub type Hook<'a> = dyn FnMut(u64, u64) -> Result<()> + 'a;

/// The hook of callers that neither stop nor watch.
pub fn ignore(_done: u64, _total: u64) -> Result<()> {
    Ok(())
}

/// What [`run_beside`] returns once both sides are done.
#[derive(Debug)]
pub struct Outcomes<T, E> {
    /// What `work` returned (`Error::Interrupted` when a failure of `beside` stopped it).
    pub work: Result<T>,
    /// What `beside` returned; None when its thread panicked.
    pub beside: Option<std::result::Result<(), E>>,
}

/// Runs `work` on this thread while `beside` runs on a second one, and returns what both returned
/// once both are done. `work` is given `hook`
/// behind a check: once `beside` has failed, the next call stops `work` (`Error::Interrupted`, which
/// is then only the consequence of `beside`'s error). `beside` is never stopped from here: it ends by
/// itself (in the bindings it is Python code).
///
/// `work` stays on the calling thread, already running: a thread just made may wait for a core (on a
/// VM, for its virtual CPU to be woken), and the shorter work waiting costs less.
pub fn run_beside<T, E: Send>(
    beside: impl FnOnce() -> std::result::Result<(), E> + Send,
    hook: &mut Hook<'_>,
    work: impl FnOnce(&mut Hook<'_>) -> Result<T>,
) -> Outcomes<T, E> {
    let failed = AtomicBool::new(false);
    std::thread::scope(|s| {
        let second = s.spawn(|| {
            let outcome = beside();
            if outcome.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            outcome
        });
        let mut checked = |done: u64, total: u64| -> Result<()> {
            if failed.load(Ordering::Relaxed) {
                return Err(Error::Interrupted(
                    "the work beside this operation failed".to_owned(),
                ));
            }
            hook(done, total)
        };
        let work = work(&mut checked);
        Outcomes {
            work,
            beside: second.join().ok(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Counts to `n`, calling the hook before each step.
    fn count(n: u64, hook: &mut Hook<'_>) -> Result<u64> {
        for i in 0..n {
            hook(i, n)?;
        }
        hook(n, n)?;
        Ok(n)
    }

    #[test]
    fn both_sides_run_to_the_end() {
        let mut calls = 0;
        let Outcomes {
            work: worked,
            beside,
        } = run_beside(
            || Ok::<_, String>(()),
            &mut |_, _| {
                calls += 1;
                Ok(())
            },
            |hook| count(5, hook),
        );
        assert_eq!(worked.expect("worked"), 5);
        assert_eq!(beside, Some(Ok(())));
        assert_eq!(calls, 6, "the caller's hook sees every call");
    }

    #[test]
    fn a_failure_beside_stops_the_work_at_its_next_hook_call() {
        let (failed_tx, failed_rx) = mpsc::channel();
        let Outcomes {
            work: worked,
            beside,
        } = run_beside(
            move || {
                let outcome = Err("composing failed");
                // told once the flag is up (the store follows the return): wait for it in the hook
                failed_tx.send(()).expect("send");
                outcome
            },
            &mut |_, _| Ok(()),
            |hook| {
                failed_rx.recv().expect("beside ended");
                // the flag is set right after `beside` returns: call until it is seen
                loop {
                    hook(0, 1)?;
                    std::thread::yield_now();
                }
            },
        );
        let stopped: Result<()> = worked;
        assert!(matches!(stopped, Err(Error::Interrupted(_))));
        assert_eq!(beside, Some(Err("composing failed")));
    }

    #[test]
    fn the_callers_hook_error_stops_the_work_and_not_beside() {
        let Outcomes {
            work: worked,
            beside,
        } = run_beside(
            || Ok::<_, String>(()),
            &mut |done, _| {
                if done == 2 {
                    return Err(Error::Interrupted("ctrl-c".to_owned()));
                }
                Ok(())
            },
            |hook| count(5, hook),
        );
        assert!(matches!(worked, Err(Error::Interrupted(m)) if m == "ctrl-c"));
        assert_eq!(beside, Some(Ok(())));
    }

    #[test]
    fn a_panic_beside_is_reported_as_none_after_the_work() {
        let Outcomes {
            work: worked,
            beside,
        } = run_beside(
            || -> std::result::Result<(), String> { panic!("beside panicked") },
            &mut |_, _| Ok(()),
            |hook| count(3, hook),
        );
        assert_eq!(worked.expect("worked"), 3);
        assert_eq!(beside, None);
    }
}
