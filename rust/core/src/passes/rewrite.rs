//! The one way a fusion changes the graph: it describes each change as a [`Rewrite`] of one node (the
//! node that produces the fused result, so that the result keeps its name and place), the nodes the
//! rewrite makes dead, and new nodes to insert around it; [`apply`] then performs every rewrite of a
//! pass in one sweep over the nodes. [`fuse`] is the loop most fusions are: match on the unchanged
//! graph from every node of an anchor op type, build the rewrites, apply them.

use std::collections::{HashMap, HashSet};

use super::matching::{is_op, Index};
use crate::dtype;
use crate::graph::{Attribute, Graph, Node};
use crate::scopes::node_name_hint;

/// A change to the node at `at` (kept in place, with its name), the nodes it makes dead and the nodes
/// to insert before or after it.
#[derive(Debug)]
pub(crate) struct Rewrite {
    at: usize,
    /// the new op: (op type, domain, attributes); None keeps the node's op and attributes
    op: Option<(String, String, Vec<Attribute>)>,
    inputs: Vec<String>,
    /// None keeps the node's outputs
    outputs: Option<Vec<String>>,
    remove: Vec<usize>,
    before: Vec<Node>,
    after: Vec<Node>,
}

impl Rewrite {
    /// The node at `at` becomes `op_type(inputs)` of `domain` ("" for the standard one) with `attrs`.
    pub(crate) fn replace(
        at: usize,
        op_type: &str,
        domain: &str,
        inputs: Vec<String>,
        attrs: Vec<Attribute>,
    ) -> Rewrite {
        Rewrite {
            op: Some((op_type.to_owned(), domain.to_owned(), attrs)),
            ..Rewrite::rewire(at, inputs)
        }
    }

    /// The node at `at` keeps its op and reads `inputs` instead.
    pub(crate) fn rewire(at: usize, inputs: Vec<String>) -> Rewrite {
        Rewrite {
            at,
            op: None,
            inputs,
            outputs: None,
            remove: Vec::new(),
            before: Vec::new(),
            after: Vec::new(),
        }
    }

    /// The node at `at` reads `value` as its input `slot`; its op and other inputs stay.
    pub(crate) fn rewire_input(g: &Graph, at: usize, slot: usize, value: String) -> Rewrite {
        let mut inputs = g.nodes[at].inputs.clone();
        if let Some(input) = inputs.get_mut(slot) {
            *input = value;
        }
        Rewrite::rewire(at, inputs)
    }

    /// The nodes (indices of the graph the rewrite was matched on) that go.
    pub(crate) fn removing(mut self, nodes: impl IntoIterator<Item = usize>) -> Rewrite {
        self.remove.extend(nodes);
        self
    }

    /// The node writes `outputs` instead of its own (it takes over the value of a node it replaces).
    pub(crate) fn writing(mut self, outputs: Vec<String>) -> Rewrite {
        self.outputs = Some(outputs);
        self
    }

    /// Nodes inserted before the rewritten one (they compute what it reads).
    pub(crate) fn inserting_before(mut self, nodes: Vec<Node>) -> Rewrite {
        self.before = nodes;
        self
    }

    /// Nodes inserted after the rewritten one (they read what it writes).
    pub(crate) fn inserting_after(mut self, nodes: Vec<Node>) -> Rewrite {
        self.after = nodes;
        self
    }

    /// The node rewritten in place.
    pub(crate) fn at(&self) -> usize {
        self.at
    }

    fn touches(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.at).chain(self.remove.iter().copied())
    }
}

/// Applies `rewrites` (all matched on the current graph) in one sweep; returns how many it applied.
/// A rewrite touching a node an earlier one already took is skipped: matches are meant to be disjoint,
/// and this keeps them so whatever a matcher does.
pub(crate) fn apply(g: &mut Graph, rewrites: Vec<Rewrite>) -> usize {
    if rewrites.is_empty() {
        return 0;
    }
    let mut claimed = HashSet::new();
    let mut dead = HashSet::new();
    let mut edits: HashMap<usize, Rewrite> = HashMap::new();
    for r in rewrites {
        let fresh = r
            .touches()
            .all(|i| i < g.nodes.len() && !claimed.contains(&i));
        if !fresh {
            continue;
        }
        claimed.extend(r.touches());
        dead.extend(r.remove.iter().copied());
        edits.insert(r.at, r);
    }
    let applied = edits.len();
    let scopes = g.scopes.snapshot();
    let old = std::mem::take(&mut g.nodes);
    g.nodes.reserve(old.len());
    for (i, mut n) in old.into_iter().enumerate() {
        let Some(r) = edits.remove(&i) else {
            if !dead.contains(&i) {
                g.nodes.push(n);
            }
            continue;
        };
        // the rewritten node and the nodes inserted around it take the scope of the node whose place
        // and result they take (the last of the chain it fuses), named anew after their op in it
        let scope_index = n.scope;
        let scope = scope_index
            .and_then(|i| scopes.get(i as usize))
            .map(AsRef::as_ref);
        if let Some((op_type, domain, attrs)) = r.op {
            if let Some(s) = scope.filter(|_| op_type != n.op_type) {
                n.name = g.names.unique_node(&node_name_hint(Some(s), &op_type));
            }
            n.op_type = op_type;
            n.domain = domain;
            n.attrs = attrs;
        }
        n.inputs = r.inputs;
        if let Some(outputs) = r.outputs {
            n.outputs = outputs;
        }
        for mut m in r
            .before
            .into_iter()
            .chain(std::iter::once(n))
            .chain(r.after)
        {
            if let (None, Some(s)) = (m.scope, scope) {
                m.scope = scope_index;
                m.name = g.names.unique_node(&node_name_hint(Some(s), &m.op_type));
            }
            g.nodes.push(m);
        }
    }
    applied
}

/// The usual fusion: `find` is tried, on the unchanged graph, at every node whose op type (standard
/// domain) is one of `anchors`; `build` turns each match into a rewrite (adding the constants it
/// needs, or giving up with None); the rewrites are applied together. Returns how many were applied.
pub(crate) fn fuse<M>(
    g: &mut Graph,
    anchors: &[&str],
    mut find: impl FnMut(&Graph, &Index, usize) -> Option<M>,
    mut build: impl FnMut(&mut Graph, M) -> Option<Rewrite>,
) -> usize {
    let starts: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| anchors.iter().any(|op| is_op(&g.nodes[i], op)))
        .collect();
    if starts.is_empty() {
        return 0; // most graphs hold few of the fusions' patterns: no index for nothing
    }
    let ix = Index::new(g);
    let found: Vec<M> = starts.into_iter().filter_map(|i| find(g, &ix, i)).collect();
    let rewrites = found.into_iter().filter_map(|m| build(g, m)).collect();
    apply(g, rewrites)
}

/// Keeps the nodes whose index `keep` accepts (passes collect what to drop, then sweep once).
pub(crate) fn retain_nodes(g: &mut Graph, keep: impl Fn(usize) -> bool) {
    let mut index = 0;
    g.nodes.retain(|_| {
        index += 1;
        keep(index - 1)
    });
}

/// A node a fusion creates, named after its op; `apply` gives it the scope of the node it replaces.
pub(crate) fn new_node(
    g: &Graph,
    op: &str,
    domain: &str,
    inputs: Vec<String>,
    output: &str,
    attrs: Vec<Attribute>,
) -> Node {
    Node {
        name: g.names.unique_node(op),
        op_type: op.into(),
        domain: domain.into(),
        inputs,
        outputs: vec![output.to_owned()],
        attrs,
        scope: None,
    }
}

/// An int64 constant of shape `dims` a fusion adds, named after `hint` (None when the graph
/// refuses it).
pub(crate) fn i64_constant(
    g: &mut Graph,
    hint: &str,
    dims: Vec<i64>,
    values: &[i64],
) -> Option<String> {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    g.add_constant(hint, dtype::INT64, dims, bytes).ok()
}

/// A float32 scalar constant a fusion adds (None when the graph refuses it).
pub(crate) fn f32_constant(g: &mut Graph, hint: &str, v: f32) -> Option<String> {
    g.add_constant(hint, dtype::FLOAT, vec![], v.to_le_bytes().to_vec())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::testing::GraphExt;

    #[test]
    fn rewrites_apply_in_one_sweep_and_overlaps_are_skipped() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let a = g.op("Neg", &[&x]);
        let b = g.op("Abs", &[&a]);
        let c = g.op("Relu", &[&b]);
        g.outputs.push(c.clone());
        let extra = g.node_of("Sigmoid", &[&x]);
        let rewrites = vec![
            Rewrite::replace(2, "Fused", "", vec![x.clone()], vec![])
                .removing([0, 1])
                .inserting_before(vec![extra]),
            // takes node 1, already taken: skipped
            Rewrite::rewire(1, vec![x.clone()]),
        ];
        assert_eq!(apply(&mut g, rewrites), 1);
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Sigmoid", "Fused"]);
        assert_eq!(g.nodes[1].outputs, [c]);
        assert_eq!(g.nodes[1].inputs, [x]);
    }

    #[test]
    fn rewritten_and_inserted_nodes_keep_the_scope_of_the_node_they_replace() {
        use crate::scopes::Scope;
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, None);
        let first = g.scopes.add(Scope {
            prefix: "/a".into(),
            props: vec![],
        });
        let last = g.scopes.add(Scope {
            prefix: "/b".into(),
            props: vec![],
        });
        g.set_scope(Some(first)).expect("scope");
        let a = g.op("Neg", &[&x]);
        g.set_scope(Some(last)).expect("scope");
        let b = g.op("Abs", &[&a]);
        g.outputs.push(b);
        assert_eq!(g.nodes[1].name, "/b/Abs");
        let extra = g.node_of("Sigmoid", &[&x]);
        let r = Rewrite::replace(1, "Fused", "", vec![x.clone()], vec![])
            .removing([0])
            .inserting_before(vec![extra]);
        assert_eq!(apply(&mut g, vec![r]), 1);
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["/b/Sigmoid", "/b/Fused"]);
        assert!(g.nodes.iter().all(|n| n.scope == Some(last)));
        assert!(g.set_scope(Some(7)).is_err(), "an unknown scope is refused");
    }
}
