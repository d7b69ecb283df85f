//! A tied embedding read through its head's quantized codes (`quantize=` with the head quantized, in
//! the MatMulNBits form): each `Gather(table, ids)` on axis 0 becomes `com.microsoft.GatherBlockQuantized`
//! over the head's codes, scales and zero points, and the float table leaves the model — as the
//! onnxruntime-genai builder's int4 tied embeddings do.
//!
//! GatherBlockQuantized reads uint8 data `[N, K * bits / 8]` (two 4-bit values a byte, low nibble
//! first), scales `[N, ceil(K / block)]` and zero points `[N, ceil(blocks * bits / 8)]` (packed as
//! MatMulNBits packs them; absent: 2^(bits - 1), MatMulNBits' default too), quantizing along its last
//! axis. MatMulNBits' tensors are those bytes in other dims (`[N, blocks, blob]`, `[N * blocks]`): the
//! views made here share them ([`Graph::shared_bytes`]), so the file holds the codes once. Where K is
//! not a multiple of the block, MatMulNBits' codes hold padding a row: left as it is.

use super::matching::int_attr;
use super::MS_DOMAIN;
use crate::graph::{AttrValue, Graph, Node};
use crate::tensor::quantize::{BlockQuant, Form};
use crate::tensor::{Tensor, TensorData};

/// A weight read quantized by MatMulNBits: its `[N, K]` float initializer and the product's tensors.
pub(super) struct HeadCodes<'a> {
    pub weight: &'a str,
    pub codes: &'a str,
    pub scales: &'a str,
    pub zero_points: Option<&'a str>,
    pub n: usize,
    pub k: usize,
}

fn gathers_rows(n: &Node, table: &str) -> bool {
    let axis = match n.attr("axis") {
        None => 0,
        Some(AttrValue::Int(a)) => *a,
        Some(_) => return false,
    };
    n.op_type == "Gather"
        && n.domain.is_empty()
        && n.inputs.first().is_some_and(|x| x == table)
        && (axis == 0 || axis == -2)
}

/// Whether initializer `of` is a MatMulNBits tensor of `dims`' element count.
fn fits(g: &Graph, of: &str, dims: [usize; 2]) -> bool {
    g.initializer(of).is_some_and(|t| {
        let numel: i64 = t.dims.iter().product();
        matches!(&t.data, TensorData::Quantized(q) if q.form == Form::MatMulNBits)
            && numel == (dims[0] * dims[1]) as i64
    })
}

/// A 2-D view `dims` of initializer `of` (which [`fits`]), sharing its bytes.
fn view(g: &mut Graph, of: &str, dims: [usize; 2]) -> Option<String> {
    let t = g.initializer(of)?;
    let (dtype, data) = (t.dtype, t.data.clone());
    let name = g.names.unique_value(&format!("{of}_rows"));
    g.insert_initializer(Tensor {
        name: name.clone(),
        dtype,
        dims: vec![dims[0] as i64, dims[1] as i64],
        data,
    });
    g.shared_bytes.insert(name.clone(), of.to_owned());
    Some(name)
}

/// Rewrites the Gathers of `head.weight` into GatherBlockQuantized over the head's codes where every
/// other reader of the table is gone (it is then unread, for the caller to drop); returns how many.
pub(super) fn gather_from_codes(g: &mut Graph, head: &HeadCodes<'_>, q: BlockQuant) -> usize {
    let bits = q.bits as usize;
    if !head.k.is_multiple_of(q.block) || !g.gathered_only(head.weight) {
        return 0;
    }
    if !g
        .nodes
        .iter()
        .filter(|n| n.inputs.first().is_some_and(|x| x == head.weight))
        .all(|n| gathers_rows(n, head.weight))
    {
        return 0;
    }
    let (n, blocks) = (head.n, head.k / q.block);
    // a row of zero points: `blocks` bytes (8-bit) or two to a byte (4-bit)
    let zp_row = if bits == 4 {
        blocks.div_ceil(2)
    } else {
        blocks
    };
    let mut parts = vec![
        (head.codes, [n, head.k * bits / 8]),
        (head.scales, [n, blocks]),
    ];
    parts.extend(head.zero_points.map(|z| (z, [n, zp_row])));
    if !parts.iter().all(|&(of, dims)| fits(g, of, dims)) {
        return 0;
    }
    let views: Vec<String> = parts
        .into_iter()
        .filter_map(|(of, dims)| view(g, of, dims))
        .collect();
    let [codes, scales, zero_points @ ..] = views.as_slice() else {
        return 0;
    };
    let mut count = 0;
    for node in &mut g.nodes {
        if !gathers_rows(node, head.weight) {
            continue;
        }
        let ids = node.inputs[1].clone();
        let mut inputs = vec![codes.clone(), ids, scales.clone()];
        inputs.extend(zero_points.iter().cloned());
        node.op_type = "GatherBlockQuantized".into();
        node.domain = MS_DOMAIN.into();
        node.inputs = inputs;
        node.attrs = vec![
            int_attr("bits", i64::from(q.bits)),
            int_attr("block_size", q.block as i64),
            int_attr("gather_axis", 0),
            int_attr("quantize_axis", 1),
        ];
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use crate::dtype;
    use crate::graph::Dim;
    use crate::model::Model;
    use crate::passes::matching::int_of;
    use crate::passes::{quantize_weights, QuantizeSettings};
    use crate::proto::onnx;
    use crate::tensor::quantize::{BlockQuant, Form};
    use crate::testing::GraphExt;
    use crate::writer;
    use prost::Message;

    fn settings(bits: u32, symmetric: bool, gather_codes: bool) -> QuantizeSettings {
        QuantizeSettings {
            quant: BlockQuant::new(bits, 16, symmetric).expect("settings"),
            form: Form::MatMulNBits,
            accuracy_level: None,
            gather_codes,
        }
    }

    /// A tied table `[n, k]`: `Gather(table, ids)` into the layers, `MatMul(h, Transpose(table))` the
    /// head.
    fn tied(n: i64, k: i64) -> (Model, String) {
        let mut m = Model::new(21, 10, "test");
        let g = &mut m.graph;
        let values: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let w = g.f32s(&[n, k], &values);
        let ids = g.add_input("ids", dtype::INT64, Some(vec![Dim::Fixed(3)]));
        let rows = g.op("Gather", &[&w, &ids]);
        let t = g.op("Transpose", &[&w]);
        let logits = g.op("MatMul", &[&rows, &t]);
        g.outputs.push(logits);
        (m, w)
    }

    #[test]
    fn a_tied_table_is_gathered_from_the_heads_codes() {
        // 64 rows of 64 values: codes of 2048 / 4096 bytes and scales of 1024, in the data file
        for (bits, symmetric, row_bytes, zp) in [(4, true, 32, None), (8, false, 64, Some(4))] {
            let (mut m, w) = tied(64, 64);
            let done = quantize_weights(
                &mut m,
                vec![(w.clone(), None)],
                &settings(bits, symmetric, true),
            )
            .expect("quantize");
            assert_eq!(done[0].3, 1, "one Gather rewritten");
            let g = &m.graph;
            assert!(!g.is_initializer(&w), "the float table is gone");
            let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
            assert_eq!(ops, ["GatherBlockQuantized", "MatMulNBits"]);
            let (gbq, nbits) = (&g.nodes[0], &g.nodes[1]);
            assert_eq!(gbq.domain, super::MS_DOMAIN);
            assert_eq!(int_of(gbq, "bits"), Some(i64::from(bits)));
            let codes = g.initializer(&gbq.inputs[0]).expect("codes view");
            assert_eq!(codes.dims, [64, row_bytes]);
            assert_eq!(g.shared_bytes.get(&gbq.inputs[0]), Some(&nbits.inputs[1]));
            assert_eq!(g.initializer(&gbq.inputs[2]).expect("scales").dims, [64, 4]);
            assert_eq!(
                gbq.inputs
                    .get(3)
                    .map(|z| g.initializer(z).expect("zp").dims.clone()),
                zp.map(|r| vec![64, r])
            );
            // the views' external data is their tensors': the codes and scales are in the file once
            let dir =
                std::env::temp_dir().join(format!("fastonnx_gbq_{bits}_{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join("m.onnx");
            let info = writer::save(&m, &path, Some(true), None).expect("save");
            let proto =
                onnx::ModelProto::decode(&*std::fs::read(&path).expect("read")).expect("proto");
            let graph = proto.graph.expect("graph");
            let external = |name: &str| {
                let t = graph
                    .initializer
                    .iter()
                    .find(|t| t.name.as_deref() == Some(name));
                t.expect("initializer")
                    .external_data
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect::<Vec<_>>()
            };
            for (view, of) in [
                (&gbq.inputs[0], &nbits.inputs[1]),
                (&gbq.inputs[2], &nbits.inputs[2]),
            ] {
                assert!(!external(of).is_empty());
                assert_eq!(external(view), external(of));
            }
            let written: u64 = [1, 2, 3]
                .iter()
                .filter_map(|&i| nbits.inputs.get(i))
                .map(|t| g.initializer(t).expect("t").data.len() as u64)
                .sum();
            assert!(
                info.data_bytes < written + 3 * 64,
                "{} {written}",
                info.data_bytes
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn the_table_stays_where_gathers_are_not_asked_for_or_k_has_padding() {
        let (mut m, w) = tied(8, 32);
        let done = quantize_weights(&mut m, vec![(w.clone(), None)], &settings(4, true, false))
            .expect("quantize");
        assert_eq!(done[0].3, 0);
        assert!(m.graph.is_initializer(&w) && m.graph.shared_bytes.is_empty());
        let (mut m, w) = tied(8, 40); // 40 values a row: 3 blocks of 16, the last padded
        let done =
            quantize_weights(&mut m, vec![(w.clone(), None)], &settings(4, true, true)).expect("q");
        assert_eq!(done[0].3, 0);
        assert_eq!(m.graph.nodes[0].op_type, "Gather");
    }
}
