//! The routed experts of `com.microsoft.MoE` read quantized: `com.microsoft.QMoE` (quantize= at the
//! "onnxruntime" level).
//!
//! fastonnx writes a mixture-of-experts block's SwiGLU experts as one `MoE` node (Python's
//! `converters/third_party.py`): fc1 is the stored `gate_up` weight `W1` `[E, 2I, H]` (gate rows then
//! up rows) interleaved in the graph, `Reshape(Transpose(Reshape(W1, [E, 2, I, H]), [0, 2, 1, 3]),
//! [E, 2I, H])` (onnxruntime's CPU kernels take interleaved rows only), and fc2 the stored `down`
//! weight `W2` `[E, H, I]`.
//!
//! Quantized per block along K, each expert's matrix is MatMulNBits' `[N, K]` layout, and the
//! experts' rows follow one another: `W1` quantized as the `[E * 2I, H]` matrix has exactly QMoE's
//! bytes for `[E, 2I, H * bits / 8]` codes and `[E, 2I, H / block]` scales, before the interleave. The
//! interleave is a permutation of rows, so the same Reshape-Transpose-Reshape moves the codes and the
//! scales (onnxruntime folds it when it loads the model). Only the symmetric codes' implied zero point
//! (8 for int4, 128 for int8) is shared by both kernels; a zero point per block is passed too.

use std::sync::Arc;

use super::matching::int_attr;
use super::noops::ints_attr;
use super::rewrite::i64_constant;
use super::MS_DOMAIN;
use crate::dtype;
use crate::error::{graph_err, Result};
use crate::graph::{AttrValue, Attribute, Graph, Node};
use crate::tensor::quantize::{BlockQuant, FloatBytes, FloatMatrix, Form, Part, Quantized};
use crate::tensor::{Tensor, TensorData};

/// A `MoE` node whose experts can be read quantized.
pub(super) struct MoeExperts {
    /// the node's index
    pub at: usize,
    /// `W1` `[E, 2I, H]` and `W2` `[E, H, I]`
    pub fc1: String,
    pub fc2: String,
    pub count: usize,
    pub hidden: usize,
    pub inter: usize,
    /// the outputs of fc1's float interleave (gone once the QMoE reads the quantized one)
    pub chain: Vec<String>,
}

/// The single producer of `value`, if a node of `g` makes it.
fn producer<'a>(g: &'a Graph, value: &str) -> Option<&'a Node> {
    g.nodes
        .iter()
        .find(|n| n.outputs.iter().any(|o| o == value))
}

/// The stored weight the interleave chain reads (see the module doc), if `value` is its result, and
/// the chain's outputs.
fn interleaved_from(g: &Graph, value: &str) -> Option<(String, Vec<String>)> {
    let outer = producer(g, value).filter(|n| n.op_type == "Reshape" && n.domain.is_empty())?;
    let t = producer(g, outer.inputs.first()?)
        .filter(|n| n.op_type == "Transpose" && n.domain.is_empty())?;
    if ints_attr(t, "perm") != Some(&[0, 2, 1, 3][..]) {
        return None;
    }
    let inner =
        producer(g, t.inputs.first()?).filter(|n| n.op_type == "Reshape" && n.domain.is_empty())?;
    let w = inner.inputs.first()?;
    let chain = [outer, t, inner]
        .iter()
        .flat_map(|n| n.outputs.clone())
        .collect();
    g.is_initializer(w).then(|| (w.clone(), chain))
}

fn float3(g: &Graph, name: &str) -> Option<[usize; 3]> {
    let t = g.initializer(name)?;
    if t.dtype != dtype::FLOAT || t.dims.len() != 3 || t.dims.iter().any(|&d| d <= 0) {
        return None;
    }
    Some([t.dims[0] as usize, t.dims[1] as usize, t.dims[2] as usize])
}

/// The `MoE` nodes of `g` (SwiGLU, interleaved fc1 from a stored float32 weight, no biases, no fc3)
/// whose experts a QMoE can read.
pub(super) fn experts(g: &Graph) -> Vec<MoeExperts> {
    let mut found = Vec::new();
    for (at, n) in g.nodes.iter().enumerate() {
        if n.op_type != "MoE" || n.domain != MS_DOMAIN || n.inputs.len() < 5 {
            continue;
        }
        let swiglu = matches!(n.attr("activation_type"), Some(AttrValue::String(s)) if s == b"swiglu")
            && matches!(n.attr("swiglu_fusion"), Some(AttrValue::Int(1)));
        let extra = n
            .inputs
            .iter()
            .enumerate()
            .any(|(i, v)| i != 4 && i >= 3 && !v.is_empty());
        if !swiglu || extra {
            continue;
        }
        let (Some((fc1, chain)), fc2) = (interleaved_from(g, &n.inputs[2]), n.inputs[4].clone())
        else {
            continue;
        };
        let (Some([e, fused, hidden]), Some([e2, hidden2, inter])) =
            (float3(g, &fc1), float3(g, &fc2))
        else {
            continue;
        };
        if e != e2 || hidden != hidden2 || fused != 2 * inter {
            continue;
        }
        found.push(MoeExperts {
            at,
            fc1,
            fc2,
            count: e,
            hidden,
            inter,
            chain,
        });
    }
    found
}

/// One quantized tensor of a weight viewed as the matrix `[rows, k]`, with QMoE's `dims`.
fn tensor(
    g: &mut Graph,
    hint: &str,
    source: &FloatMatrix,
    quant: BlockQuant,
    part: Part,
    dims: Vec<i64>,
) -> (String, usize) {
    let qt = Quantized {
        source: source.clone(),
        quant,
        form: Form::MatMulNBits,
        part,
        scale_dtype: dtype::FLOAT,
    };
    let name = g.names.unique_value(hint);
    let len = qt.len();
    g.insert_initializer(Tensor {
        name: name.clone(),
        dtype: qt.dtype(),
        dims,
        data: TensorData::Quantized(Arc::new(qt)),
    });
    (name, len)
}

/// A weight's quantized tensors, `[E, rows, ...]`: codes, scales, and zero points where asymmetric.
fn quantized(
    g: &mut Graph,
    w: &str,
    bytes: (FloatBytes, i32),
    shape: [usize; 3],
    quant: BlockQuant,
) -> (Vec<Option<String>>, usize) {
    let [e, rows, k] = shape;
    let source = FloatMatrix {
        bytes: bytes.0,
        dtype: bytes.1,
        n: e * rows,
        k,
        k_major: false,
    };
    let d = |v: usize| v as i64;
    let bits = quant.bits as usize;
    let blocks = k / quant.block;
    let (codes, a) = tensor(
        g,
        &format!("{w}_q{bits}"),
        &source,
        quant,
        Part::Codes,
        vec![d(e), d(rows), d(k * bits / 8)],
    );
    let (scales, b) = tensor(
        g,
        &format!("{w}_scales"),
        &source,
        quant,
        Part::Scales,
        vec![d(e), d(rows), d(blocks)],
    );
    let mut total = a + b;
    let zero_points = (!quant.symmetric).then(|| {
        let row = (blocks * bits).div_ceil(8);
        let (z, c) = tensor(
            g,
            &format!("{w}_zero_points"),
            &source,
            quant,
            Part::ZeroPoints,
            vec![d(e), d(rows), d(row)],
        );
        total += c;
        z
    });
    (vec![Some(codes), Some(scales), zero_points], total)
}

/// `x` `[E, 2I, last]` (gate rows then up rows) with its rows interleaved, as the MoE's fc1 is.
fn interleave(
    g: &mut Graph,
    x: &str,
    e: usize,
    inter: usize,
    last: usize,
    nodes: &mut Vec<Node>,
) -> Result<String> {
    let d = |v: usize| v as i64;
    let split = i64_constant(g, "experts_halves", vec![4], &[d(e), 2, d(inter), d(last)])
        .ok_or_else(|| graph_err("no constant for the experts' interleave"))?;
    let joined = i64_constant(g, "experts_rows", vec![3], &[d(e), d(2 * inter), d(last)])
        .ok_or_else(|| graph_err("no constant for the experts' interleave"))?;
    let mut step = |g: &mut Graph, op: &str, inputs: Vec<String>, attrs: Vec<Attribute>| {
        let out = g.names.unique_value(&format!("{x}_{}", op.to_lowercase()));
        nodes.push(Node {
            name: g.names.unique_node(op),
            op_type: op.into(),
            domain: String::new(),
            inputs,
            outputs: vec![out.clone()],
            attrs,
            scope: None,
        });
        out
    };
    let halves = step(g, "Reshape", vec![x.to_owned(), split], vec![]);
    let perm = Attribute {
        name: "perm".into(),
        value: AttrValue::Ints(vec![0, 2, 1, 3]),
    };
    let paired = step(g, "Transpose", vec![halves], vec![perm]);
    Ok(step(g, "Reshape", vec![paired, joined], vec![]))
}

/// The nodes replacing the `MoE` node `node` of `found`: the interleave of fc1's quantized tensors and
/// one `QMoE` with the MoE's own attributes. Returns them and the bytes of fc1's and fc2's quantized
/// tensors.
pub(super) fn quantized_experts(
    g: &mut Graph,
    found: &MoeExperts,
    node: &Node,
    fc1: (FloatBytes, i32),
    fc2: (FloatBytes, i32),
    quant: BlockQuant,
    accuracy_level: Option<i64>,
) -> Result<(Vec<Node>, (usize, usize))> {
    let (e, h, i) = (found.count, found.hidden, found.inter);
    if h % quant.block != 0 || i % quant.block != 0 {
        return Err(graph_err(format!(
            "QMoE {:?}: its hidden size {h} and intermediate size {i} must be multiples of the block \
             size {}",
            node.name, quant.block
        )));
    }
    let (first, a) = quantized(g, &found.fc1, fc1, [e, 2 * i, h], quant);
    let (second, b) = quantized(g, &found.fc2, fc2, [e, h, i], quant);
    let mut nodes = Vec::new();
    let bits = quant.bits as usize;
    let mut fc1_parts = Vec::new();
    for (part, last) in first.iter().zip([
        h * bits / 8,
        h / quant.block,
        (h / quant.block * bits).div_ceil(8),
    ]) {
        fc1_parts.push(match part {
            Some(t) => Some(interleave(g, t, e, i, last, &mut nodes)?),
            None => None,
        });
    }
    let name = |v: &Option<String>| v.clone().unwrap_or_default();
    // QMoE: input, router_probs, fc1 weights, scales, bias, fc2 weights, scales, bias, fc3 weights,
    // scales, bias, fc1 zero points, fc2 zero points
    let mut inputs = vec![
        node.inputs[0].clone(),
        node.inputs[1].clone(),
        name(&fc1_parts[0]),
        name(&fc1_parts[1]),
        String::new(),
        name(&second[0]),
        name(&second[1]),
    ];
    if !quant.symmetric {
        inputs.extend([String::new(), String::new(), String::new(), String::new()]);
        inputs.extend([name(&fc1_parts[2]), name(&second[2])]);
    }
    let mut attrs: Vec<Attribute> = node.attrs.clone();
    attrs.push(int_attr("expert_weight_bits", i64::from(quant.bits)));
    attrs.push(int_attr("block_size", quant.block as i64));
    if let Some(level) = accuracy_level {
        attrs.push(int_attr("accuracy_level", level));
    }
    nodes.push(Node {
        name: node.name.clone(),
        op_type: "QMoE".into(),
        domain: MS_DOMAIN.into(),
        inputs,
        outputs: node.outputs.clone(),
        attrs,
        scope: node.scope,
    });
    Ok((nodes, (a, b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Dim;
    use crate::model::Model;
    use crate::passes::{quantizable_experts, quantize_weights, QuantizeSettings};
    use crate::testing::GraphExt;

    /// An MoE of 2 experts, hidden 32, intermediate 16, fc1 interleaved from its stored weight.
    fn moe() -> (Model, String, String) {
        let (e, h, i) = (2_i64, 32_i64, 16_i64);
        let mut m = Model::new(21, 10, "test");
        let g = &mut m.graph;
        let values = |n: i64| (0..n).map(|v| (v % 7) as f32 * 0.1).collect::<Vec<f32>>();
        let w1 = g.f32s(&[e, 2 * i, h], &values(e * 2 * i * h));
        let w2 = g.f32s(&[e, h, i], &values(e * h * i));
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(3), Dim::Fixed(h)]));
        let logits = g.add_input(
            "logits",
            dtype::FLOAT,
            Some(vec![Dim::Fixed(3), Dim::Fixed(e)]),
        );
        let split = g.i64s(&[4], &[e, 2, i, h]);
        let halves = g.op("Reshape", &[&w1, &split]);
        let perm = Attribute {
            name: "perm".into(),
            value: AttrValue::Ints(vec![0, 2, 1, 3]),
        };
        let paired = g.op_with("Transpose", &[&halves], vec![perm]);
        let rows = g.i64s(&[3], &[e, 2 * i, h]);
        let fc1 = g.op("Reshape", &[&paired, &rows]);
        let attrs = vec![
            int_attr("k", 1),
            Attribute {
                name: "activation_type".into(),
                value: AttrValue::String(b"swiglu".to_vec()),
            },
            int_attr("swiglu_fusion", 1),
        ];
        let inputs = vec![x, logits, fc1, String::new(), w2.clone()];
        let y = g
            .add_node("MoE", MS_DOMAIN, inputs, &["y".into()], attrs, None)
            .expect("moe")
            .remove(0);
        g.outputs.push(y);
        (m, w1, w2)
    }

    #[test]
    fn an_moes_experts_become_a_qmoe() {
        let (mut m, w1, w2) = moe();
        assert_eq!(
            quantizable_experts(&m),
            [(w1.clone(), w2.clone(), 2, 32, 16)]
        );
        let settings = QuantizeSettings {
            quant: BlockQuant::new(4, 16, true).expect("settings"),
            form: Form::MatMulNBits,
            accuracy_level: Some(4),
            gather_codes: true,
        };
        let done = quantize_weights(
            &mut m,
            vec![(w1.clone(), None), (w2.clone(), None)],
            &settings,
        )
        .expect("quantize");
        let ops: Vec<&str> = m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        // the codes' and the scales' interleave, then the QMoE; the float interleave is gone
        let chain = ["Reshape", "Transpose", "Reshape"];
        assert_eq!(ops, [&chain[..], &chain[..], &["QMoE"]].concat());
        assert!(!m.graph.is_initializer(&w1) && !m.graph.is_initializer(&w2));
        let q = m.graph.nodes.last().expect("qmoe");
        let dims = |v: &str| m.graph.initializer(v).map(|t| t.dims.clone());
        assert_eq!(dims(&q.inputs[5]), Some(vec![2, 32, 8])); // fc2 codes: 16 int4 a row
        assert_eq!(dims(&q.inputs[6]), Some(vec![2, 32, 1])); // one block of 16 a row
                                                              // fc1 codes [2, 32, 16] and scales [2, 32, 2]: 1024 + 512 bytes; fc2 512 + 256
        assert_eq!(done, [(w1, 1024 + 512, 1, 0), (w2, 512 + 256, 1, 0)]);
        assert!(q
            .attrs
            .iter()
            .any(|a| a.name == "expert_weight_bits" && matches!(a.value, AttrValue::Int(4))));
    }

    #[test]
    fn a_block_that_does_not_divide_the_sizes_is_an_error() {
        let (mut m, w1, w2) = moe();
        let settings = QuantizeSettings {
            quant: BlockQuant::new(4, 32, true).expect("settings"),
            form: Form::MatMulNBits,
            accuracy_level: None,
            gather_codes: true,
        };
        let err = quantize_weights(&mut m, vec![(w1, None), (w2, None)], &settings);
        assert!(err.is_err_and(|e| e.to_string().contains("multiples of the block size 32")));
    }
}
