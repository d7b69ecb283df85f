//! Weight-only quantization of the products' weights (`to_onnx(quantize=...)`), before the passes.
//!
//! A product reading a 2-D float initializer `W` — `MatMul(x, Transpose(W))` (a Linear: `W` is
//! `[N, K]`), `MatMul(x, W)` (`W` is `[K, N]`), `Gemm(x, W, C, transB)` with `transA = 0`,
//! `alpha = beta = 1` — reads it quantized per block along K instead (see [`crate::tensor::quantize`]):
//!
//! - [`Form::Dequantize`]: `MatMul(x, DequantizeLinear(codes, scales[, zero points], axis = 0,
//!   block_size))` (opset 21; a Gemm's `C` added after), which onnxruntime fuses into MatMulNBits;
//! - [`Form::MatMulNBits`]: `com.microsoft.MatMulNBits(x, codes, scales[, zero points])` with `K`, `N`,
//!   `bits`, `block_size` (and `accuracy_level` when given), then `Add(C)` for a Gemm's bias.
//!
//! The quantized tensors are [`TensorData::Quantized`]: nothing is computed here, the writer computes
//! them from the weight's memory or from a checkpoint shard as it streams. A Transpose and a weight
//! nothing else reads any more go.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::expert_quantization::{experts, quantized_experts};
use super::matching::{int_attr, int_of};
use super::noops::ints_attr;
use super::quantized_gathers::{gather_from_codes, HeadCodes};
use super::{MS_DOMAIN, MS_DOMAIN_VERSION};
use crate::dtype;
use crate::error::{graph_err, Result};
use crate::graph::{AttrValue, Dim, Graph, Node, ValueType};
use crate::model::Model;
use crate::tensor::quantize::{BlockQuant, FloatBytes, FloatMatrix, Form, Part, Quantized};
use crate::tensor::{Tensor, TensorData};

/// How to quantize.
#[derive(Debug, Clone, Copy)]
pub struct QuantizeSettings {
    pub quant: BlockQuant,
    pub form: Form,
    /// MatMulNBits' `accuracy_level` (None leaves the attribute out)
    pub accuracy_level: Option<i64>,
    /// In the MatMulNBits form, a table both gathered and quantized for a product (a tied embedding
    /// and its head) gathered from the product's codes by GatherBlockQuantized, the float table gone
    /// (see [`super::quantized_gathers`]); false keeps the float table for the Gathers.
    pub gather_codes: bool,
}

/// Where to read a weight's float bytes instead of its initializer: a checkpoint shard.
pub struct ShardSource {
    pub file: std::fs::File,
    pub offset: u64,
    /// the float type stored there
    pub dtype: i32,
}

/// A product reading a weight: (node index, weight, whether `W` is `[K, N]`).
struct Product {
    at: usize,
    w: String,
    k_major: bool,
}

fn float_attr_is(n: &Node, name: &str, want: f32) -> bool {
    match n.attr(name) {
        None => true,
        Some(AttrValue::Float(v)) => (*v - want).abs() == 0.0,
        Some(_) => false,
    }
}

fn products(g: &Graph) -> Vec<Product> {
    let producers: HashMap<&str, usize> = g
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let mut found = Vec::new();
    for (at, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty() || n.inputs.len() < 2 {
            continue;
        }
        let b = &n.inputs[1];
        let product = match n.op_type.as_str() {
            "MatMul" if n.inputs.len() == 2 => {
                if g.is_initializer(b) {
                    Some((b.clone(), true))
                } else {
                    producers.get(b.as_str()).and_then(|&t| {
                        let tn = &g.nodes[t];
                        let plain = tn.op_type == "Transpose"
                            && tn.domain.is_empty()
                            && tn.inputs.len() == 1
                            && ints_attr(tn, "perm").is_none_or(|p| p == [1, 0]);
                        (plain && g.is_initializer(&tn.inputs[0]))
                            .then(|| (tn.inputs[0].clone(), false))
                    })
                }
            }
            "Gemm" => {
                let plain = int_of(n, "transA").unwrap_or(0) == 0
                    && float_attr_is(n, "alpha", 1.0)
                    && float_attr_is(n, "beta", 1.0);
                let trans_b = int_of(n, "transB").unwrap_or(0) != 0;
                (plain && g.is_initializer(b)).then(|| (b.clone(), !trans_b))
            }
            _ => None,
        };
        let Some((w, k_major)) = product else {
            continue;
        };
        let Some(t) = g.initializer(&w) else { continue };
        let float = [dtype::FLOAT, dtype::FLOAT16, dtype::BFLOAT16];
        if t.dims.len() != 2 || t.dims.iter().any(|&d| d <= 0) || !float.contains(&t.dtype) {
            continue;
        }
        found.push(Product { at, w, k_major });
    }
    found
}

/// The weights a quantization could cover: (initializer, N, K, products reading it), in graph order.
pub fn quantizable_weights(model: &Model) -> Vec<(String, i64, i64, usize)> {
    let g = &model.graph;
    let mut out: Vec<(String, i64, i64, usize)> = Vec::new();
    for p in products(g) {
        if let Some(e) = out.iter_mut().find(|e| e.0 == p.w) {
            e.3 += 1;
            continue;
        }
        let Some(t) = g.initializer(&p.w) else {
            continue;
        };
        let (n, k) = if p.k_major {
            (t.dims[1], t.dims[0])
        } else {
            (t.dims[0], t.dims[1])
        };
        out.push((p.w, n, k, 1));
    }
    // the experts of MoE nodes (QMoE at the "onnxruntime" level): rows of every expert, along K
    for e in experts(g) {
        let rows = |r: usize| (e.count * r) as i64;
        out.push((e.fc1, rows(2 * e.inter), e.hidden as i64, 1));
        out.push((e.fc2, rows(e.hidden), e.inter as i64, 1));
    }
    out
}

/// The expert weights of MoE nodes a quantization could cover: (fc1, fc2, experts, hidden size,
/// intermediate size), in graph order.
pub fn quantizable_experts(model: &Model) -> Vec<(String, String, usize, usize, usize)> {
    experts(&model.graph)
        .into_iter()
        .map(|e| (e.fc1, e.fc2, e.count, e.hidden, e.inter))
        .collect()
}

/// Every name the nodes (and their subgraphs) read, and the graph's outputs.
fn reads(g: &Graph) -> HashSet<String> {
    fn walk(nodes: &[Node], out: &mut HashSet<String>) {
        for n in nodes {
            out.extend(n.inputs.iter().filter(|i| !i.is_empty()).cloned());
            for a in &n.attrs {
                if let AttrValue::Graph(sub) = &a.value {
                    walk(&sub.nodes, out);
                    out.extend(sub.outputs.iter().cloned());
                }
            }
        }
    }
    let mut out: HashSet<String> = g.outputs.iter().cloned().collect();
    walk(&g.nodes, &mut out);
    out
}

/// The quantized tensors of one weight read in one orientation.
struct Made {
    codes: String,
    scales: String,
    zero_points: Option<String>,
    /// the DequantizeLinear's output (Dequantize form), made before the first product
    dequantized: Option<(String, Node)>,
    n: usize,
    k: usize,
    dtype: i32,
}

/// Quantizes the weights `chosen` (initializer names, each with a checkpoint shard to read its bytes
/// from instead of its own memory) wherever a product reads them (see the module doc). Returns, for
/// each weight, (name, bytes its quantized tensors take, products changed, Gathers now reading its
/// codes: `QuantizeSettings::gather_codes`). A chosen weight that has no bytes (meta device) and no
/// shard, or that no product reads, is an error.
pub fn quantize_weights(
    model: &mut Model,
    chosen: Vec<(String, Option<ShardSource>)>,
    settings: &QuantizeSettings,
) -> Result<Vec<(String, usize, usize, usize)>> {
    let g = &mut model.graph;
    let mut sources: HashMap<String, Option<(FloatBytes, i32)>> = HashMap::new();
    for (name, shard) in chosen {
        let Some(t) = g.initializer(&name) else {
            return Err(graph_err(format!(
                "no initializer named {name:?} to quantize"
            )));
        };
        let source = match shard {
            Some(s) => Some((
                FloatBytes::File {
                    file: Arc::new(s.file),
                    offset: s.offset,
                },
                s.dtype,
            )),
            None => match &t.data {
                TensorData::Borrowed(b) => Some((FloatBytes::Memory(Arc::clone(b)), t.dtype)),
                TensorData::Owned(v) => Some((FloatBytes::Memory(Arc::new(v.clone())), t.dtype)),
                TensorData::Deferred { .. } => {
                    return Err(graph_err(format!(
                        "weight {name:?} has no bytes (meta device) to quantize: pass weights="
                    )))
                }
                _ => None,
            },
        };
        sources.insert(name, source);
    }
    let found: Vec<Product> = products(g)
        .into_iter()
        .filter(|p| matches!(sources.get(&p.w), Some(Some(_))))
        .collect();
    let has_bytes = |w: &str| matches!(sources.get(w), Some(Some(_)));
    let moes: Vec<_> = if settings.form == Form::MatMulNBits {
        experts(g)
            .into_iter()
            .filter(|e| has_bytes(&e.fc1) || has_bytes(&e.fc2))
            .collect()
    } else {
        Vec::new()
    };
    for e in &moes {
        if !(has_bytes(&e.fc1) && has_bytes(&e.fc2)) {
            return Err(graph_err(format!(
                "experts {:?} and {:?}: a QMoE reads both quantized or neither",
                e.fc1, e.fc2
            )));
        }
    }
    // a weight whose bytes are elsewhere (on a device) is left as it is: not in the result
    for (name, _) in sources.iter().filter(|(_, s)| s.is_some()) {
        let expert = moes.iter().any(|e| &e.fc1 == name || &e.fc2 == name);
        if !expert && !found.iter().any(|p| &p.w == name) {
            return Err(graph_err(format!(
                "weight {name:?} is not read by a product that can be quantized"
            )));
        }
    }
    let q = settings.quant;
    let mut made: HashMap<(String, bool), Made> = HashMap::new();
    let mut per_weight: Vec<(String, usize, usize, usize)> = Vec::new();
    // node index -> the nodes replacing it
    let mut replaced: HashMap<usize, Vec<Node>> = HashMap::new();
    for p in &found {
        let node = g.nodes[p.at].clone();
        let key = (p.w.clone(), p.k_major);
        let mut first_use = false;
        if !made.contains_key(&key) {
            first_use = true;
            let t = g
                .initializer(&p.w)
                .ok_or_else(|| graph_err("weight vanished"))?;
            let (wdtype, dims) = (t.dtype, t.dims.clone());
            let (n, k) = if p.k_major {
                (dims[1] as usize, dims[0] as usize)
            } else {
                (dims[0] as usize, dims[1] as usize)
            };
            let Some(Some((bytes, stored))) = sources.get(&p.w).cloned() else {
                continue;
            };
            let source = FloatMatrix {
                bytes,
                dtype: stored,
                n,
                k,
                k_major: p.k_major,
            };
            if stored != wdtype {
                let item = dtype::item_size(stored).unwrap_or(0);
                if item == 0 || source.byte_len() != n * k * item {
                    return Err(graph_err(format!("weight {:?}: bad stored type", p.w)));
                }
            }
            let form = if settings.form == Form::MatMulNBits
                && matches!(wdtype, dtype::FLOAT | dtype::FLOAT16)
            {
                Form::MatMulNBits
            } else {
                Form::Dequantize
            };
            let mut bytes_total = 0;
            let mut tensor = |g: &mut Graph, part: Part, suffix: &str| {
                let qt = Quantized {
                    source: source.clone(),
                    quant: q,
                    form,
                    part,
                    scale_dtype: wdtype,
                };
                let name = g.names.unique_value(&format!("{}_{suffix}", p.w));
                bytes_total += qt.len();
                g.insert_initializer(Tensor {
                    name: name.clone(),
                    dtype: qt.dtype(),
                    dims: qt.dims(),
                    data: TensorData::Quantized(Arc::new(qt)),
                });
                name
            };
            let codes = tensor(g, Part::Codes, if q.bits == 4 { "q4" } else { "q8" });
            let scales = tensor(g, Part::Scales, "scales");
            let zero_points = (!q.symmetric).then(|| tensor(g, Part::ZeroPoints, "zero_points"));
            let dequantized = (form == Form::Dequantize).then(|| {
                let out = g.new_value(
                    &format!("{}_dequantized", p.w),
                    ValueType {
                        dtype: Some(wdtype),
                        shape: Some(vec![Dim::Fixed(k as i64), Dim::Fixed(n as i64)]),
                        sequence: false,
                    },
                );
                let mut inputs = vec![codes.clone(), scales.clone()];
                inputs.extend(zero_points.clone());
                let dq = Node {
                    name: g.names.unique_node("DequantizeLinear"),
                    op_type: "DequantizeLinear".into(),
                    domain: String::new(),
                    inputs,
                    outputs: vec![out.clone()],
                    attrs: vec![int_attr("axis", 0), int_attr("block_size", q.block as i64)],
                    scope: node.scope,
                };
                (out, dq)
            });
            made.insert(
                key.clone(),
                Made {
                    codes,
                    scales,
                    zero_points,
                    dequantized,
                    n,
                    k,
                    dtype: wdtype,
                },
            );
            match per_weight.iter_mut().find(|e| e.0 == p.w) {
                Some(e) => e.1 += bytes_total,
                None => per_weight.push((p.w.clone(), bytes_total, 0, 0)),
            }
        }
        let Some(m) = made.get(&key) else { continue };
        if let Some(e) = per_weight.iter_mut().find(|e| e.0 == p.w) {
            e.2 += 1;
        }
        let mut nodes = Vec::new();
        let x = node.inputs[0].clone();
        let bias = (node.op_type == "Gemm")
            .then(|| node.inputs.get(2).filter(|c| !c.is_empty()).cloned())
            .flatten();
        let y = node.outputs[0].clone();
        let product_out = if bias.is_some() {
            g.new_value(
                &format!("{y}_product"),
                ValueType {
                    dtype: Some(m.dtype),
                    shape: g.value_type(&y).and_then(|t| t.shape.clone()),
                    sequence: false,
                },
            )
        } else {
            y.clone()
        };
        let mut product = if let Some((w, dq)) = &m.dequantized {
            if first_use {
                nodes.push(dq.clone());
            }
            Node {
                name: g.names.unique_node("MatMul"),
                op_type: "MatMul".into(),
                domain: String::new(),
                inputs: vec![x, w.clone()],
                outputs: vec![product_out.clone()],
                attrs: vec![],
                scope: node.scope,
            }
        } else {
            let mut inputs = vec![x, m.codes.clone(), m.scales.clone()];
            inputs.extend(m.zero_points.clone());
            let mut attrs = vec![
                int_attr("K", m.k as i64),
                int_attr("N", m.n as i64),
                int_attr("bits", i64::from(q.bits)),
                int_attr("block_size", q.block as i64),
            ];
            if let Some(level) = settings.accuracy_level {
                attrs.push(int_attr("accuracy_level", level));
            }
            Node {
                name: g.names.unique_node("MatMulNBits"),
                op_type: "MatMulNBits".into(),
                domain: MS_DOMAIN.into(),
                inputs,
                outputs: vec![product_out.clone()],
                attrs,
                scope: node.scope,
            }
        };
        if bias.is_none() {
            product.name = node.name.clone(); // the product keeps its node's name
        }
        nodes.push(product);
        if let Some(c) = bias {
            nodes.push(Node {
                name: node.name.clone(),
                op_type: "Add".into(),
                domain: String::new(),
                inputs: vec![product_out, c],
                outputs: vec![y],
                attrs: vec![],
                scope: node.scope,
            });
        }
        replaced.insert(p.at, nodes);
    }
    for e in &moes {
        let node = g.nodes[e.at].clone();
        let source = |w: &str| {
            sources
                .get(w)
                .cloned()
                .flatten()
                .ok_or_else(|| graph_err("weight vanished"))
        };
        let (fc1, fc2) = (source(&e.fc1)?, source(&e.fc2)?);
        let (nodes, (a, b)) = quantized_experts(g, e, &node, fc1, fc2, q, settings.accuracy_level)?;
        per_weight.push((e.fc1.clone(), a, 1, 0));
        per_weight.push((e.fc2.clone(), b, 1, 0));
        replaced.insert(e.at, nodes);
    }
    let old = std::mem::take(&mut g.nodes);
    for (i, n) in old.into_iter().enumerate() {
        match replaced.remove(&i) {
            Some(new) => g.nodes.extend(new),
            None => g.nodes.push(n),
        }
    }
    // the Transposes (and the experts' float interleave) and weights only the products read
    let read = reads(g);
    g.nodes
        .retain(|n| !(n.op_type == "Transpose" && n.outputs.iter().all(|o| !read.contains(o))));
    if settings.gather_codes && settings.form == Form::MatMulNBits {
        for ((w, k_major), m) in &made {
            if *k_major || m.dequantized.is_some() {
                continue; // a `[K, N]` weight's rows are not the table's; DequantizeLinear has no codes
            }
            let head = HeadCodes {
                weight: w,
                codes: &m.codes,
                scales: &m.scales,
                zero_points: m.zero_points.as_deref(),
                n: m.n,
                k: m.k,
            };
            let gathers = gather_from_codes(g, &head, q);
            if let Some(e) = per_weight.iter_mut().find(|e| &e.0 == w) {
                e.3 += gathers;
            }
        }
    }
    let chains: HashSet<&String> = moes.iter().flat_map(|e| &e.chain).collect();
    for _ in 0..3 {
        let read = reads(g);
        g.nodes.retain(|n| {
            !n.outputs
                .iter()
                .all(|o| chains.contains(o) && !read.contains(o))
        });
    }
    let read = reads(g);
    let dropped: HashSet<String> = sources
        .iter()
        .filter(|(w, s)| s.is_some() && !read.contains(*w))
        .map(|(w, _)| w.clone())
        .collect();
    g.retain_initializers(|name| !dropped.contains(name));
    if settings.form == Form::MatMulNBits
        && g.nodes.iter().any(|n| {
            n.domain == MS_DOMAIN
                && matches!(
                    n.op_type.as_str(),
                    "MatMulNBits" | "QMoE" | "GatherBlockQuantized"
                )
        })
    {
        model
            .opsets
            .entry(MS_DOMAIN.to_owned())
            .or_insert(MS_DOMAIN_VERSION);
    }
    Ok(per_weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::GraphExt;

    fn ops(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op_type.as_str()).collect()
    }

    fn settings(form: Form, symmetric: bool) -> QuantizeSettings {
        QuantizeSettings {
            quant: BlockQuant::new(4, 16, symmetric).expect("settings"),
            form,
            accuracy_level: Some(4),
            gather_codes: true,
        }
    }

    /// A Linear `MatMul(x, Transpose(W))` with W [n, k] and a Gemm reading the same W.
    fn model(n: i64, k: i64) -> (Model, String) {
        let mut m = Model::new(21, 10, "test");
        let g = &mut m.graph;
        let values: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.1).collect();
        let w = g.f32s(&[n, k], &values);
        let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2), Dim::Fixed(k)]));
        let t = g.op("Transpose", &[&w]);
        let y = g.op("MatMul", &[&x, &t]);
        g.outputs.push(y);
        (m, w)
    }

    #[test]
    fn linear_weights_become_dequantize_or_matmul_nbits() {
        let (mut m, w) = model(4, 40);
        let done = quantize_weights(
            &mut m,
            vec![(w.clone(), None)],
            &settings(Form::Dequantize, false),
        )
        .expect("quantize");
        assert_eq!(ops(&m.graph), ["DequantizeLinear", "MatMul"]);
        assert!(!m.graph.is_initializer(&w));
        // codes [40, 4] uint4 = 80 bytes, scales [3, 4] f32 = 48, zero points [3, 4] uint4 = 6
        assert_eq!(done, [(w.clone(), 80 + 48 + 6, 1, 0)]);
        let (mut m, w) = model(4, 40);
        quantize_weights(&mut m, vec![(w, None)], &settings(Form::MatMulNBits, true))
            .expect("quantize");
        assert_eq!(ops(&m.graph), ["MatMulNBits"]);
        let n = &m.graph.nodes[0];
        assert_eq!(n.inputs.len(), 3);
        assert_eq!(int_of(n, "K"), Some(40));
        assert_eq!(int_of(n, "N"), Some(4));
        assert_eq!(int_of(n, "accuracy_level"), Some(4));
        assert_eq!(m.opsets.get(MS_DOMAIN), Some(&MS_DOMAIN_VERSION));
        let b = m.graph.initializer(&n.inputs[1]).expect("codes");
        assert_eq!(b.dims, [4, 3, 8]);
        assert_eq!(b.data.len(), 96);
    }

    #[test]
    fn deferred_weights_need_a_checkpoint() {
        let mut m = Model::new(21, 10, "test");
        let g = &mut m.graph;
        let w = g
            .add_deferred_initializer("w", dtype::FLOAT, vec![4, 16])
            .expect("w");
        let x = g.add_input("x", dtype::FLOAT, None);
        let y = g.op("MatMul", &[&x, &w]);
        g.outputs.push(y);
        let err = quantize_weights(&mut m, vec![(w, None)], &settings(Form::Dequantize, true));
        assert!(err.is_err());
    }
}
