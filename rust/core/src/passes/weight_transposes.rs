//! A weight read through a Transpose (any rank, any perm: a matrix, batched expert weights
//! `[experts, in, out]`) is stored permuted instead: written band by band by the writer, never copied
//! whole in memory.

use std::collections::HashSet;
use std::sync::Arc;

use super::noops::ints_attr;
use super::rewrite::retain_nodes;
use crate::dtype;
use crate::graph::Graph;
use crate::permute;
use crate::tensor::{Permutation, Tensor, TensorData};

/// A Transpose of an initializer becomes an initializer stored permuted: weights stay borrowed (the
/// writer permutes them as it writes), small owned constants are permuted now.
pub(crate) fn fold_weight_transposes(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut folded: Vec<(usize, Tensor)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op_type != "Transpose" || !n.domain.is_empty() || n.inputs.len() != 1 {
            continue;
        }
        if outputs.contains(&n.outputs[0]) {
            continue;
        }
        let Some(w) = g.initializer(&n.inputs[0]) else {
            continue;
        };
        let Ok(dims) = w
            .dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
        else {
            continue;
        };
        // ONNX's default perm reverses the axes
        let perm: Vec<usize> = match ints_attr(n, "perm") {
            Some(p) => match p.iter().map(|&a| usize::try_from(a)).collect() {
                Ok(p) => p,
                Err(_) => continue,
            },
            None => (0..dims.len()).rev().collect(),
        };
        if !permute::is_permutation(&perm, dims.len()) {
            continue; // an invalid node is the runtime's to report
        }
        let Some(item) = dtype::item_size(w.dtype) else {
            continue;
        };
        let data = match &w.data {
            TensorData::Borrowed(src) => {
                TensorData::transposed(Arc::clone(src), dims.clone(), perm.clone(), item)
            }
            // a permuted weight permuted again reads its memory through the composed permutation
            // (the original memory when they cancel)
            TensorData::Transposed {
                source,
                dims: source_dims,
                perm: first,
                item,
            } => TensorData::transposed(
                Arc::clone(source),
                source_dims.clone(),
                perm.iter().map(|&k| first[k]).collect(),
                *item,
            ),
            // a weight off the CPU: permuted as its host copy is written (composed with an earlier perm)
            TensorData::Fetched {
                fetch,
                len,
                permuted,
            } => {
                let (dims, perm, item) = match permuted {
                    Some(p) => (
                        p.dims.clone(),
                        perm.iter().map(|&k| p.perm[k]).collect(),
                        p.item,
                    ),
                    None => (dims.clone(), perm.clone(), item),
                };
                TensorData::Fetched {
                    fetch: Arc::clone(fetch),
                    len: *len,
                    permuted: (!permute::is_identity(&dims, &perm))
                        .then(|| Arc::new(Permutation { dims, perm, item })),
                }
            }
            // no bytes yet, or bytes computed as they are written: keep the Transpose node
            TensorData::Deferred { .. }
            | TensorData::Referenced { .. }
            | TensorData::ChannelScaled { .. }
            | TensorData::Converted { .. }
            | TensorData::Quantized(_) => continue,
            TensorData::Owned(bytes) => TensorData::Owned(
                TensorData::transposed(Arc::new(bytes.clone()), dims.clone(), perm.clone(), item)
                    .to_vec(),
            ),
        };
        folded.push((
            i,
            Tensor {
                name: n.outputs[0].clone(),
                dtype: w.dtype,
                dims: perm.iter().map(|&a| w.dims[a]).collect(),
                data,
            },
        ));
    }
    let count = folded.len();
    let drop: HashSet<usize> = folded.iter().map(|(i, _)| *i).collect();
    for (_, t) in folded {
        g.insert_initializer(t);
    }
    retain_nodes(g, |i| !drop.contains(&i));
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::GraphExt;

    #[test]
    fn weight_transposes_fold_lazily() {
        let mut g = Graph::new("g");
        let w = g.f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let t = g.op("Transpose", &[&w]);
        let y = g.op("Relu", &[&t]);
        g.outputs.push(y);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let wt = g.initializer(&t).expect("folded");
        assert_eq!(wt.dims, vec![3, 2]);
        let want: Vec<u8> = [1f32, 4., 2., 5., 3., 6.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(wt.data.to_vec(), want);
    }

    fn perm(p: &[i64]) -> Vec<crate::graph::Attribute> {
        vec![crate::graph::Attribute {
            name: "perm".to_owned(),
            value: crate::graph::AttrValue::Ints(p.to_vec()),
        }]
    }

    /// A borrowed float32 weight of `dims` holding 0, 1, 2, ...
    fn weight(g: &mut Graph, dims: &[i64]) -> (String, Vec<f32>) {
        let n = dims.iter().product::<i64>();
        let values: Vec<f32> = (0..n).map(|v| v as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let name = g
            .add_initializer(
                "w",
                dtype::FLOAT,
                dims.to_vec(),
                TensorData::Borrowed(Arc::new(bytes)),
                None,
            )
            .expect("weight");
        (name, values)
    }

    fn floats(data: &TensorData) -> Vec<f32> {
        crate::tensor::le_f32s(&data.to_vec())
    }

    #[test]
    fn batched_weights_are_stored_permuted_lazily() {
        let mut g = Graph::new("g");
        let (w, v) = weight(&mut g, &[2, 3, 4]); // [experts, in, out]
        let t = g.op_with("Transpose", &[&w], perm(&[0, 2, 1]));
        let y = g.op("Relu", &[&t]);
        g.outputs.push(y);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let wt = g.initializer(&t).expect("folded");
        assert_eq!(wt.dims, vec![2, 4, 3]);
        assert!(matches!(wt.data, TensorData::Transposed { .. }));
        let mut want = Vec::new();
        for e in 0..2 {
            for o in 0..4 {
                for i in 0..3 {
                    want.push(v[e * 12 + i * 4 + o]);
                }
            }
        }
        assert_eq!(floats(&wt.data), want);
        assert!(g.nodes.iter().all(|n| n.op_type != "Transpose"));
    }

    #[test]
    fn transposes_compose_and_cancel() {
        // perm [1, 2, 0] then [2, 0, 1]: back where it started, the original memory
        let mut g = Graph::new("g");
        let (w, v) = weight(&mut g, &[2, 3, 4]);
        let t1 = g.op_with("Transpose", &[&w], perm(&[1, 2, 0]));
        let t2 = g.op_with("Transpose", &[&t1], perm(&[2, 0, 1]));
        let y = g.op("Relu", &[&t2]);
        g.outputs.push(y);
        // the first round folds t1; t2 then reads a permuted initializer
        assert_eq!(fold_weight_transposes(&mut g), 1);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let back = g.initializer(&t2).expect("folded");
        assert_eq!(back.dims, vec![2, 3, 4]);
        assert!(matches!(back.data, TensorData::Borrowed(_)));
        assert_eq!(floats(&back.data), v);
        // two that do not cancel compose: [2, 0, 1] after [0, 2, 1] is [1, 0, 2] of the source
        let mut g = Graph::new("g");
        let (w, v) = weight(&mut g, &[2, 3, 4]);
        let t1 = g.op_with("Transpose", &[&w], perm(&[0, 2, 1]));
        let t2 = g.op_with("Transpose", &[&t1], perm(&[2, 0, 1]));
        let y = g.op("Relu", &[&t2]);
        g.outputs.push(y);
        fold_weight_transposes(&mut g);
        fold_weight_transposes(&mut g);
        let wt = g.initializer(&t2).expect("folded");
        assert_eq!(wt.dims, vec![3, 2, 4]);
        let mut want = Vec::new();
        for i in 0..3 {
            for e in 0..2 {
                for o in 0..4 {
                    want.push(v[e * 12 + i * 4 + o]);
                }
            }
        }
        assert_eq!(floats(&wt.data), want);
    }

    #[test]
    fn moving_size_one_axes_keeps_the_memory_and_bad_perms_stay() {
        let mut g = Graph::new("g");
        let (w, v) = weight(&mut g, &[1, 5, 1, 3]);
        let t = g.op_with("Transpose", &[&w], perm(&[2, 1, 0, 3]));
        let bad = g.op_with("Transpose", &[&w], perm(&[0, 1, 1, 3]));
        let y = g.op("Add", &[&t, &bad]);
        g.outputs.push(y);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let wt = g.initializer(&t).expect("folded");
        assert!(matches!(wt.data, TensorData::Borrowed(_)));
        assert_eq!(floats(&wt.data), v);
        assert_eq!(
            g.nodes.iter().filter(|n| n.op_type == "Transpose").count(),
            1
        );
    }

    #[test]
    fn default_perm_reverses_every_axis_of_owned_constants() {
        let mut g = Graph::new("g");
        let c = g.f32s(&[2, 1, 3], &[1., 2., 3., 4., 5., 6.]);
        let t = g.op("Transpose", &[&c]);
        let y = g.op("Relu", &[&t]);
        g.outputs.push(y);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let ct = g.initializer(&t).expect("folded");
        assert_eq!(ct.dims, vec![3, 1, 2]);
        assert!(matches!(ct.data, TensorData::Owned(_)));
        assert_eq!(floats(&ct.data), vec![1., 4., 2., 5., 3., 6.]);
    }

    /// Bytes on "a device": each host copy is fresh.
    struct Device(Vec<u8>);
    impl crate::tensor::Fetch for Device {
        fn fetch(&self) -> std::io::Result<Arc<dyn crate::tensor::ByteSource>> {
            Ok(Arc::new(self.0.clone()))
        }
    }

    #[test]
    fn device_weights_are_permuted_as_their_host_copy_is_written() {
        let mut g = Graph::new("g");
        let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let data = TensorData::Fetched {
            fetch: Arc::new(Device(bytes)),
            len: 96,
            permuted: None,
        };
        let w = g
            .add_initializer("w", dtype::FLOAT, vec![2, 3, 4], data, None)
            .expect("weight");
        let t1 = g.op_with("Transpose", &[&w], perm(&[0, 2, 1]));
        let t2 = g.op_with("Transpose", &[&t1], perm(&[0, 2, 1]));
        let y = g.op("Add", &[&t1, &t1]);
        let z = g.op("Relu", &[&t2]);
        g.outputs.push(y);
        g.outputs.push(z);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        assert_eq!(fold_weight_transposes(&mut g), 1);
        let wt = g.initializer(&t1).expect("folded");
        assert!(matches!(
            wt.data,
            TensorData::Fetched {
                permuted: Some(_),
                ..
            }
        ));
        let mut want = Vec::new();
        for e in 0..2 {
            for o in 0..4 {
                for i in 0..3 {
                    want.push(values[e * 12 + i * 4 + o]);
                }
            }
        }
        assert_eq!(floats(&wt.data), want);
        // through the writer's pipeline too
        let mut piped = Vec::new();
        crate::prefetch::with_prefetch(vec![&wt.data], |p| p.write(&wt.data, &mut piped))
            .expect("write");
        assert_eq!(crate::tensor::le_f32s(&piped), want);
        // transposed back: the host copy as it is
        let back = g.initializer(&t2).expect("folded");
        assert!(matches!(
            back.data,
            TensorData::Fetched { permuted: None, .. }
        ));
        assert_eq!(floats(&back.data), values);
    }
}
