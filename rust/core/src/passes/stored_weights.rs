//! Linear weights read as stored: `MatMul(x, Transpose(W))` with `W` a 2-D float initializer that
//! must keep its bytes as stored (`[out, in]`, referenced in a checkpoint shard instead of written)
//! becomes a product that reads `W` untransposed:
//!
//! - standard level: `Gemm(x, W, transB = 1)` for a 2-D `x`; a higher-rank `x` is reshaped around it,
//!   `Reshape(Gemm(Reshape(x, [-1, in]), W, transB = 1), x.shape[:-1] + [out])`;
//! - onnxruntime level: `com.microsoft.FusedMatMul(x, W, transB = 1)` (any rank of `x`).
//!
//! Without this the weight-transpose fold stores `W` transposed, which the writer must then write.
//! Any float type: onnxruntime's CPU FusedMatMul is a float32 kernel, so at the onnxruntime level the
//! other float types take the standard Gemm form.

use std::collections::HashSet;

use super::matching::{fixed, int_attr, is_op, rank, shape, Index};
use super::noops::ints_attr;
use super::rewrite::{apply, i64_constant, new_node, Rewrite};
use super::MS_DOMAIN;
use crate::dtype;
use crate::graph::{Dim, Graph, ValueType};

/// A MatMul reading a kept weight through a Transpose: (MatMul index, x, W, W's dims).
struct Found {
    at: usize,
    dtype: i32,
    x: String,
    w: String,
    out_features: i64,
    in_features: i64,
}

fn find(g: &Graph, ix: &Index, i: usize, keep: &HashSet<String>) -> Option<Found> {
    let n = &g.nodes[i];
    if !is_op(n, "MatMul") || n.inputs.len() != 2 {
        return None;
    }
    let &t = ix.prod.get(&n.inputs[1])?;
    let tn = &g.nodes[t];
    if !is_op(tn, "Transpose") || tn.inputs.len() != 1 {
        return None;
    }
    if ints_attr(tn, "perm").is_some_and(|p| p != [1, 0]) {
        return None;
    }
    let w = &tn.inputs[0];
    let init = g.initializer(w)?;
    let float = [dtype::FLOAT, dtype::FLOAT16, dtype::BFLOAT16, dtype::DOUBLE];
    if !keep.contains(w) || init.dims.len() != 2 || !float.contains(&init.dtype) {
        return None;
    }
    Some(Found {
        at: i,
        dtype: init.dtype,
        x: n.inputs[0].clone(),
        w: w.clone(),
        out_features: init.dims[0],
        in_features: init.dims[1],
    })
}

/// Rewrites every `MatMul(x, Transpose(W))` whose `W` is in `keep` (see the module doc); `contrib`
/// picks onnxruntime's FusedMatMul. The Transposes left unread go with the clean-up. Returns the count.
pub(crate) fn read_as_stored(g: &mut Graph, keep: &HashSet<String>, contrib: bool) -> usize {
    if keep.is_empty() {
        return 0;
    }
    let ix = Index::new(g);
    let found: Vec<Found> = (0..g.nodes.len())
        .filter_map(|i| find(g, &ix, i, keep))
        .collect();
    let rewrites: Vec<Rewrite> = found
        .into_iter()
        .filter_map(|f| {
            if contrib && f.dtype == dtype::FLOAT {
                Some(fused(f))
            } else {
                gemm(g, f)
            }
        })
        .collect();
    apply(g, rewrites)
}

fn fused(f: Found) -> Rewrite {
    Rewrite::replace(
        f.at,
        "FusedMatMul",
        MS_DOMAIN,
        vec![f.x, f.w],
        vec![int_attr("transB", 1)],
    )
}

fn gemm(g: &mut Graph, f: Found) -> Option<Rewrite> {
    let x_rank = rank(g, &f.x)?;
    let gemm_attrs = vec![int_attr("transB", 1)];
    if x_rank == 2 {
        return Some(Rewrite::replace(
            f.at,
            "Gemm",
            "",
            vec![f.x, f.w],
            gemm_attrs,
        ));
    }
    if x_rank < 2 {
        return None;
    }
    let x_shape = shape(g, &f.x)?;
    let lead = &x_shape[..x_rank - 1];
    let flat_shape = i64_constant(g, "flat_shape", vec![2], &[-1, f.in_features])?;
    let x2 = g.new_value(
        "flat",
        ValueType {
            dtype: Some(f.dtype),
            shape: Some(vec![Dim::Unknown, Dim::Fixed(f.in_features)]),
            sequence: false,
        },
    );
    let y2 = g.new_value(
        "gemm",
        ValueType {
            dtype: Some(f.dtype),
            shape: Some(vec![Dim::Unknown, Dim::Fixed(f.out_features)]),
            sequence: false,
        },
    );
    let mut before = vec![
        new_node(g, "Reshape", "", vec![f.x.clone(), flat_shape], &x2, vec![]),
        new_node(g, "Gemm", "", vec![x2, f.w], &y2, gemm_attrs),
    ];
    // the output's shape: constant when at most one leading dim is unknown, else read from x
    let unknown = lead.iter().filter(|d| fixed(d).is_none()).count();
    let out_shape = if unknown <= 1 {
        let dims: Vec<i64> = lead
            .iter()
            .map(|d| fixed(d).unwrap_or(-1))
            .chain([f.out_features])
            .collect();
        i64_constant(g, "out_shape", vec![dims.len() as i64], &dims)?
    } else {
        let int_vec = |g: &mut Graph, hint: &str, n: usize| {
            g.new_value(
                hint,
                ValueType {
                    dtype: Some(dtype::INT64),
                    shape: Some(vec![Dim::Fixed(n as i64)]),
                    sequence: false,
                },
            )
        };
        let full = int_vec(g, "x_shape", x_rank);
        let leading = int_vec(g, "lead_shape", x_rank - 1);
        let target = int_vec(g, "out_shape", x_rank);
        let zero = i64_constant(g, "zero", vec![1], &[0])?;
        let minus_one = i64_constant(g, "minus_one", vec![1], &[-1])?;
        let out_dim = i64_constant(g, "out_features", vec![1], &[f.out_features])?;
        before.push(new_node(g, "Shape", "", vec![f.x], &full, vec![]));
        before.push(new_node(
            g,
            "Slice",
            "",
            vec![full, zero.clone(), minus_one, zero],
            &leading,
            vec![],
        ));
        before.push(new_node(
            g,
            "Concat",
            "",
            vec![leading, out_dim],
            &target,
            vec![int_attr("axis", 0)],
        ));
        target
    };
    Some(
        Rewrite::replace(f.at, "Reshape", "", vec![y2.clone(), out_shape], vec![])
            .inserting_before(before),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed as fixed_shape, GraphExt};

    fn linear(x_dims: Option<Vec<Dim>>) -> (Graph, String) {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, x_dims);
        let w = g.f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let t = g.op("Transpose", &[&w]);
        let y = g.op("MatMul", &[&x, &t]);
        g.outputs.push(y);
        (g, w)
    }

    fn ops(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op_type.as_str()).collect()
    }

    #[test]
    fn only_kept_weights_are_rewritten() {
        let (mut g, _) = linear(fixed_shape(&[4, 2]));
        assert_eq!(read_as_stored(&mut g, &HashSet::new(), false), 0);
        assert_eq!(
            read_as_stored(&mut g, &HashSet::from(["other".to_owned()]), false),
            0
        );
        assert_eq!(ops(&g), ["Transpose", "MatMul"]);
    }

    #[test]
    fn two_d_inputs_become_gemm_and_any_rank_fused_matmul() {
        let (mut g, w) = linear(fixed_shape(&[4, 2]));
        let keep = HashSet::from([w.clone()]);
        assert_eq!(read_as_stored(&mut g, &keep, false), 1);
        assert_eq!(ops(&g), ["Transpose", "Gemm"]);
        assert_eq!(g.nodes[1].inputs, ["x".to_owned(), w.clone()]);

        let (mut g, w) = linear(fixed_shape(&[5, 4, 2]));
        assert_eq!(read_as_stored(&mut g, &HashSet::from([w.clone()]), true), 1);
        assert_eq!(g.nodes[1].op_type, "FusedMatMul");
        assert_eq!(g.nodes[1].domain, MS_DOMAIN);
    }

    #[test]
    fn other_float_types_take_gemm_at_both_levels() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT16, fixed_shape(&[4, 2]));
        let w = g
            .add_constant("w", dtype::FLOAT16, vec![3, 2], vec![0; 12])
            .expect("constant");
        let t = g.op("Transpose", &[&w]);
        let y = g.op("MatMul", &[&x, &t]);
        g.outputs.push(y);
        assert_eq!(read_as_stored(&mut g, &HashSet::from([w]), true), 1);
        assert_eq!(ops(&g), ["Transpose", "Gemm"]);
    }

    #[test]
    fn higher_ranks_are_reshaped_around_gemm() {
        let (mut g, w) = linear(fixed_shape(&[5, 4, 2]));
        let out = g.outputs[0].clone();
        assert_eq!(
            read_as_stored(&mut g, &HashSet::from([w.clone()]), false),
            1
        );
        assert_eq!(ops(&g), ["Transpose", "Reshape", "Gemm", "Reshape"]);
        assert_eq!(g.nodes[3].outputs, [out]);
        let dims = Some(vec![
            Dim::Sym("b".into()),
            Dim::Sym("s".into()),
            Dim::Fixed(2),
        ]);
        let (mut g, w) = linear(dims);
        assert_eq!(read_as_stored(&mut g, &HashSet::from([w]), false), 1);
        assert_eq!(
            ops(&g),
            [
                "Transpose",
                "Reshape",
                "Gemm",
                "Shape",
                "Slice",
                "Concat",
                "Reshape"
            ]
        );
    }
}
