//! A 2-D weight read through a Transpose is stored transposed instead: written block by block by the
//! writer, never copied whole in memory.

use std::collections::HashSet;
use std::sync::Arc;

use super::noops::ints_attr;
use super::rewrite::retain_nodes;
use crate::dtype;
use crate::graph::Graph;
use crate::tensor::{Tensor, TensorData};

/// A Transpose of a 2-D initializer becomes an initializer stored transposed: weights stay borrowed
/// (the writer transposes them as it writes), small owned constants are transposed now.
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
        if w.dims.len() != 2 {
            continue;
        }
        if let Some(p) = ints_attr(n, "perm") {
            if p != [1, 0] {
                continue;
            }
        }
        let Some(item) = dtype::item_size(w.dtype) else {
            continue;
        };
        let (rows, cols) = (w.dims[0] as usize, w.dims[1] as usize);
        let data = match &w.data {
            TensorData::Borrowed(src) => TensorData::Transposed {
                source: Arc::clone(src),
                rows,
                cols,
                item,
            },
            // transposing a transposed weight gives the original memory back
            TensorData::Transposed { source, .. } => TensorData::Borrowed(Arc::clone(source)),
            // no bytes yet, or bytes computed as they are written: keep the Transpose node
            TensorData::Deferred { .. }
            | TensorData::Referenced { .. }
            | TensorData::ChannelScaled { .. }
            | TensorData::Converted { .. } => continue,
            TensorData::Owned(bytes) => {
                let view = TensorData::Transposed {
                    source: Arc::new(bytes.clone()),
                    rows,
                    cols,
                    item,
                };
                TensorData::Owned(view.to_vec())
            }
        };
        folded.push((
            i,
            Tensor {
                name: n.outputs[0].clone(),
                dtype: w.dtype,
                dims: vec![w.dims[1], w.dims[0]],
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
}
