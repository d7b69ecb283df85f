//! At the onnxruntime level: `com.microsoft.MatMulNBits` products of one input (a layer's query, key
//! and value projections; an MLP's gate and up) become one product whose weight is theirs stacked
//! along N, then a `Split` back to their outputs:
//!
//! ```text
//! q = MatMulNBits(x, Bq, Sq)   k = MatMulNBits(x, Bk, Sk)   v = MatMulNBits(x, Bv, Sv)
//! ```
//!
//! becomes `q, k, v = Split(MatMulNBits(x, [Bq; Bk; Bv], [Sq; Sk; Sv]), [Nq, Nk, Nv], axis = -1)`.
//!
//! Why: at accuracy level 4 each product quantizes its input to int8 again, and each is a kernel
//! call; the onnxruntime-genai builder's packages read one packed query-key-value product a layer
//! (measured: 57 against 41 MatMulNBits calls a step at 8 layers were most of the products' 0.7 ms
//! difference). Stacking is exact: MatMulNBits' blocks run along K within one row of N, so the
//! stacked weight's codes, scales and zero points are the parts' one after another; the writer
//! computes them from the parts' own float sources ([`FloatBytes::Stacked`]), nothing is copied.
//!
//! Products pack when they read the same input with the same K, bits, block size, accuracy level,
//! symmetry and scale type, and their quantized tensors are read by them alone (no bias or group
//! index inputs). The packed product takes the first one's place (its input is computed before it).
//!
//! [`FloatBytes::Stacked`]: crate::tensor::quantize::FloatBytes::Stacked

use std::collections::HashMap;
use std::sync::Arc;

use super::matching::{int_attr, int_of, Index};
use super::rewrite::{apply, i64_constant, new_node, Rewrite};
use super::MS_DOMAIN;
use crate::graph::{Dim, Graph, ValueType};
use crate::tensor::quantize::{BlockQuant, FloatMatrix, Form, Part, Quantized};
use crate::tensor::{Tensor, TensorData};

/// What products must share to pack: K, bits, block size, accuracy level, zero points or not, and
/// the quantization and scale type of their tensors.
#[derive(PartialEq)]
struct Key {
    input: String,
    attrs: [Option<i64>; 4],
    zero_points: bool,
    quant: BlockQuant,
    scale_dtype: i32,
    source_dtype: i32,
}

struct Product {
    at: usize,
    key: Key,
    n: i64,
    /// codes, scales and zero points
    parts: Vec<Arc<Quantized>>,
}

/// The quantized tensor `name`, read by one node only, of the `part` wanted.
fn quantized(g: &Graph, ix: &Index, name: &str, part: Part) -> Option<Arc<Quantized>> {
    if ix.reads.get(name) != Some(&1) {
        return None;
    }
    match &g.initializer(name)?.data {
        TensorData::Quantized(q) if q.part == part && q.form == Form::MatMulNBits => {
            Some(Arc::clone(q))
        }
        _ => None,
    }
}

fn product(g: &Graph, ix: &Index, at: usize) -> Option<Product> {
    let n = &g.nodes[at];
    if n.op_type != "MatMulNBits" || n.domain != MS_DOMAIN || n.outputs.len() != 1 {
        return None;
    }
    if !(3..=4).contains(&n.inputs.len()) || n.inputs.iter().any(String::is_empty) {
        return None;
    }
    let names = [Part::Codes, Part::Scales, Part::ZeroPoints];
    let parts: Vec<Arc<Quantized>> = n.inputs[1..]
        .iter()
        .zip(names)
        .map(|(name, part)| quantized(g, ix, name, part))
        .collect::<Option<_>>()?;
    let first = parts.first()?;
    let same = parts.iter().all(|p| {
        p.quant == first.quant
            && p.scale_dtype == first.scale_dtype
            && p.source.n == first.source.n
            && p.source.k == first.source.k
    });
    let width = int_of(n, "N")?;
    if !same || usize::try_from(width).ok()? != first.source.n {
        return None;
    }
    let attrs = ["K", "bits", "block_size", "accuracy_level"].map(|a| int_of(n, a));
    Some(Product {
        at,
        key: Key {
            input: n.inputs[0].clone(),
            attrs,
            zero_points: parts.len() == 3,
            quant: first.quant,
            scale_dtype: first.scale_dtype,
            source_dtype: first.source.dtype,
        },
        n: width,
        parts,
    })
}

/// The tensor of `part` of `group` stacked, added to the graph; its name.
fn stacked(g: &mut Graph, group: &[Product], slot: usize) -> Option<String> {
    let first = group.first()?.parts.get(slot)?;
    let sources = group.iter().map(|p| p.parts[slot].source.clone()).collect();
    let q = Quantized {
        source: FloatMatrix::stacked(sources)?,
        quant: first.quant,
        form: Form::MatMulNBits,
        part: first.part,
        scale_dtype: first.scale_dtype,
    };
    let hint = g.nodes[group.first()?.at].inputs[slot + 1].clone();
    let name = g.names.unique_value(&format!("{hint}_packed"));
    g.insert_initializer(Tensor {
        name: name.clone(),
        dtype: q.dtype(),
        dims: q.dims(),
        data: TensorData::Quantized(Arc::new(q)),
    });
    Some(name)
}

fn pack(g: &mut Graph, group: &[Product]) -> Option<Rewrite> {
    let first = group.first()?;
    let node = g.nodes[first.at].clone();
    let out_type = g.value_type(&node.outputs[0])?.clone();
    let mut dims = out_type.shape.clone()?;
    let total: i64 = group.iter().map(|p| p.n).sum();
    *dims.last_mut()? = Dim::Fixed(total);
    let packed = g.new_value(
        &format!("{}_packed", node.outputs[0]),
        ValueType {
            dtype: out_type.dtype,
            shape: Some(dims),
            sequence: false,
        },
    );
    let mut inputs = vec![first.key.input.clone()];
    for slot in 0..first.parts.len() {
        inputs.push(stacked(g, group, slot)?);
    }
    let mut attrs: Vec<_> = node
        .attrs
        .iter()
        .filter(|a| a.name != "N")
        .cloned()
        .collect();
    attrs.push(int_attr("N", total));
    let widths: Vec<i64> = group.iter().map(|p| p.n).collect();
    let sizes = i64_constant(g, "split", vec![widths.len() as i64], &widths)?;
    let mut split = new_node(g, "Split", "", vec![packed.clone(), sizes], "", vec![]);
    split.outputs = group
        .iter()
        .map(|p| g.nodes[p.at].outputs[0].clone())
        .collect();
    split.attrs = vec![int_attr("axis", -1)];
    let rest = group[1..].iter().map(|p| p.at);
    Some(
        Rewrite::replace(first.at, "MatMulNBits", MS_DOMAIN, inputs, attrs)
            .writing(vec![packed])
            .removing(rest)
            .inserting_after(vec![split]),
    )
}

/// Packs the MatMulNBits products of one input; returns how many packed products it made.
pub(crate) fn pack_products(g: &mut Graph) -> usize {
    let any = g
        .nodes
        .iter()
        .filter(|n| n.op_type == "MatMulNBits")
        .nth(1)
        .is_some();
    if !any {
        return 0;
    }
    let ix = Index::new(g);
    let mut groups: Vec<Vec<Product>> = Vec::new();
    let mut by_input: HashMap<String, Vec<usize>> = HashMap::new();
    for at in 0..g.nodes.len() {
        let Some(p) = product(g, &ix, at) else {
            continue;
        };
        let slots = by_input.entry(p.key.input.clone()).or_default();
        if let Some(&s) = slots.iter().find(|&&s| groups[s][0].key == p.key) {
            groups[s].push(p);
        } else {
            slots.push(groups.len());
            groups.push(vec![p]);
        }
    }
    let rewrites: Vec<Rewrite> = groups
        .iter()
        .filter(|group| group.len() > 1)
        .filter_map(|group| pack(g, group))
        .collect();
    apply(g, rewrites)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::model::Model;
    use crate::passes::{quantize_weights, QuantizeSettings};
    use crate::testing::GraphExt;

    fn bytes(g: &Graph, name: &str) -> Vec<u8> {
        let t = g.initializer(name).expect("initializer");
        let mut out = Vec::new();
        for p in t.data.pieces().expect("pieces") {
            let mut buf = vec![0u8; p.len()];
            t.data.fill(p, &mut buf).expect("fill");
            out.extend(buf);
        }
        out
    }

    /// Linears of `widths` outputs reading x (2 x 40), plus one reading another input; quantized.
    fn model(widths: &[i64], symmetric: bool, levels: &[Option<i64>]) -> Model {
        let mut m = Model::new(21, 10, "test");
        let k = 40;
        let mut chosen = Vec::new();
        {
            let g = &mut m.graph;
            let x = g.add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2), Dim::Fixed(k)]));
            let z = g.add_input("z", dtype::FLOAT, Some(vec![Dim::Fixed(2), Dim::Fixed(k)]));
            for (i, &n) in widths.iter().chain([&3]).enumerate() {
                let values: Vec<f32> = (0..n * k)
                    .map(|v| ((v * 5 + i as i64) % 9) as f32)
                    .collect();
                let w = g.f32s(&[n, k], &values);
                let t = g.op("Transpose", &[&w]);
                let input = if i < widths.len() { &x } else { &z };
                let y = g.op("MatMul", &[input, &t]);
                g.typed(&y, dtype::FLOAT, &[2, n]);
                g.outputs.push(y);
                chosen.push((w, None));
            }
        }
        let mut levels = levels.iter().copied().cycle();
        for (w, shard) in chosen {
            let settings = QuantizeSettings {
                quant: BlockQuant::new(4, 16, symmetric).expect("settings"),
                form: Form::MatMulNBits,
                accuracy_level: levels.next().flatten(),
                gather_codes: true,
            };
            quantize_weights(&mut m, vec![(w, shard)], &settings).expect("quantize");
        }
        m
    }

    fn ops(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op_type.as_str()).collect()
    }

    #[test]
    fn products_of_one_input_pack_into_one_and_split() {
        for symmetric in [true, false] {
            let mut m = model(&[4, 2, 3], symmetric, &[Some(4)]);
            let g = &mut m.graph;
            let before: Vec<Vec<Vec<u8>>> = g.nodes[..3]
                .iter()
                .map(|n| n.inputs[1..].iter().map(|i| bytes(g, i)).collect())
                .collect();
            let outputs: Vec<String> = g.nodes[..3].iter().map(|n| n.outputs[0].clone()).collect();
            assert_eq!(pack_products(g), 1);
            assert_eq!(ops(g), ["MatMulNBits", "Split", "MatMulNBits"]);
            let packed = &g.nodes[0];
            assert_eq!(packed.inputs[0], "x");
            assert_eq!(int_of(packed, "N"), Some(9));
            assert_eq!(int_of(packed, "K"), Some(40));
            assert_eq!(int_of(packed, "accuracy_level"), Some(4));
            assert_eq!(packed.inputs.len(), if symmetric { 3 } else { 4 });
            // codes, scales and zero points: the three products' one after another
            for slot in 1..packed.inputs.len() {
                let parts: Vec<u8> = before.iter().flat_map(|b| b[slot - 1].clone()).collect();
                assert_eq!(bytes(g, &packed.inputs[slot]), parts, "slot {slot}");
            }
            let split = &g.nodes[1];
            assert_eq!(split.inputs[0], packed.outputs[0]);
            assert_eq!(split.outputs, outputs);
            let sizes = g.initializer(&split.inputs[1]).expect("sizes");
            assert_eq!(
                crate::tensor::le_i64s(sizes.data.as_slice().expect("bytes")),
                [4, 2, 3]
            );
        }
    }

    #[test]
    fn products_of_other_settings_stay_apart() {
        // accuracy levels 4, None, 4: the two of level 4 pack, the other stays
        let mut m = model(&[4, 2, 3], true, &[Some(4), None]);
        assert_eq!(pack_products(&mut m.graph), 1);
        assert_eq!(
            ops(&m.graph),
            ["MatMulNBits", "Split", "MatMulNBits", "MatMulNBits"]
        );
        assert_eq!(int_of(&m.graph.nodes[0], "N"), Some(7));
        // a single product of an input packs with nothing
        let mut m = model(&[4], true, &[Some(4)]);
        assert_eq!(pack_products(&mut m.graph), 0);
    }
}
