//! At the onnxruntime level: a residual sum normalized by RMS,
//!
//! ```text
//! h = Add(a, b)          y = SimplifiedLayerNormalization(h, w)          (a, b: float32, same 3-D shape)
//! ```
//!
//! becomes `y, _, _, h = com.microsoft.SkipSimplifiedLayerNormalization(a, b, w)`: one kernel adds and
//! normalizes, and still gives the sum to whatever else reads it (the next residual Add). A decoder
//! layer has two; the onnxruntime-genai builder's packages are written so, and onnxruntime's session
//! optimizer does not fuse this form itself (measured: an Add and a SimplifiedLayerNormalization per
//! norm left in the profile of a decode step).
//!
//! Both operands must be computed values of the same shape (the kernel's `skip` broadcasts only from
//! a 2-D one, and a constant operand is a bias, not a skip); the fused node takes the Add's place, so
//! the weight must exist there (an initializer).

use super::matching::{float_attr, is_float, is_op, shape, Index};
use super::rewrite::{fuse, Rewrite};
use super::MS_DOMAIN;
use crate::graph::{AttrValue, Graph};

struct Skip {
    add: usize,
    norm: usize,
    /// the norm's output and the sum's
    y: String,
    h: String,
    a: String,
    b: String,
    weight: String,
    eps: f32,
}

/// Residual sums normalized by RMS → `SkipSimplifiedLayerNormalization`; returns how many it fused.
pub(crate) fn fuse_skip_norms(g: &mut Graph) -> usize {
    fuse(g, &["SimplifiedLayerNormalization"], find, |_, s| {
        Some(emit(s))
    })
}

fn find(g: &Graph, ix: &Index, norm_at: usize) -> Option<Skip> {
    let norm = &g.nodes[norm_at];
    let [h, weight] = norm.inputs.as_slice() else {
        return None;
    };
    if norm.outputs.len() != 1 || !matches!(norm.attr("axis"), None | Some(AttrValue::Int(-1))) {
        return None;
    }
    let eps = match norm.attr("epsilon") {
        Some(AttrValue::Float(e)) => *e,
        None => 1e-5,
        Some(_) => return None,
    };
    let add_at = *ix.prod.get(h)?;
    let add = &g.nodes[add_at];
    let [a, b] = add.inputs.as_slice() else {
        return None;
    };
    let computed = |v: &str| !g.is_initializer(v) && is_float(g, v);
    let (sa, sb) = (shape(g, a)?, shape(g, b)?);
    let w = g.initializer(weight)?;
    let ok = is_op(add, "Add")
        && computed(a)
        && computed(b)
        && is_float(g, h)
        && sa.len() == 3
        && sa == sb
        && w.dims.len() == 1;
    ok.then(|| Skip {
        add: add_at,
        norm: norm_at,
        y: norm.outputs[0].clone(),
        h: h.clone(),
        a: a.clone(),
        b: b.clone(),
        weight: weight.clone(),
        eps,
    })
}

fn emit(s: Skip) -> Rewrite {
    Rewrite::replace(
        s.add,
        "SkipSimplifiedLayerNormalization",
        MS_DOMAIN,
        vec![s.a, s.b, s.weight],
        vec![float_attr("epsilon", s.eps)],
    )
    .writing(vec![s.y, String::new(), String::new(), s.h])
    .removing([s.norm])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::graph::Dim;
    use crate::testing::{float, GraphExt};

    fn graph(constant_operand: bool) -> (Graph, [String; 3]) {
        let mut g = Graph::new("g");
        let dims = || Some(vec![Dim::Sym("b".into()), Dim::Fixed(3), Dim::Fixed(8)]);
        let a = g.add_input("a", dtype::FLOAT, dims());
        let b = if constant_operand {
            g.f32s(&[1, 3, 8], &[0.5; 24])
        } else {
            g.add_input("b", dtype::FLOAT, dims())
        };
        let w = g.f32s(&[8], &[1.5; 8]);
        let h = g.op("Add", &[&a, &b]);
        g.typed(&h, dtype::FLOAT, &[1, 3, 8]);
        let y = g.op_with(
            "SimplifiedLayerNormalization",
            &[&h, &w],
            vec![float("epsilon", 1e-6)],
        );
        let z = g.op("Add", &[&h, &y]);
        g.outputs.push(z.clone());
        (g, [h, y, z])
    }

    #[test]
    fn residual_sums_normalized_become_one_skip_norm() {
        let (mut g, [h, y, _]) = graph(false);
        assert_eq!(fuse_skip_norms(&mut g), 1);
        let n = &g.nodes[0];
        assert_eq!(
            (n.op_type.as_str(), n.domain.as_str()),
            ("SkipSimplifiedLayerNormalization", MS_DOMAIN)
        );
        assert_eq!(n.inputs[..2], ["a".to_owned(), "b".to_owned()]);
        assert_eq!(n.outputs, [y, String::new(), String::new(), h]);
        assert!(matches!(n.attr("epsilon"), Some(AttrValue::Float(e)) if *e == 1e-6));
        assert_eq!(g.nodes.len(), 2);
    }

    #[test]
    fn a_constant_operand_is_a_bias_not_a_skip() {
        let (mut g, _) = graph(true);
        assert_eq!(fuse_skip_norms(&mut g), 0);
    }
}
