//! The pipeline: which passes run, in which order, at which `optimize=` level and for which opsets.
//! Every pass is a plain `fn(&mut Graph) -> usize` returning how often it changed the graph; its
//! count goes to `stats["optimize"]` under the stage's counter. Passes know nothing of levels or
//! opsets: the table below decides where each one runs.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use super::{
    attention, cleanup, constant_folding, conv_batchnorm, cse, gelu, layer_norm, noops,
    packed_products, peephole, rms_norm, rotary, rotary_live, silu, skip_norm, weight_transposes,
    Level,
};
use crate::error::Result;
use crate::graph::Graph;
use crate::hook::Hook;

/// One step of the pipeline.
pub(crate) struct Stage {
    /// the key of the pass's count in `stats["optimize"]` (stages sharing a key add up)
    pub(crate) counter: &'static str,
    pub(crate) pass: fn(&mut Graph) -> usize,
    /// the levels it runs at
    pub(crate) levels: &'static [Level],
    /// the default-domain opsets it runs for
    pub(crate) opsets: RangeInclusive<i64>,
}

const BOTH: &[Level] = &[Level::Default, Level::OnnxRuntime];
const STANDARD_ONLY: &[Level] = &[Level::Default];
const ORT_ONLY: &[Level] = &[Level::OnnxRuntime];

/// The first opsets of the standard operators the fusions emit.
const LAYER_NORMALIZATION: i64 = 17;
const GELU: i64 = 20;
const ATTENTION: i64 = 23;
const RMS_NORMALIZATION: i64 = 23;
const ROTARY_EMBEDDING: i64 = 23;
/// Split reads its sizes from an input (not an attribute) from this opset: the form the packing emits.
const SPLIT_SIZES_INPUT: i64 = 13;

const fn stage(
    counter: &'static str,
    pass: fn(&mut Graph) -> usize,
    levels: &'static [Level],
    opsets: RangeInclusive<i64>,
) -> Stage {
    Stage {
        counter,
        pass,
        levels,
        opsets,
    }
}

const ANY: RangeInclusive<i64> = 0..=i64::MAX;
const fn from(opset: i64) -> RangeInclusive<i64> {
    opset..=i64::MAX
}
const fn below(opset: i64) -> RangeInclusive<i64> {
    0..=opset - 1
}

/// Every stage, in order. Order matters:
/// - folding first: it turns shape arithmetic into the constants the matchers read;
/// - attention before the peephole rewrites, which would compose the key's two Transposes into one the
///   matcher does not know;
/// - the RMS fusion before the LayerNorm one, which completes a LayerNorm whose inner part it took;
/// - equal initializers merge before CSE (nodes reading them become equal), and CSE merges duplicate
///   Transposes before they are folded into weights;
/// - the clean-up last.
pub(crate) const STAGES: &[Stage] = &[
    stage(
        "constants_folded",
        constant_folding::fold_constants,
        BOTH,
        ANY,
    ),
    stage(
        "group_query_attention_fused",
        attention::shared_cache::fuse_shared_cache,
        ORT_ONLY,
        ANY,
    ),
    stage(
        "attention_fused",
        attention::standard::fuse_attention,
        BOTH,
        from(ATTENTION),
    ),
    stage(
        "multi_head_attention_fused",
        attention::multi_head::fuse_multi_head,
        ORT_ONLY,
        below(ATTENTION),
    ),
    stage(
        "attention_open_masks_removed",
        attention::open_masks::remove_open_masks,
        BOTH,
        below(ATTENTION),
    ),
    stage(
        "grouped_attention_unrepeated",
        attention::grouped::ungroup_repeats,
        BOTH,
        below(ATTENTION),
    ),
    stage("patterns_rewritten", peephole::rewrite_patterns, BOTH, ANY),
    stage(
        "rms_norm_fused",
        rms_norm::fuse_standard,
        STANDARD_ONLY,
        from(RMS_NORMALIZATION),
    ),
    stage("rms_norm_fused", rms_norm::fuse_contrib, ORT_ONLY, ANY),
    stage("skip_norm_fused", skip_norm::fuse_skip_norms, ORT_ONLY, ANY),
    stage(
        "layer_norm_fused",
        layer_norm::fuse_layer_norm,
        BOTH,
        from(LAYER_NORMALIZATION),
    ),
    stage("gelu_fused", gelu::fuse_standard, BOTH, from(GELU)),
    stage("gelu_fused", gelu::fuse_contrib, ORT_ONLY, below(GELU)),
    stage("silu_fused", silu::fuse_quick_gelu, ORT_ONLY, ANY),
    stage(
        "rotary_fused",
        rotary::fuse_standard,
        STANDARD_ONLY,
        from(ROTARY_EMBEDDING),
    ),
    stage(
        "rotary_fused",
        rotary::fuse_standard_or_contrib,
        ORT_ONLY,
        from(ROTARY_EMBEDDING),
    ),
    stage(
        "rotary_fused",
        rotary::fuse_contrib,
        ORT_ONLY,
        below(ROTARY_EMBEDDING),
    ),
    stage(
        "rotary_live_fused",
        rotary_live::fuse_live,
        BOTH,
        from(ROTARY_EMBEDDING),
    ),
    stage(
        "rotary_live_fused",
        rotary_live::fuse_live_contrib,
        ORT_ONLY,
        below(ROTARY_EMBEDDING),
    ),
    stage(
        "group_query_attention_rotary_folded",
        attention::gqa_rotary::fold_rotary,
        ORT_ONLY,
        ANY,
    ),
    stage("noops_removed", noops::mark_noops, BOTH, ANY),
    stage(
        "initializers_deduplicated",
        cleanup::dedup_small_initializers,
        BOTH,
        ANY,
    ),
    stage(
        "cse_merged",
        cse::eliminate_common_subexpressions,
        BOTH,
        ANY,
    ),
    stage(
        "weights_transposed",
        weight_transposes::fold_weight_transposes,
        BOTH,
        ANY,
    ),
    stage(
        "conv_batchnorm_fused",
        conv_batchnorm::fuse_conv_batchnorm,
        BOTH,
        ANY,
    ),
    stage("identity_removed", cleanup::remove_identities, BOTH, ANY),
    stage(
        "products_packed",
        packed_products::pack_products,
        ORT_ONLY,
        from(SPLIT_SIZES_INPUT),
    ),
    stage(
        "group_query_attention_qkv_packed",
        attention::gqa_rotary::pack_qkv,
        ORT_ONLY,
        ANY,
    ),
    stage(
        "unused_nodes_removed",
        cleanup::remove_unused_nodes,
        BOTH,
        ANY,
    ),
    stage(
        "unused_initializers_removed",
        cleanup::remove_unused_initializers,
        BOTH,
        ANY,
    ),
];

/// The stages that run at `level` for `opset`, in order.
pub(crate) fn stages(level: Level, opset: i64) -> impl Iterator<Item = &'static Stage> {
    STAGES
        .iter()
        .filter(move |s| s.levels.contains(&level) && s.opsets.contains(&opset))
}

/// Runs the stages of `level` for `opset`; returns every counter of the table (0 for the stages that
/// did not run, so that the keys do not depend on the level or opset), or nothing at `Level::None`.
/// `hook` is called with (stages done, stages to run) before each stage and after the last; its error
/// stops the pipeline between two stages (the graph is then partly optimized) and is returned.
pub(crate) fn run(
    graph: &mut Graph,
    level: Level,
    opset: i64,
    hook: &mut Hook<'_>,
) -> Result<BTreeMap<String, usize>> {
    if level == Level::None {
        return Ok(BTreeMap::new());
    }
    let mut counts: BTreeMap<String, usize> =
        STAGES.iter().map(|s| (s.counter.to_owned(), 0)).collect();
    let todo: Vec<&Stage> = stages(level, opset).collect();
    let total = todo.len() as u64;
    for (done, s) in todo.into_iter().enumerate() {
        hook(done as u64, total)?;
        *counts.entry(s.counter.to_owned()).or_default() += (s.pass)(graph);
    }
    hook(total, total)?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_sharing_a_counter_never_run_together() {
        // a counter with two stages counts one fusion two ways: never both at one level and opset
        for level in [Level::Default, Level::OnnxRuntime] {
            for opset in 1..=30 {
                let mut seen: Vec<&str> = stages(level, opset).map(|s| s.counter).collect();
                let all = seen.len();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), all, "{level:?} {opset}");
            }
        }
    }

    #[test]
    fn no_level_runs_nothing() {
        let mut g = Graph::new("g");
        let ignore = &mut crate::hook::ignore;
        assert!(run(&mut g, Level::None, 20, ignore)
            .expect("run")
            .is_empty());
        let counts = run(&mut g, Level::Default, 20, ignore).expect("run");
        assert!(counts.contains_key("multi_head_attention_fused"));
    }

    #[test]
    fn the_hook_sees_every_stage_and_stops_between_two() {
        let mut g = Graph::new("g");
        let total = stages(Level::Default, 20).count() as u64;
        let mut seen = Vec::new();
        run(&mut g, Level::Default, 20, &mut |done, all| {
            seen.push((done, all));
            Ok(())
        })
        .expect("run");
        let want: Vec<(u64, u64)> = (0..=total).map(|d| (d, total)).collect();
        assert_eq!(seen, want);
        let mut calls = 0;
        let err = run(&mut g, Level::Default, 20, &mut |done, _| {
            calls += 1;
            if done == 3 {
                Err(crate::Error::Interrupted("asked".into()))
            } else {
                Ok(())
            }
        })
        .expect_err("stopped");
        assert!(matches!(err, crate::Error::Interrupted(_)));
        assert_eq!(calls, 4);
    }
}
