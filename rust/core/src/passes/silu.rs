//! SiLU, `x * Sigmoid(x)`, fused into onnxruntime's `com.microsoft.QuickGelu(x, alpha = 1)` (any
//! opset): the kernel onnxruntime's own session optimizer would fuse it into, so the file holds one
//! node and the session has less to do. Not fused for standard runtimes: the standard Swish (opset 24)
//! ran 0.73-0.84x as fast as the Mul and Sigmoid in onnxruntime 1.31, which inlines its function body
//! and then misses its QuickGelu fusion, and an opset-25 or 26 model holding Swish does not load.
//! Only float32 chains are fused.

use super::matching::{float_attr, is_float, is_op, other, output, sole_reader, Index};
use super::rewrite::{fuse, Rewrite};
use super::MS_DOMAIN;
use crate::graph::Graph;

/// Fuses every `x * Sigmoid(x)` whose Sigmoid only the product reads; returns how many it fused.
pub(crate) fn fuse_quick_gelu(g: &mut Graph) -> usize {
    let find = |g: &Graph, ix: &Index, i: usize| {
        // the fused node takes the last node's place, so it must have the one output
        match_silu(g, ix, i).filter(|r| output(&g.nodes[r.at()]).is_some())
    };
    fuse(g, &["Sigmoid"], find, |_, r| Some(r))
}

/// `x * Sigmoid(x)`, the Sigmoid read only by the product.
fn match_silu(g: &Graph, ix: &Index, sig_at: usize) -> Option<Rewrite> {
    let sig = &g.nodes[sig_at];
    let [x] = sig.inputs.as_slice() else {
        return None;
    };
    let s = output(sig)?;
    let (mul_at, mul) = sole_reader(g, ix, s)?;
    if !is_op(mul, "Mul") || other(mul, s)? != x || !is_float(g, x) {
        return None;
    }
    let attrs = vec![float_attr("alpha", 1.0)];
    let rewrite = Rewrite::replace(mul_at, "QuickGelu", MS_DOMAIN, vec![x.clone()], attrs);
    Some(rewrite.removing([sig_at]))
}

#[cfg(test)]
mod tests {
    use crate::dtype;
    use crate::graph::{Graph, Node};
    use crate::passes::{optimize, Level};
    use crate::testing::{fixed, GraphExt};

    #[test]
    fn silu_becomes_quick_gelu_at_the_onnxruntime_level_only() {
        for (level, fused) in [(Level::Default, 0), (Level::OnnxRuntime, 1)] {
            let mut g = Graph::new("g");
            let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 3]));
            let s = g.op("Sigmoid", &[&x]);
            let y = g.op("Mul", &[&s, &x]);
            g.outputs.push(y);
            assert_eq!(optimize(&mut g, level, 24)["silu_fused"], fused);
            let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
            let want: &[&str] = if fused == 1 {
                &["QuickGelu"]
            } else {
                &["Sigmoid", "Mul"]
            };
            assert_eq!(ops, want);
        }
    }

    #[test]
    fn anchors_without_outputs_are_skipped() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 3]));
        for op in ["ReduceMean", "Erf", "Tanh", "Sigmoid", "RMSNormalization"] {
            g.nodes.push(Node {
                name: op.into(),
                op_type: op.into(),
                domain: String::new(),
                inputs: vec![x.clone()],
                outputs: vec![],
                attrs: vec![],
                scope: None,
            });
        }
        assert_eq!(super::fuse_quick_gelu(&mut g), 0);
        assert_eq!(crate::passes::gelu::fuse_standard(&mut g), 0);
        assert_eq!(crate::passes::gelu::fuse_contrib(&mut g), 0);
        assert_eq!(crate::passes::layer_norm::fuse_layer_norm(&mut g), 0);
        assert_eq!(g.nodes.len(), 5);
    }
}
