//! Optimization passes, driven by the `optimize=` setting of `to_onnx`.

mod cleanup;
mod fold;
mod simplify;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::graph::Graph;

pub use cleanup::{remove_identities, remove_unused};
pub use fold::fold_constants;
pub use simplify::{eliminate_common_subexpressions, fold_weight_transposes, mark_noops};

/// The three settings of `optimize=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The graph as converted.
    None,
    /// Standard ONNX only: any runtime loads the result.
    Default,
    /// Also onnxruntime's contrib operators where they pay.
    OnnxRuntime,
}

impl std::str::FromStr for Level {
    type Err = Error;
    fn from_str(s: &str) -> Result<Level> {
        match s {
            "none" => Ok(Level::None),
            "default" => Ok(Level::Default),
            "onnxruntime" => Ok(Level::OnnxRuntime),
            other => Err(Error::Graph(format!(
                "unknown optimization level {other:?}: expected 'none', 'default' or 'onnxruntime'"
            ))),
        }
    }
}

/// Runs the passes of `level`; returns how often each pass changed the graph.
pub fn optimize(graph: &mut Graph, level: Level) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    if level == Level::None {
        return counts;
    }
    counts.insert("constants_folded".to_owned(), fold_constants(graph));
    counts.insert("noops_removed".to_owned(), mark_noops(graph));
    counts.insert(
        "cse_merged".to_owned(),
        eliminate_common_subexpressions(graph),
    );
    counts.insert(
        "weights_transposed".to_owned(),
        fold_weight_transposes(graph),
    );
    counts.insert("identity_removed".to_owned(), remove_identities(graph));
    let (nodes, inits) = remove_unused(graph);
    counts.insert("unused_nodes_removed".to_owned(), nodes);
    counts.insert("unused_initializers_removed".to_owned(), inits);
    counts
}
