//! Optimization passes, driven by the `optimize=` setting of `to_onnx`.

mod attention;
mod cleanup;
mod decomposed;
mod fold;
mod fuse;
mod matching;
mod multi_head;
mod norm_fusion;
mod rewrite;
mod rotary;
mod simplify;

use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result};
use crate::graph::{Graph, Model};

pub use attention::fuse_attention;
pub use cleanup::{dedup_small_initializers, remove_identities, remove_unused};
pub use decomposed::fuse_decomposed;
pub use fold::fold_constants;
pub use fuse::fuse_conv_batchnorm;
pub use norm_fusion::fuse_rms_norm;
pub use rewrite::rewrite_patterns;
pub use rotary::fuse_rotary;
pub use simplify::{eliminate_common_subexpressions, fold_weight_transposes, mark_noops};

/// Keeps the nodes whose index `keep` accepts (passes collect what to drop, then sweep once).
pub(crate) fn retain_nodes(g: &mut Graph, keep: impl Fn(usize) -> bool) {
    let mut index = 0;
    g.nodes.retain(|_| {
        index += 1;
        keep(index - 1)
    });
}

/// The float32 values of a constant initializer held in memory (None for other types).
pub(crate) fn f32_values(g: &Graph, name: &str) -> Option<Vec<f32>> {
    let t = g.initializer(name)?;
    if t.dtype != crate::dtype::FLOAT {
        return None;
    }
    Some(crate::tensor::le_f32s(t.data.as_slice()?))
}

/// Value name -> index of the node producing it.
pub(crate) fn producers(g: &Graph) -> HashMap<String, usize> {
    g.nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i)))
        .collect()
}

/// Value name -> how many times it is read (node inputs and graph outputs, and reads inside the
/// subgraphs of If / Loop / Scan nodes, which may read outer values: a fusion must not remove those).
pub(crate) fn readers(g: &Graph) -> HashMap<String, usize> {
    fn count(g: &Graph, r: &mut HashMap<String, usize>) {
        for name in g
            .nodes
            .iter()
            .flat_map(|n| n.inputs.iter())
            .chain(g.outputs.iter())
        {
            *r.entry(name.clone()).or_default() += 1;
        }
        for sub in g.nodes.iter().flat_map(|n| n.subgraphs()) {
            count(sub, r);
        }
    }
    let mut r = HashMap::new();
    count(g, &mut r);
    r
}

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
    let opset = model.opset();
    let counts = optimize(&mut model.graph, level, opset);
    if model.graph.nodes.iter().any(|n| n.domain == MS_DOMAIN) {
        model
            .opsets
            .entry(MS_DOMAIN.to_owned())
            .or_insert(MS_DOMAIN_VERSION);
    }
    counts
}

/// The fusions of hand-written (or decomposed) norms, activations and rotary embeddings. The RMS fusion
/// goes first: the LayerNorm fusion also completes a LayerNorm whose inner part it took.
fn fuse_elementwise_chains(
    graph: &mut Graph,
    level: Level,
    opset: i64,
    counts: &mut BTreeMap<String, usize>,
) {
    let rms = fuse_rms_norm(graph, level, opset);
    let (layer_norm, gelu, silu) = fuse_decomposed(graph, level, opset);
    let rotary = fuse_rotary(graph, level, opset);
    for (key, n) in [
        ("rms_norm_fused", rms),
        ("layer_norm_fused", layer_norm),
        ("gelu_fused", gelu),
        ("silu_fused", silu),
        ("rotary_fused", rotary),
    ] {
        counts.insert(key.to_owned(), n);
    }
}

/// Runs the passes of `level` for a graph of the given (default-domain) opset; returns how often each
/// pass changed the graph.
pub fn optimize(graph: &mut Graph, level: Level, opset: i64) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    if level == Level::None {
        return counts;
    }
    // order matters: folding feeds no-op detection, equal initializers merge before CSE (nodes reading
    // them become equal), CSE merges duplicate transposes before they are folded into weights, and the
    // clean-up runs last
    type Pass = fn(&mut Graph) -> usize;
    let passes: [(&str, Pass); 8] = [
        ("constants_folded", fold_constants),
        ("patterns_rewritten", rewrite_patterns),
        ("noops_removed", mark_noops),
        ("initializers_deduplicated", dedup_small_initializers),
        ("cse_merged", eliminate_common_subexpressions),
        ("weights_transposed", fold_weight_transposes),
        ("conv_batchnorm_fused", fuse_conv_batchnorm),
        ("identity_removed", remove_identities),
    ];
    for (name, pass) in passes {
        if name == "patterns_rewritten" {
            // before the rewrites compose the key's two Transposes into one the fusion cannot undo
            let (fused, opened) = fuse_attention(graph, level, opset);
            counts.insert("attention_fused".to_owned(), fused);
            counts.insert("attention_open_masks_removed".to_owned(), opened);
        }
        counts.insert(name.to_owned(), pass(graph));
        if name == "patterns_rewritten" {
            fuse_elementwise_chains(graph, level, opset, &mut counts);
        }
    }
    let (nodes, inits) = remove_unused(graph);
    counts.insert("unused_nodes_removed".to_owned(), nodes);
    counts.insert("unused_initializers_removed".to_owned(), inits);
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::graph::{AttrValue, Attribute, Dim};

    #[test]
    fn reads_inside_subgraphs_count() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2)]));
        let y = g
            .add_node("Neg", "", vec![x.clone()], &["y".into()], vec![], None)
            .expect("neg");
        let mut body = g.subgraph("then");
        let z = body
            .add_node("Abs", "", vec![y[0].clone()], &["z".into()], vec![], None)
            .expect("abs");
        body.outputs.push(z[0].clone());
        g.add_node("Abs", "", vec![y[0].clone()], &["a".into()], vec![], None)
            .expect("abs");
        let cond = g.add_input("c", dtype::BOOL, Some(vec![]));
        g.add_node(
            "If",
            "",
            vec![cond],
            &["out".into()],
            vec![Attribute {
                name: "then_branch".into(),
                value: AttrValue::Graph(Box::new(body)),
            }],
            None,
        )
        .expect("if");
        // y is read once by the outer graph's nodes, once inside the branch
        assert_eq!(readers(&g).get(&y[0]), Some(&2));
        assert_eq!(readers(&g).get(&x), Some(&1));
    }
}
