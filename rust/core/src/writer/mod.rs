//! Serialization. Everything but the weights' bytes is encoded with prost; the weights are written
//! straight from their borrowed memory after length-prefixed headers, so a model is never assembled
//! in memory. Files are written to temporary names in the target folder and renamed at the end, the
//! `.onnx` last, so that a failed or interrupted save never leaves a model pointing at wrong data.
//!
//! One job a file: `proto` builds the prost messages, `skeleton` encodes the top graph's nodes with
//! their metadata straight from the scopes, `plan` computes every length and offset before the first
//! byte, `stream` writes a planned model's bytes, `files` meters the files for the hook, `threads`
//! holds the writes that take a second thread, `links` hard-links referenced checkpoint shards,
//! `value_info` the types of the intermediate values (`Model::value_info`); this file is the save API.

mod files;
mod links;
mod plan;
mod proto;
mod skeleton;
mod stream;
mod threads;
mod value_info;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::error::{io_err, Error, Result};
use crate::hook::Hook;
use crate::model::Model;
use crate::temp::{self, TempFile};

/// Protobuf messages must stay under 2 GiB (readers use signed 32-bit sizes).
pub const PROTOBUF_LIMIT: u64 = (1 << 31) - 1;
/// Tensors at least this large go to the data file when external data is used.
pub const EXTERNAL_MIN_BYTES: usize = 1024;
/// Offsets of external tensors over 1 MiB are aligned to 64 KiB (mmap-friendly on every platform).
pub const ALIGN_LARGE: u64 = 1 << 16;
pub const ALIGN_SMALL: u64 = 64;

const DEFERRED_INLINE: &str =
    "the model has weights on the meta device (no bytes yet): it can only be \
     saved with external data, whose holes fastonnx.attach_weights fills later";
const REFERENCED_INLINE: &str =
    "the model references weights in other files (safetensors shards): it can only be \
     saved with external data";

/// What a save wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveInfo {
    pub path: PathBuf,
    pub data_path: Option<PathBuf>,
    pub external_data: bool,
    pub switched_to_external: bool,
    pub model_bytes: u64,
    pub data_bytes: u64,
    pub external_tensors: usize,
    /// Tensors whose external data points into other files (not written), and their bytes.
    pub referenced_tensors: usize,
    pub referenced_bytes: u64,
    /// Temporaries of killed processes that were removed from the folder before writing.
    pub swept: Vec<PathBuf>,
    /// Files referenced tensors point into, hard-linked beside the model by this save.
    pub linked: Vec<PathBuf>,
}

/// The whole model as bytes, weights inline.
pub fn to_bytes(m: &Model) -> Result<Vec<u8>> {
    if m.graph.has_deferred() {
        return Err(Error::Serialization(DEFERRED_INLINE.to_owned()));
    }
    if m.graph.has_referenced() {
        return Err(Error::Serialization(REFERENCED_INLINE.to_owned()));
    }
    let p = plan::plan(m, None)?;
    if p.model_len > PROTOBUF_LIMIT {
        return Err(Error::TooLarge { size: p.model_len });
    }
    let mut out = Vec::with_capacity(p.model_len as usize);
    stream::write_model(&p, &mut out).map_err(|e| Error::Serialization(e.to_string()))?;
    Ok(out)
}

/// How a model is saved.
#[derive(Debug, Clone, Copy, Default)]
pub struct SaveOptions<'a> {
    /// Some(true) always writes weights to `<location>` beside the model, Some(false) never
    /// (TooLarge past 2 GiB), None only when the inline protobuf would pass 2 GiB.
    pub external: Option<bool>,
    /// The data file's name beside the model (`<model file name>.data` by default).
    pub location: Option<&'a str>,
    /// Flush the data file and the model file to the disk before the renames, and the folder after:
    /// the files survive a power loss once the save returns.
    pub durable: bool,
}

/// Writes `m` to `path`. `external`: Some(true) always writes weights to `<location>` beside it,
/// Some(false) never (TooLarge past 2 GiB), None only when the inline protobuf would pass 2 GiB.
pub fn save(
    m: &Model,
    path: &Path,
    external: Option<bool>,
    location: Option<&str>,
) -> Result<SaveInfo> {
    let options = SaveOptions {
        external,
        location,
        durable: false,
    };
    save_with(m, path, &options, &mut crate::hook::ignore)
}

/// Writes `m` to `path` as `options` say. `hook` is called with (bytes written, bytes to write) every
/// 2 MiB and once before the renames; its error stops the save, which removes its temporary files,
/// leaves the files already at `path` untouched and returns that error. Temporaries that killed
/// processes of this host left in the folder are removed first (`SaveInfo::swept`).
pub fn save_with(
    m: &Model,
    path: &Path,
    options: &SaveOptions<'_>,
    hook: &mut Hook<'_>,
) -> Result<SaveInfo> {
    if path.is_dir() {
        return Err(Error::Serialization(format!(
            "cannot write {}: it is a folder",
            path.display()
        )));
    }
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .ok_or_else(|| {
            Error::Serialization(format!("cannot write {}: no file name", path.display()))
        })?;
    let default_location = format!("{file_name}.data");
    let location = options.location.unwrap_or(&default_location);
    if location.contains('/') || location.contains('\\') || location.is_empty() {
        return Err(Error::Serialization(format!(
            "external data location {location:?} must be a plain file name beside the model"
        )));
    }
    let external = options.external;

    let deferred = m.graph.has_deferred();
    if deferred && external == Some(false) {
        return Err(Error::Serialization(DEFERRED_INLINE.to_owned()));
    }
    let referenced = m.graph.has_referenced();
    if referenced && external == Some(false) {
        return Err(Error::Serialization(REFERENCED_INLINE.to_owned()));
    }
    let mut use_external = external.unwrap_or(deferred || referenced);
    let mut p = plan::plan(m, use_external.then_some(location))?;
    // external=None: the data file only when the inline protobuf would pass 2 GiB (planned again then)
    let switched = external.is_none() && !use_external && p.model_len > PROTOBUF_LIMIT;
    if switched {
        use_external = true;
        p = plan::plan(m, Some(location))?;
    }
    if p.model_len > PROTOBUF_LIMIT {
        return Err(Error::TooLarge { size: p.model_len });
    }
    let folder = match path.parent() {
        Some(f) if !f.as_os_str().is_empty() => f.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let swept = temp::sweep(&folder);
    let mut links = links::link_references(m, &folder)?;
    let data_len = if use_external { p.data_len } else { 0 };
    let total = data_len + p.model_len;
    let data_target = path.with_file_name(location);
    // every external tensor referenced elsewhere: no data file of our own
    let own_data = p.tensors.iter().any(|t| t.offset.is_some());
    let mut model_tmp = TempFile::beside(path);
    let data_tmp = if use_external && own_data {
        // the model file (graph and metadata, no weights) is written on a second thread while this one
        // writes the weights: its progress is reported with the last call of the hook below
        let tmp = TempFile::beside(&data_target);
        threads::write_with_data(
            &p,
            &model_tmp,
            &tmp,
            options.durable,
            (data_len, total),
            hook,
        )?;
        Some(tmp)
    } else {
        threads::write_model_file(&model_tmp, options.durable, (data_len, total), hook, &p)?;
        None
    };
    // the last word before anything is renamed: a stop asked for now still leaves the old files
    hook(total, total)?;
    if let Some(mut tmp) = data_tmp {
        // An older model at `path` would read the new data file: remove it before the data moves in.
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| io_err(path, e))?;
        }
        tmp.commit(&data_target)?;
    }
    for (tmp, target) in &mut links {
        tmp.commit(target)?;
    }
    model_tmp.commit(path)?;
    if options.durable {
        temp::sync_folder(&folder)?;
    }
    Ok(SaveInfo {
        path: path.to_path_buf(),
        data_path: (use_external && own_data).then_some(data_target),
        external_data: use_external,
        switched_to_external: switched,
        model_bytes: p.model_len,
        data_bytes: p.data_len,
        external_tensors: p.tensors.iter().filter(|t| t.offset.is_some()).count(),
        referenced_tensors: p.tensors.iter().filter(|t| t.referenced).count(),
        referenced_bytes: p
            .tensors
            .iter()
            .filter(|t| t.referenced)
            .map(|t| t.tensor.data.len() as u64)
            .sum(),
        swept,
        linked: links.into_iter().map(|(_, target)| target).collect(),
    })
}
