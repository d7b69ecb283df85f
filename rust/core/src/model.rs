//! The model around the main graph: opsets per domain, IR version, producer, metadata, the local
//! functions' bodies and the files referenced tensors point into. Apart from graph.rs so that the graph
//! does not depend on the local functions (functions.rs carves them and uses both).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::graph::{AttrValue, Graph, Node};
use crate::names::NameTable;
use crate::scopes::node_name_hint;

/// One local function: its body reads its inputs and constants only.
#[derive(Debug, Clone)]
pub struct Function {
    pub domain: String,
    pub name: String,
    /// The body. Its initializers are small constants, written as `Constant` nodes.
    pub graph: Graph,
}

/// The model around the graph: opsets per domain, IR version, producer.
#[derive(Debug, Clone)]
pub struct Model {
    pub graph: Graph,
    pub opsets: BTreeMap<String, i64>,
    pub ir_version: i64,
    pub producer_name: String,
    pub producer_version: String,
    /// ModelProto.metadata_props, in key order.
    pub metadata: BTreeMap<String, String>,
    /// Local functions (`export_modules_as_functions`), in the order they were made.
    pub functions: Vec<Function>,
    /// The files referenced tensors point into, by their `location` (see `TensorData::Referenced`): a
    /// save into another folder hard-links them beside the model.
    pub reference_sources: BTreeMap<String, PathBuf>,
    /// Write `GraphProto.value_info`: the element type and shape of every value the nodes of the main
    /// graph and of its subgraphs make, the builder's or inferred (`infer::Inferred`,
    /// `writer::value_info`). Off unless asked for (`to_onnx(value_info=True)`, its default).
    pub value_info: bool,
}

/// Every node of `g` and of its subgraphs, in graph order (a node before its subgraphs' nodes).
fn for_each_node_mut(g: &mut Graph, f: &mut impl FnMut(&mut Node)) {
    for n in &mut g.nodes {
        f(n);
        for a in &mut n.attrs {
            if let AttrValue::Graph(sub) = &mut a.value {
                for_each_node_mut(sub, f);
            }
        }
    }
}

impl Model {
    /// Names every node made in a scope `{prefix}/{op_type}` from its scope's (current) prefix, made
    /// unique with `_1`, `_2`... in graph order: the top graph with its subgraphs, then the local
    /// functions' bodies. Nodes without a scope keep their names (reserved first). fastonnx calls it
    /// once the passes are done and the prefixes set, so that the walk need not compute any prefix.
    pub fn name_nodes_by_scope(&mut self) {
        let scopes = self.graph.scopes.snapshot();
        let mut table = NameTable::with_capacity(self.graph.nodes.len());
        let mut reserve = |n: &mut Node| {
            if n.scope.is_none() {
                table.reserve(&n.name);
            }
        };
        for_each_node_mut(&mut self.graph, &mut reserve);
        for f in &mut self.functions {
            for_each_node_mut(&mut f.graph, &mut reserve);
        }
        let mut rename = |n: &mut Node| {
            if let Some(scope) = n.scope.and_then(|i| scopes.get(i as usize)) {
                n.name = table.unique_owned(node_name_hint(Some(scope), &n.op_type));
            }
        };
        for_each_node_mut(&mut self.graph, &mut rename);
        for f in &mut self.functions {
            for_each_node_mut(&mut f.graph, &mut rename);
        }
        self.graph.names.set_node_names(table);
    }

    pub fn new(opset: i64, ir_version: i64, producer_version: &str) -> Self {
        let mut opsets = BTreeMap::new();
        opsets.insert(String::new(), opset);
        Model {
            graph: Graph::new("main_graph"),
            opsets,
            ir_version,
            producer_name: "fastonnx".to_owned(),
            producer_version: producer_version.to_owned(),
            metadata: BTreeMap::new(),
            functions: Vec::new(),
            reference_sources: BTreeMap::new(),
            value_info: false,
        }
    }

    /// A builder for a subgraph: same names, same opsets; its graph is taken when used as an attribute.
    pub fn subgraph(&self, name: &str) -> Model {
        Model {
            graph: self.graph.subgraph(name),
            opsets: self.opsets.clone(),
            ir_version: self.ir_version,
            producer_name: self.producer_name.clone(),
            producer_version: self.producer_version.clone(),
            metadata: BTreeMap::new(),
            functions: Vec::new(),
            reference_sources: BTreeMap::new(),
            value_info: self.value_info,
        }
    }

    pub fn opset(&self) -> i64 {
        self.opsets.get("").copied().unwrap_or_default()
    }

    pub fn set_opset(&mut self, domain: &str, version: i64) {
        self.opsets.insert(domain.to_owned(), version);
    }

    /// Merges the opsets a subgraph used into this model's.
    pub fn merge_opsets(&mut self, other: &BTreeMap<String, i64>) {
        for (d, v) in other {
            self.opsets.entry(d.clone()).or_insert(*v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::graph::Attribute;

    #[test]
    fn nodes_are_named_from_their_scopes_prefix_after_the_fact() {
        let mut m = Model::new(18, 9, "test");
        let x = m.graph.add_input("x", dtype::FLOAT, None);
        // made outside any scope: keeps its name, which the scoped names then avoid
        m.graph
            .add_node(
                "Neg",
                "",
                vec![x.clone()],
                &["a".into()],
                vec![],
                Some("/fc/Relu"),
            )
            .expect("neg");
        let fc = m.graph.enter_new_scope();
        let mut body = m.graph.subgraph("body");
        body.set_scope(Some(fc)).expect("scope");
        body.add_node("Relu", "", vec![x.clone()], &["r".into()], vec![], None)
            .expect("body node");
        let attrs = vec![Attribute {
            name: "body".into(),
            value: AttrValue::Graph(Box::new(body)),
        }];
        m.graph
            .add_node("Loop", "", vec![x.clone()], &["l".into()], attrs, None)
            .expect("loop");
        let top = m.graph.enter_new_scope();
        m.graph
            .add_node("Relu", "", vec![x], &["t".into()], vec![], None)
            .expect("relu");
        assert!(m.graph.scopes.set_prefix(fc, "/fc".into()));
        assert!(!m.graph.scopes.set_prefix(9, "/none".into()));
        m.name_nodes_by_scope();
        let names: Vec<&str> = m.graph.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["/fc/Relu", "/fc/Loop", "/Relu"]);
        let Some(AttrValue::Graph(body)) = m.graph.nodes[1].attrs.first().map(|a| &a.value) else {
            panic!("the loop lost its body");
        };
        // unique across the graph and its subgraphs, in graph order
        assert_eq!(body.nodes[0].name, "/fc/Relu_1");
        assert_eq!(m.graph.scopes.get(top).expect("top").prefix, "");
        // names made later stay unique
        assert_eq!(m.graph.names.unique_node("/Relu"), "/Relu_1");
    }
}
