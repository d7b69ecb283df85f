//! Below opset 23 (no `Attention` operator), the attention chains (see [`super::chain`]) stay
//! decomposed, but two of their Wheres may do nothing: one applying a boolean mask that folded to an
//! all-true constant (no padding), and one zeroing the rows an all-false constant flag closes. Both go.

use super::chain::match_chain;
use crate::graph::Graph;
use crate::passes::matching::{is_op, Index};
use crate::passes::rewrite::{apply, Rewrite};

/// Removes the Wheres of open masks and of flags closing no row; returns how many it removed.
pub(crate) fn remove_open_masks(g: &mut Graph) -> usize {
    let softmaxes: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| is_op(&g.nodes[i], "Softmax"))
        .collect();
    if softmaxes.is_empty() {
        return 0;
    }
    let ix = Index::new(g);
    let mut rewrites = Vec::new();
    for i in softmaxes {
        let Some(c) = match_chain(g, &ix, i) else {
            continue;
        };
        // the Softmax reads the scores the mask's Where passed; the output MatMul reads the Softmax
        if let Some((at, scores)) = c.open_mask {
            rewrites.push(Rewrite::rewire_input(g, c.softmax, 0, scores).removing([at]));
        }
        if let Some((at, probs)) = c.open_rows {
            rewrites.push(Rewrite::rewire_input(g, c.last, 0, probs).removing([at]));
        }
    }
    apply(g, rewrites)
}
