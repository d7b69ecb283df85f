//! A BatchNormalization after a Conv, folded into the Conv's weight and bias. The new weight is the old one scaled per output channel as the writer writes it (no copy).

use std::sync::Arc;

use super::matching::{f32_values, Index};
use super::rewrite::{fuse, Rewrite};
use crate::dtype;
use crate::graph::{AttrValue, Graph};
use crate::tensor::{ByteSource, Tensor, TensorData};

struct Folded {
    conv: usize,
    bn: usize,
    /// the Conv's weight, scaled per output channel as it is written
    weight: String,
    dims: Vec<i64>,
    data: TensorData,
    bias: Vec<f32>,
}

/// Conv → BatchNormalization (inference form, float32, the Conv's output read only by it) becomes one
/// Conv with weight W * s and bias (B - mean) * s + beta, where s = gamma / sqrt(var + eps).
pub(crate) fn fuse_conv_batchnorm(g: &mut Graph) -> usize {
    fuse(g, &["BatchNormalization"], match_pair, |g, f| {
        let w_name = g.names.unique_value(&format!("{}_bn", f.weight));
        let b_name = g.names.unique_value(&format!("{}_bn_bias", f.weight));
        g.insert_initializer(Tensor {
            name: w_name.clone(),
            dtype: dtype::FLOAT,
            dims: f.dims,
            data: f.data,
        });
        g.insert_initializer(Tensor {
            name: b_name.clone(),
            dtype: dtype::FLOAT,
            dims: vec![f.bias.len() as i64],
            data: TensorData::Owned(f.bias.iter().flat_map(|v| v.to_le_bytes()).collect()),
        });
        let conv = &g.nodes[f.conv];
        let inputs = vec![conv.inputs[0].clone(), w_name, b_name];
        let out = g.nodes[f.bn].outputs.clone();
        Some(
            Rewrite::rewire(f.conv, inputs)
                .writing(out)
                .removing([f.bn]),
        )
    })
}

fn match_pair(g: &Graph, ix: &Index, bn_i: usize) -> Option<Folded> {
    let bn = &g.nodes[bn_i];
    if bn.inputs.len() != 5 || bn.outputs.len() != 1 {
        return None;
    }
    if matches!(bn.attr("training_mode"), Some(AttrValue::Int(1))) {
        return None;
    }
    let eps = match bn.attr("epsilon") {
        Some(AttrValue::Float(e)) => *e,
        _ => 1e-5,
    };
    // graph outputs count as readers: a Conv whose output is also a graph output is not fused
    let x = &bn.inputs[0];
    let conv_i = *ix.prod.get(x)?;
    let conv = &g.nodes[conv_i];
    if conv.op_type != "Conv"
        || !conv.domain.is_empty()
        || conv.outputs.len() != 1
        || g.outputs.contains(x)
    {
        return None;
    }
    if ix.reads.get(x).copied().unwrap_or(0) != 1 || conv.inputs.len() < 2 {
        return None;
    }
    let gamma = f32_values(g, &bn.inputs[1])?;
    let beta = f32_values(g, &bn.inputs[2])?;
    let mean = f32_values(g, &bn.inputs[3])?;
    let var = f32_values(g, &bn.inputs[4])?;
    let w = g.initializer(&conv.inputs[1])?;
    if w.dtype != dtype::FLOAT || w.dims.is_empty() || w.dims[0] as usize != gamma.len() {
        return None;
    }
    let channels = gamma.len();
    if [beta.len(), mean.len(), var.len()]
        .iter()
        .any(|l| *l != channels)
    {
        return None;
    }
    let bias = match conv.inputs.get(2).filter(|b| !b.is_empty()) {
        Some(b) => match f32_values(g, b) {
            Some(v) if v.len() == channels => v,
            _ => return None,
        },
        None => vec![0.0; channels],
    };
    let scale: Vec<f32> = gamma
        .iter()
        .zip(&var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let bias: Vec<f32> = (0..channels)
        .map(|c| (bias[c] - mean[c]) * scale[c] + beta[c])
        .collect();
    let inner = w.numel() as usize / channels;
    // the scaled weight is computed as it is written, from torch's memory or the constant's bytes
    let source: Arc<dyn ByteSource> = match &w.data {
        TensorData::Borrowed(src) => Arc::clone(src),
        TensorData::Owned(bytes) => Arc::new(bytes.clone()),
        _ => return None,
    };
    Some(Folded {
        conv: conv_i,
        bn: bn_i,
        weight: conv.inputs[1].clone(),
        dims: w.dims.clone(),
        data: TensorData::ChannelScaled {
            source,
            scale: Arc::new(scale),
            inner,
        },
        bias,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed, float, GraphExt};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn batchnorm_folds_into_conv() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[1, 1, 2, 2]));
        let w = g.f32s(&[2, 1, 1, 1], &[1.0, 2.0]);
        let b = g.f32s(&[2], &[0.5, -0.5]);
        let conv = g.op("Conv", &[&x, &w, &b]);
        let gamma = g.f32s(&[2], &[2.0, 1.0]);
        let beta = g.f32s(&[2], &[0.0, 1.0]);
        let mean = g.f32s(&[2], &[1.0, 0.0]);
        let var = g.f32s(&[2], &[3.0, 0.0]);
        let bn = [conv.as_str(), &gamma, &beta, &mean, &var];
        let y = g.op_with("BatchNormalization", &bn, vec![float("epsilon", 1.0)]);
        g.typed(&y, dtype::FLOAT, &[1, 2, 2, 2]);
        g.outputs.push(y.clone());
        assert_eq!(fuse_conv_batchnorm(&mut g), 1);
        assert_eq!(g.nodes.len(), 1);
        let n = &g.nodes[0];
        assert_eq!(n.outputs[0], y);
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
