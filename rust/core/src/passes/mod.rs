//! Optimization passes, driven by the `optimize=` setting of `to_onnx`.
//!
//! [`pipeline`] lists the stages each level runs, in order; every fusion matches on the unchanged graph
//! and changes it through one [`rewrite::Rewrite`] per match, applied in one sweep.

mod attention;
mod cleanup;
mod constant_folding;
mod conv_batchnorm;
mod cse;
mod expert_quantization;
mod gelu;
mod layer_norm;
mod matching;
mod noops;
mod packed_products;
mod peephole;
mod pipeline;
mod quantized_gathers;
mod rewrite;
mod rms_norm;
mod rotary;
mod rotary_live;
mod silu;
mod skip_norm;
mod stored_weights;
mod weight_quantization;
mod weight_transposes;

use std::collections::{BTreeMap, HashSet};

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::hook::{Hook, Outcomes};
use crate::model::Model;

// the passes the benches time one by one
pub use cleanup::{remove_identities, remove_unused_nodes};
pub use constant_folding::fold_constants;
pub use cse::eliminate_common_subexpressions;
pub use noops::mark_noops;
pub use weight_quantization::{
    quantizable_experts, quantizable_weights, quantize_weights, QuantizeSettings, ShardSource,
};

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

/// The domain of onnxruntime's contrib operators, and the version of it the fusions emit.
pub const MS_DOMAIN: &str = "com.microsoft";
const MS_DOMAIN_VERSION: i64 = 1;

/// Optimizes a model's graph (see [`optimize`]) and imports the contrib domain when a fusion used it.
pub fn optimize_model(model: &mut Model, level: Level) -> BTreeMap<String, usize> {
    match optimize_model_with(model, level, &mut crate::hook::ignore) {
        Ok(counts) => counts,
        Err(_) => unreachable!("a hook that never fails stopped the optimization"),
    }
}

/// [`optimize_model`] with a hook called between stages (see `pipeline::run`): its error stops the
/// optimization and is returned.
pub fn optimize_model_with(
    model: &mut Model,
    level: Level,
    hook: &mut Hook<'_>,
) -> Result<BTreeMap<String, usize>> {
    let opset = model.opset();
    let mut counts = pipeline::run(&mut model.graph, level, opset, hook)?;
    // each local function's body on its own: no fusion crosses a call (the hook still sees each
    // stage, so a Ctrl-C stops here too, but the progress stays at the main graph's end)
    for f in &mut model.functions {
        let body = pipeline::run(&mut f.graph, level, opset, &mut |_, _| hook(1, 1))?;
        for (k, v) in body {
            *counts.entry(k).or_default() += v;
        }
    }
    let uses_ms = |g: &Graph| g.nodes.iter().any(|n| n.domain == MS_DOMAIN);
    if uses_ms(&model.graph) || model.functions.iter().any(|f| uses_ms(&f.graph)) {
        model
            .opsets
            .entry(MS_DOMAIN.to_owned())
            .or_insert(MS_DOMAIN_VERSION);
    }
    Ok(counts)
}

/// [`optimize_model_with`] on this thread while `alongside` runs on a second one (see
/// [`crate::hook::run_beside`]): the Python bindings compose the node metadata there, which then costs
/// no wall time on a machine with a second core. An error of `alongside` stops the passes at their
/// next stage.
pub fn optimize_model_alongside<E: Send>(
    model: &mut Model,
    level: Level,
    hook: &mut Hook<'_>,
    alongside: impl FnOnce() -> std::result::Result<(), E> + Send,
) -> Outcomes<BTreeMap<String, usize>, E> {
    crate::hook::run_beside(alongside, hook, |hook| {
        optimize_model_with(model, level, hook)
    })
}

/// Before the passes of `level`: the Linear weights in `keep` (to be referenced in a checkpoint, so
/// kept as stored) are read untransposed, by Gemm or by onnxruntime's FusedMatMul (see
/// `stored_weights`); imports the contrib domain when used. Returns how many products changed.
pub fn read_weights_as_stored(model: &mut Model, keep: &[String], level: Level) -> usize {
    let contrib = match level {
        Level::None => return 0,
        Level::Default => false,
        Level::OnnxRuntime => true,
    };
    let keep: HashSet<String> = keep.iter().cloned().collect();
    let count = stored_weights::read_as_stored(&mut model.graph, &keep, contrib);
    if contrib && count > 0 {
        model
            .opsets
            .entry(MS_DOMAIN.to_owned())
            .or_insert(MS_DOMAIN_VERSION);
    }
    count
}

/// Runs the passes of `level` for a graph of the given (default-domain) opset; returns how often each
/// pass changed the graph (every counter, 0 for passes that did not run; nothing at `Level::None`).
pub fn optimize(graph: &mut Graph, level: Level, opset: i64) -> BTreeMap<String, usize> {
    match pipeline::run(graph, level, opset, &mut crate::hook::ignore) {
        Ok(counts) => counts,
        Err(_) => unreachable!("a hook that never fails stopped the optimization"),
    }
}
