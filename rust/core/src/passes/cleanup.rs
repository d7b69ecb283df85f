//! Clean-up: Identity nodes and nodes or initializers nothing reads.

use std::collections::{HashMap, HashSet};

use super::rewrite::retain_nodes;
use crate::graph::{rename_in, AttrValue, Graph, Node};

/// Every name read by `nodes`, inside subgraphs too (a subgraph may read outer values).
fn collect_reads<'a>(nodes: impl Iterator<Item = &'a Node>, out: &mut HashSet<String>) {
    for n in nodes {
        out.extend(n.inputs.iter().filter(|i| !i.is_empty()).cloned());
        for a in &n.attrs {
            if let AttrValue::Graph(g) = &a.value {
                collect_reads(g.nodes.iter(), out);
                out.extend(g.outputs.iter().cloned());
            }
        }
    }
}

/// Removes Identity nodes: readers read the source instead; when the Identity's output is a graph
/// output and the source is an ordinary value, the source takes the output's name.
pub fn remove_identities(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let protected: HashSet<String> = g
        .inputs
        .iter()
        .chain(g.outputs.iter())
        .cloned()
        .chain(g.initializers.iter().map(|t| t.name.clone()))
        .collect();
    let mut replace: HashMap<String, String> = HashMap::new();
    let mut renames: Vec<(String, String)> = Vec::new();
    let mut removed = vec![false; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op_type != "Identity"
            || !n.domain.is_empty()
            || n.inputs.len() != 1
            || n.outputs.len() != 1
        {
            continue;
        }
        let src = replace
            .get(&n.inputs[0])
            .cloned()
            .unwrap_or_else(|| n.inputs[0].clone());
        let dst = n.outputs[0].clone();
        if !outputs.contains(&dst) {
            replace.insert(dst, src);
            removed[i] = true;
        } else if !protected.contains(&src) && !renames.iter().any(|(s, _)| *s == src) {
            renames.push((src, dst));
            removed[i] = true;
        }
    }
    let count = removed.iter().filter(|r| **r).count();
    if count == 0 {
        return 0;
    }
    retain_nodes(g, |i| !removed[i]);
    if !replace.is_empty() {
        replace_reads(&mut g.nodes, &replace);
    }
    for (src, dst) in renames {
        // the Identity was removed: its output name now belongs to the source's producer
        let ty = g.types.remove(&src);
        rename_in(&mut g.nodes, &src, &dst);
        if let Some(ty) = ty {
            g.types.entry(dst).or_insert(ty);
        }
    }
    count
}

fn replace_reads(nodes: &mut [Node], replace: &HashMap<String, String>) {
    for n in nodes.iter_mut() {
        for i in &mut n.inputs {
            if let Some(r) = replace.get(i) {
                *i = r.clone();
            }
        }
        for a in &mut n.attrs {
            if let AttrValue::Graph(sub) = &mut a.value {
                replace_reads(&mut sub.nodes, replace);
                for o in &mut sub.outputs {
                    if let Some(r) = replace.get(o) {
                        *o = r.clone();
                    }
                }
            }
        }
    }
}

/// Small initializers (biases, norm scales) with the same type, shape and bytes are stored once: their
/// readers read the first. Untrained or freshly initialized weights repeat (zero biases, unit scales),
/// and so do folded constants; one copy keeps them in cache. Only tensors whose bytes are at hand and
/// at most this size are compared, so the pass never reads a large weight.
const SMALL_INITIALIZER_BYTES: usize = 64 << 10;

/// Returns how many initializers it redirected to an equal one (the copies go with the clean-up).
pub(crate) fn dedup_small_initializers(g: &mut Graph) -> usize {
    let outputs: HashSet<&str> = g.outputs.iter().map(String::as_str).collect();
    let mut first: HashMap<(i32, &[i64], &[u8]), &str> = HashMap::new();
    let mut replace: HashMap<String, String> = HashMap::new();
    for t in &g.initializers {
        let Some(bytes) = t.data.as_slice() else {
            continue;
        };
        if bytes.len() > SMALL_INITIALIZER_BYTES || outputs.contains(t.name.as_str()) {
            continue;
        }
        match first.entry((t.dtype, &t.dims, bytes)) {
            std::collections::hash_map::Entry::Occupied(e) => {
                replace.insert(t.name.clone(), (*e.get()).to_owned());
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(&t.name);
            }
        }
    }
    replace_reads(&mut g.nodes, &replace);
    replace.len()
}

/// Removes the nodes whose outputs nobody reads (graph outputs, subgraph reads and what they read,
/// transitively); returns how many.
pub fn remove_unused_nodes(g: &mut Graph) -> usize {
    let mut live: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut keep = vec![false; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate().rev() {
        if n.outputs.iter().any(|o| live.contains(o)) {
            keep[i] = true;
            collect_reads(std::iter::once(n), &mut live);
        }
    }
    let before = g.nodes.len();
    retain_nodes(g, |i| keep[i]);
    before - g.nodes.len()
}

/// Removes the initializers no node (nor subgraph, nor graph output) reads; returns how many.
pub(crate) fn remove_unused_initializers(g: &mut Graph) -> usize {
    fn reads<'a>(g: &'a Graph, out: &mut HashSet<&'a str>) {
        out.extend(g.outputs.iter().map(String::as_str));
        for n in &g.nodes {
            out.extend(n.inputs.iter().map(String::as_str));
            for sub in n.subgraphs() {
                reads(sub, out);
            }
        }
    }
    // names borrowed, not copied: only the few dead initializers' names are
    let mut live = HashSet::new();
    reads(g, &mut live);
    let dead: HashSet<String> = g
        .initializers
        .iter()
        .filter(|t| !live.contains(t.name.as_str()))
        .map(|t| t.name.clone())
        .collect();
    if dead.is_empty() {
        return 0;
    }
    g.retain_initializers(|name| !dead.contains(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::testing::GraphExt;

    #[test]
    fn identities_and_dead_nodes_go() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let c = g.f32s(&[], &[1.0]);
        let unused_c = g.f32s(&[], &[2.0]);
        let a = g.op("Identity", &[&x]);
        let b = g.op("Add", &[&a, &c]);
        let _dead = g.op("Mul", &[&b, &unused_c]);
        let out = g.op("Identity", &[&b]);
        g.outputs.push(out.clone());
        assert_eq!(remove_identities(&mut g), 2);
        assert_eq!(remove_unused_nodes(&mut g), 1);
        assert_eq!(remove_unused_initializers(&mut g), 1);
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(g.nodes[0].inputs[0], x);
        assert_eq!(g.nodes[0].outputs[0], out);
    }

    #[test]
    fn identity_between_input_and_output_stays() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let o = g.op("Identity", &[&x]);
        g.outputs.push(o);
        assert_eq!(remove_identities(&mut g), 0);
        assert_eq!(g.nodes.len(), 1);
    }
}
