//! The checkpoint shards referenced tensors point into, hard-linked beside a model saved elsewhere.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::Model;
use crate::temp::TempFile;
use crate::tensor::TensorData;

/// Hard links, made under temporary names beside the model, of the files referenced tensors point into
/// that are not in `folder` already: onnxruntime reads external data only inside the model's folder,
/// symbolic links refused. Renamed into place with the model (a file of that name there is replaced),
/// removed when the save fails; a killed save's are swept like its other temporaries.
pub(super) fn link_references(m: &Model, folder: &Path) -> Result<Vec<(TempFile, PathBuf)>> {
    let used: std::collections::BTreeSet<&str> = m
        .graph
        .initializers
        .iter()
        .filter_map(|t| match &t.data {
            TensorData::Referenced { location, .. } => Some(location.as_ref()),
            _ => None,
        })
        .collect();
    let mut links = Vec::new();
    for name in used {
        // a location without a known source: the caller put the file beside the model itself
        let Some(source) = m.reference_sources.get(name) else {
            continue;
        };
        let target = folder.join(name);
        if same_file(&target, source) {
            continue;
        }
        let tmp = TempFile::beside(&target);
        std::fs::hard_link(source, &tmp.path).map_err(|e| {
            Error::Serialization(format!(
                "cannot hard-link {} into {} ({e}): onnxruntime reads external data only inside the \
                 model's folder; write the model beside the shards or on their filesystem",
                source.display(),
                folder.display()
            ))
        })?;
        links.push((tmp, target));
    }
    Ok(links)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::same_file;
    use crate::dtype;
    use crate::error::Error;
    use crate::writer::tests::{listing, sample};
    use crate::writer::{save, save_with, SaveOptions};

    #[test]
    fn referenced_files_are_linked_beside_a_model_written_elsewhere() {
        let shards = tempfile::tempdir().expect("dir");
        let out = tempfile::tempdir().expect("dir");
        let shard = shards.path().join("shard.safetensors");
        std::fs::write(&shard, vec![7u8; 1128]).expect("shard");
        let mut m = sample(100);
        let d = m
            .graph
            .add_deferred_initializer("r", dtype::FLOAT, vec![4, 8])
            .expect("deferred");
        m.graph.add_output(&d, None).expect("out");
        m.graph
            .reference_initializer("r", "shard.safetensors", 1000, 128)
            .expect("referenced");
        m.reference_sources
            .insert("shard.safetensors".to_owned(), shard.clone());
        // a stop before the renames: neither the model nor the link is left
        let path = out.path().join("m.onnx");
        let stop = |_: u64, _: u64| Err(Error::Serialization("stop".into()));
        let options = SaveOptions {
            external: None,
            location: None,
            durable: false,
        };
        assert!(save_with(&m, &path, &options, &mut { stop }).is_err());
        assert!(listing(out.path()).is_empty());
        let info = save(&m, &path, None, None).expect("save");
        assert_eq!(info.linked, [out.path().join("shard.safetensors")]);
        assert!(same_file(&out.path().join("shard.safetensors"), &shard));
        assert_eq!(listing(out.path()), ["m.onnx", "shard.safetensors"]);
        // beside the shard, or with the link already there: nothing to link
        let again = save(&m, &path, None, None).expect("save");
        assert!(again.linked.is_empty());
        let beside = save(&m, &shards.path().join("m.onnx"), None, None).expect("save");
        assert!(beside.linked.is_empty());
    }
}
