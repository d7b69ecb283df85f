//! Common-subexpression elimination: a node equal to an earlier one is computed once.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::rewrite::retain_nodes;
use crate::graph::{AttrValue, Graph};

fn attr_key(out: &mut String, v: &AttrValue) -> bool {
    // Writing to a String cannot fail.
    match v {
        AttrValue::Int(i) => {
            let _ = write!(out, "i{i}");
        }
        AttrValue::Float(f) => {
            let _ = write!(out, "f{}", f.to_bits());
        }
        AttrValue::String(s) => {
            let _ = write!(out, "s{s:?}");
        }
        AttrValue::Ints(v) => {
            let _ = write!(out, "I{v:?}");
        }
        AttrValue::Floats(v) => {
            let bits: Vec<u32> = v.iter().map(|f| f.to_bits()).collect();
            let _ = write!(out, "F{bits:?}");
        }
        AttrValue::Strings(v) => {
            let _ = write!(out, "S{v:?}");
        }
        AttrValue::Tensor(t) => {
            if t.data.len() > 4096 {
                return false;
            }
            let _ = write!(out, "T{}{:?}{:?}", t.dtype, t.dims, t.data.to_vec());
        }
        AttrValue::Graph(_) => return false,
    }
    true
}

const NONDETERMINISTIC: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
];

/// Common-subexpression elimination: a node equal to an earlier one (op, domain, inputs, attributes)
/// reads the earlier one's outputs instead. Returns how many nodes were merged.
pub fn eliminate_common_subexpressions(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut replace: HashMap<String, String> = HashMap::new();
    let mut to_identity: Vec<(usize, String)> = Vec::new();
    let mut removed: HashSet<usize> = HashSet::new();
    for i in 0..g.nodes.len() {
        for input in &mut g.nodes[i].inputs {
            if let Some(r) = replace.get(input) {
                *input = r.clone();
            }
        }
        let n = &g.nodes[i];
        // a local function's call may draw random values inside: two calls are two draws
        if n.outputs.is_empty()
            || NONDETERMINISTIC.contains(&n.op_type.as_str())
            || n.domain.starts_with(crate::functions::DOMAIN_PREFIX)
        {
            continue;
        }
        let mut key = format!("{}|{}|{:?}|", n.op_type, n.domain, n.inputs);
        if !n.attrs.iter().all(|a| {
            key.push_str(&a.name);
            key.push('=');
            attr_key(&mut key, &a.value)
        }) {
            continue;
        }
        let _ = write!(key, "|{}", n.outputs.len());
        match seen.get(&key) {
            Some(&first) => {
                let earlier = g.nodes[first].outputs.clone();
                let mine = n.outputs.clone();
                if mine.iter().any(|o| outputs.contains(o)) {
                    // keep the graph output's name: the node becomes an Identity of the first result
                    if mine.len() == 1 {
                        to_identity.push((i, earlier[0].clone()));
                    }
                    continue;
                }
                for (m, e) in mine.into_iter().zip(earlier) {
                    if !m.is_empty() {
                        replace.insert(m, e);
                    }
                }
                removed.insert(i);
            }
            None => {
                seen.insert(key, i);
            }
        }
    }
    for (i, src) in &to_identity {
        let n = &mut g.nodes[*i];
        n.op_type = "Identity".to_owned();
        n.domain.clear();
        n.inputs = vec![src.clone()];
        n.attrs.clear();
    }
    // readers inside subgraphs may also refer to merged values
    if !replace.is_empty() {
        for n in &mut g.nodes {
            for a in &mut n.attrs {
                if let AttrValue::Graph(sub) = &mut a.value {
                    for (old, new) in &replace {
                        sub.rename(old, new);
                    }
                }
            }
        }
    }
    let count = removed.len() + to_identity.len();
    retain_nodes(g, |i| !removed.contains(&i));
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::testing::GraphExt;

    #[test]
    fn cse_merges_equal_nodes_and_keeps_outputs() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let a = g.op("Relu", &[&x]);
        let b = g.op("Relu", &[&x]);
        let s = g.op("Add", &[&a, &b]);
        g.outputs.push(s);
        assert_eq!(eliminate_common_subexpressions(&mut g), 1);
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(g.nodes[1].inputs, [a.clone(), a]);
    }
}
