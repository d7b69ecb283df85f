//! Fusions that change weights: a BatchNormalization after a Conv is folded into the Conv's weight and
//! bias. The new weight is the old one scaled per output channel as the writer writes it (no copy).

use std::sync::Arc;

use super::{f32_values, producers, readers, retain_nodes};
use crate::dtype;
use crate::graph::{AttrValue, Graph};
use crate::tensor::{ByteSource, Tensor, TensorData};

/// Conv → BatchNormalization (inference form, float32, the Conv's output read only by it) becomes one
/// Conv with weight W * s and bias (B - mean) * s + beta, where s = gamma / sqrt(var + eps).
pub fn fuse_conv_batchnorm(g: &mut Graph) -> usize {
    // graph outputs count as readers: a Conv whose output is also a graph output is not fused
    let readers = readers(g);
    let producer = producers(g);
    let mut fused = 0;
    let mut remove = std::collections::HashSet::new();
    for bn_i in 0..g.nodes.len() {
        let bn = &g.nodes[bn_i];
        if bn.op_type != "BatchNormalization"
            || !bn.domain.is_empty()
            || bn.inputs.len() != 5
            || bn.outputs.len() != 1
        {
            continue;
        }
        if matches!(bn.attr("training_mode"), Some(AttrValue::Int(1))) {
            continue;
        }
        let eps = match bn.attr("epsilon") {
            Some(AttrValue::Float(e)) => *e,
            _ => 1e-5,
        };
        let x = &bn.inputs[0];
        let Some(&conv_i) = producer.get(x) else {
            continue;
        };
        let conv = &g.nodes[conv_i];
        if conv.op_type != "Conv"
            || !conv.domain.is_empty()
            || conv.outputs.len() != 1
            || g.outputs.contains(x)
        {
            continue;
        }
        if readers.get(x).copied().unwrap_or(0) != 1 || conv.inputs.len() < 2 {
            continue;
        }
        let (Some(gamma), Some(beta), Some(mean), Some(var)) = (
            f32_values(g, &bn.inputs[1]),
            f32_values(g, &bn.inputs[2]),
            f32_values(g, &bn.inputs[3]),
            f32_values(g, &bn.inputs[4]),
        ) else {
            continue;
        };
        let Some(w) = g.initializer(&conv.inputs[1]) else {
            continue;
        };
        if w.dtype != dtype::FLOAT || w.dims.is_empty() || w.dims[0] as usize != gamma.len() {
            continue;
        }
        let channels = gamma.len();
        if [beta.len(), mean.len(), var.len()]
            .iter()
            .any(|l| *l != channels)
        {
            continue;
        }
        let bias = match conv.inputs.get(2).filter(|b| !b.is_empty()) {
            Some(b) => match f32_values(g, b) {
                Some(v) if v.len() == channels => v,
                _ => continue,
            },
            None => vec![0.0; channels],
        };
        let scale: Vec<f32> = gamma
            .iter()
            .zip(&var)
            .map(|(g, v)| g / (v + eps).sqrt())
            .collect();
        let new_bias: Vec<f32> = (0..channels)
            .map(|c| (bias[c] - mean[c]) * scale[c] + beta[c])
            .collect();
        let inner = w.numel() as usize / channels;
        // the scaled weight is computed as it is written, from torch's memory or the constant's bytes
        let source: Arc<dyn ByteSource> = match &w.data {
            TensorData::Borrowed(src) => Arc::clone(src),
            TensorData::Owned(bytes) => Arc::new(bytes.clone()),
            _ => continue,
        };
        let data = TensorData::ChannelScaled {
            source,
            scale: Arc::new(scale),
            inner,
        };
        let w_name = g.names.unique_value(&format!("{}_bn", conv.inputs[1]));
        let b_name = g.names.unique_value(&format!("{}_bn_bias", conv.inputs[1]));
        let dims = w.dims.clone();
        g.insert_initializer(Tensor {
            name: w_name.clone(),
            dtype: dtype::FLOAT,
            dims,
            data,
        });
        g.insert_initializer(Tensor {
            name: b_name.clone(),
            dtype: dtype::FLOAT,
            dims: vec![channels as i64],
            data: TensorData::Owned(new_bias.iter().flat_map(|v| v.to_le_bytes()).collect()),
        });
        let out = g.nodes[bn_i].outputs[0].clone();
        let conv = &mut g.nodes[conv_i];
        conv.inputs.truncate(1);
        conv.inputs.push(w_name);
        conv.inputs.push(b_name);
        conv.outputs[0] = out;
        remove.insert(bn_i);
        fused += 1;
    }
    retain_nodes(g, |i| !remove.contains(&i));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Dim, ValueType};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn batchnorm_folds_into_conv() {
        let mut g = Graph::new("g");
        let x = g.add_input(
            "x",
            dtype::FLOAT,
            Some(vec![
                Dim::Fixed(1),
                Dim::Fixed(1),
                Dim::Fixed(2),
                Dim::Fixed(2),
            ]),
        );
        let w = g
            .add_constant("w", dtype::FLOAT, vec![2, 1, 1, 1], f32s(&[1.0, 2.0]))
            .expect("w");
        let b = g
            .add_constant("b", dtype::FLOAT, vec![2], f32s(&[0.5, -0.5]))
            .expect("b");
        let conv = g
            .add_node("Conv", "", vec![x, w, b], &["c".into()], vec![], None)
            .expect("conv");
        let p = |g: &mut Graph, n: &str, v: &[f32]| {
            g.add_constant(n, dtype::FLOAT, vec![2], f32s(v)).expect(n)
        };
        let gamma = p(&mut g, "gamma", &[2.0, 1.0]);
        let beta = p(&mut g, "beta", &[0.0, 1.0]);
        let mean = p(&mut g, "mean", &[1.0, 0.0]);
        let var = p(&mut g, "var", &[3.0, 0.0]);
        let eps = Attribute {
            name: "epsilon".into(),
            value: AttrValue::Float(1.0),
        };
        let y = g
            .add_node(
                "BatchNormalization",
                "",
                vec![conv[0].clone(), gamma, beta, mean, var],
                &["y".into()],
                vec![eps],
                None,
            )
            .expect("bn");
        g.set_type(
            &y[0],
            ValueType {
                dtype: Some(dtype::FLOAT),
                shape: None,
            },
        )
        .expect("type");
        g.outputs.push(y[0].clone());
        assert_eq!(fuse_conv_batchnorm(&mut g), 1);
        assert_eq!(g.nodes.len(), 1);
        let n = &g.nodes[0];
        assert_eq!(n.outputs[0], "y");
        // s = gamma / sqrt(var + 1) = [1, 1]; bias = (b - mean) * s + beta = [-0.5, 0.5]
        assert_eq!(
            g.initializer(&n.inputs[1]).expect("w").data.to_vec(),
            f32s(&[1.0, 2.0])
        );
        assert_eq!(
            g.initializer(&n.inputs[2]).expect("b").data.to_vec(),
            f32s(&[-0.5, 0.5])
        );
    }
}
