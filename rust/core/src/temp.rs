//! Temporary files beside a save's targets, and the sweep of those a killed export left behind.
//!
//! A temporary is named `<target>.tmp-<host>-<pid>-<random>`. A save that fails or is stopped removes
//! its own (on drop); a process killed outright (SIGKILL, the out-of-memory killer) cannot, so every
//! save first removes the temporaries in its folder that were made on this host by a process that no
//! longer exists. Temporaries of other hosts (a shared folder) and of live processes are left alone.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_err, Result};

/// A temporary file that is removed unless it was renamed into place.
pub(crate) struct TempFile {
    pub(crate) path: PathBuf,
    done: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl TempFile {
    /// A fresh name beside `target` (nothing is created yet).
    pub(crate) fn beside(target: &Path) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // random per process and per call: two exports of one process never share a name
        let random = RandomState::new().hash_one(n);
        let file = target
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = format!("{file}.tmp-{}-{}-{random:016x}", host(), std::process::id());
        TempFile {
            path: target.with_file_name(name),
            done: false,
        }
    }

    /// Renames the file to `target`; it is no longer removed on drop.
    pub(crate) fn commit(&mut self, target: &Path) -> Result<()> {
        std::fs::rename(&self.path, target).map_err(|e| io_err(target, e))?;
        self.done = true;
        Ok(())
    }
}

/// This machine's host name as temporaries carry it: characters other than letters, digits, `.`, `-`
/// and `_` replaced by `_` (it is part of a file name).
pub fn host() -> String {
    raw_host()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(unix)]
fn raw_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for the length given; gethostname writes at most that much
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(not(unix))]
fn raw_host() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "localhost".to_owned())
}

/// Whether process `pid` of this host may still be running (`kill(pid, 0)`: it exists, or exists and
/// belongs to another user). Where that cannot be known, every process counts as alive.
#[cfg(unix)]
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true; // 0 and negative numbers name process groups, never a temporary's writer
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn alive(_pid: u32) -> bool {
    true
}

/// The writer's pid when `name` is a temporary of this host (`<target>.tmp-<host>-<pid>-<16 hex>`).
fn temp_pid(name: &str, host: &str) -> Option<u32> {
    let marker = format!(".tmp-{host}-");
    let at = name.rfind(&marker)?;
    if at == 0 {
        return None; // no target name before the marker
    }
    let (pid, random) = name[at + marker.len()..].split_once('-')?;
    let hex = random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (hex && digits).then(|| pid.parse().ok()).flatten()
}

/// Removes the temporaries in `folder` that a process of this host that no longer exists left behind;
/// returns their paths. Files that cannot be listed or removed are left as they are (the save itself
/// reports a folder it cannot write).
pub fn sweep(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let host = host();
    let me = std::process::id();
    let mut removed = Vec::new();
    for entry in entries.filter_map(std::result::Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| temp_pid(n, &host)) else {
            continue;
        };
        if pid == me || alive(pid) {
            continue;
        }
        let path = entry.path();
        if std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed.sort();
    removed
}

/// Flushes the folder's entries (the renames) to the disk. Only POSIX systems can open a folder for
/// that; elsewhere the renames are as durable as the system makes them.
pub(crate) fn sync_folder(folder: &Path) -> Result<()> {
    if cfg!(unix) {
        File::open(folder)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(folder, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid that surely names no process: a child that was started and reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        pid
    }

    #[test]
    fn names_carry_host_and_pid_and_parse_back() {
        let t = TempFile::beside(Path::new("/x/m.onnx"));
        let name = t
            .path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with(&format!("m.onnx.tmp-{}-", host())),
            "{name}"
        );
        assert_eq!(temp_pid(&name, &host()), Some(std::process::id()));
        assert_ne!(TempFile::beside(Path::new("/x/m.onnx")).path, t.path);
        assert_eq!(
            temp_pid("m.onnx.tmp-other-12-0123456789abcdef", &host()),
            None
        );
        assert_eq!(
            temp_pid(&format!("m.onnx.tmp-{}-12-xyz", host()), &host()),
            None
        );
        assert_eq!(
            temp_pid(&format!(".tmp-{}-12-0123456789abcdef", host()), &host()),
            None
        );
    }

    #[cfg(unix)]
    #[test]
    fn sweep_removes_only_dead_temporaries_of_this_host() {
        let dir = tempfile::tempdir().expect("dir");
        let dead = dead_pid();
        let h = host();
        let names = [
            format!("m.onnx.tmp-{h}-{dead}-0123456789abcdef"), // removed
            format!("m.onnx.data.tmp-{h}-{dead}-fedcba9876543210"), // removed
            format!("m.onnx.tmp-{h}-{}-0123456789abcdef", std::process::id()), // alive: this process
            format!("m.onnx.tmp-elsewhere.example-{dead}-0123456789abcdef"),   // another host
            "m.onnx".to_owned(),
        ];
        for n in &names {
            std::fs::write(dir.path().join(n), b"x").expect("write");
        }
        let removed = sweep(dir.path());
        let want: Vec<PathBuf> = {
            let mut w = vec![dir.path().join(&names[0]), dir.path().join(&names[1])];
            w.sort();
            w
        };
        assert_eq!(removed, want);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(std::result::Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut expected = names[2..].to_vec();
        expected.sort();
        assert_eq!(left, expected);
    }
}
