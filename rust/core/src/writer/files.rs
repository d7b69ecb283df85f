//! Files written through a meter: the hook is called every 2 MiB written (a large `write_all` is cut
//! into writes that size), and its error is carried through the `io::Result`s of the write functions
//! to come out unchanged.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{io_err, Error, Result};
use crate::hook::Hook;
use crate::temp::TempFile;

/// How many bytes are written between two calls of the hook (a tensor written in one `write_all` is
/// cut into writes this large, so that a Ctrl-C is seen within milliseconds at any disk speed).
const HOOK_BYTES: usize = 2 << 20;

/// The hook's error, carried through the `io::Result`s of the write functions.
#[derive(Debug)]
struct Stop(Error);

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Stop {}

/// The hook's error when the write was stopped by it, the file's I/O error otherwise.
fn write_err(path: &Path, e: std::io::Error) -> Error {
    if !e.get_ref().is_some_and(|inner| inner.is::<Stop>()) {
        return io_err(path, e);
    }
    match e.into_inner().map(|inner| inner.downcast::<Stop>()) {
        Some(Ok(stop)) => stop.0,
        _ => Error::Interrupted("the write was stopped".to_owned()),
    }
}

/// A file being written, counting its bytes for the hook: the bytes of the files written before it
/// (`base`) and of this one, out of `total`.
pub(super) struct Metered<'a, 'h, W> {
    inner: W,
    pos: u64,
    reported: u64,
    base: u64,
    total: u64,
    hook: &'a mut Hook<'h>,
}

impl<W> Metered<'_, '_, W> {
    fn report(&mut self) -> std::io::Result<()> {
        self.reported = self.pos;
        (self.hook)(self.base + self.pos, self.total).map_err(|e| std::io::Error::other(Stop(e)))
    }
}

impl<W: Write> Write for Metered<'_, '_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(&buf[..buf.len().min(HOOK_BYTES)])?;
        self.pos += n as u64;
        if self.pos.saturating_sub(self.reported) >= HOOK_BYTES as u64 {
            self.report()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Seek> Seek for Metered<'_, '_, W> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

pub(super) type FileWriter<'a, 'h> = Metered<'a, 'h, BufWriter<File>>;

/// Writes `tmp` with `f`; its bytes count from `base` for the hook. `durable`: flushed to the disk
/// before returning.
pub(super) fn write_file(
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    f: impl FnOnce(&mut FileWriter<'_, '_>) -> std::io::Result<()>,
) -> Result<()> {
    let file = File::create(&tmp.path).map_err(|e| io_err(&tmp.path, e))?;
    write_to(file, tmp, durable, (base, total), hook, f)
}

/// `write_file` on `file`, the temporary `tmp` opened already.
pub(super) fn write_to(
    file: File,
    tmp: &TempFile,
    durable: bool,
    (base, total): (u64, u64),
    hook: &mut Hook<'_>,
    f: impl FnOnce(&mut FileWriter<'_, '_>) -> std::io::Result<()>,
) -> Result<()> {
    let mut w = Metered {
        inner: BufWriter::with_capacity(1 << 20, file),
        pos: 0,
        reported: 0,
        base,
        total,
        hook,
    };
    f(&mut w).map_err(|e| write_err(&tmp.path, e))?;
    let file = w
        .inner
        .into_inner()
        .map_err(|e| io_err(&tmp.path, e.into_error()))?;
    if durable {
        file.sync_all().map_err(|e| io_err(&tmp.path, e))?;
    }
    Ok(())
}
