//! Module instances carved out of the converted graph as ONNX local functions
//! (`to_onnx(export_modules_as_functions=...)`).
//!
//! The caller (Python, which knows each node's FX module stack) gives every node of the top graph the
//! path of module instances it belongs to, outermost first. After conversion and before optimization,
//! each instance's nodes become one body graph whose inputs are the values crossing into it (weights and
//! activations alike; small constants are copied in) and whose outputs are the values read outside;
//! the nodes are replaced by one call. Nested instances are carved inside their parent's body.
//! Bodies with the same structure (see [`structural_key`]) share one function: the passes then run
//! once per function and once on the main graph, so no fusion crosses a call boundary.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use crate::error::{graph_err, Result};
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::model::{Function, Model};
use crate::scopes::node_name_hint;
use crate::tensor::TensorData;

/// A module instance the caller wants as a call.
#[derive(Debug, Clone)]
pub struct Instance {
    /// `pkg.transformers`
    pub domain: String,
    /// `LlamaDecoderLayer`: the function's name (made distinct per distinct body)
    pub class_name: String,
    /// The scope of the call node (its name and metadata), None without metadata.
    pub scope: Option<u32>,
    /// How messages name the instance: `model.layers.0 (LlamaDecoderLayer)`.
    pub label: String,
}

/// What the carving did.
#[derive(Debug, Default, Clone)]
pub struct Carved {
    pub calls: usize,
    /// One message per instance left inline (its nodes cannot form one call).
    pub inlined: Vec<String>,
}

/// Owned constants up to this size read in a body are copied into it (Constant nodes); larger ones,
/// and every weight, are function inputs.
const CONSTANT_COPY_LIMIT: usize = 1 << 16;

/// Every local function's domain starts so (`pkg.transformers`): the passes know a call by it.
pub const DOMAIN_PREFIX: &str = "pkg.";

/// The version of the functions' own domains in the opset imports.
pub const FUNCTION_DOMAIN_VERSION: i64 = 1;

struct Carver<'a> {
    instances: &'a [Instance],
    functions: Vec<Function>,
    by_key: HashMap<String, usize>,
    carved: Carved,
}

/// Carves the instances out of `model`'s graph. `paths[i]` is the path of node `i` of the top graph
/// (instance indices into `instances`, outermost first; empty: the node stays in the main graph).
pub fn extract_functions(
    model: &mut Model,
    paths: Vec<Vec<u32>>,
    instances: &[Instance],
) -> Result<Carved> {
    if paths.len() != model.graph.nodes.len() {
        return Err(graph_err(format!(
            "export_modules_as_functions: {} module paths given for {} nodes",
            paths.len(),
            model.graph.nodes.len()
        )));
    }
    if let Some(bad) = instances
        .iter()
        .find(|i| !i.domain.starts_with(DOMAIN_PREFIX))
    {
        return Err(graph_err(format!(
            "export_modules_as_functions: the domain of {} must start with {DOMAIN_PREFIX:?}",
            bad.label
        )));
    }
    if let Some(bad) = paths
        .iter()
        .flatten()
        .find(|&&i| i as usize >= instances.len())
    {
        return Err(graph_err(format!(
            "export_modules_as_functions: instance {bad} of {} does not exist",
            instances.len()
        )));
    }
    let mut carver = Carver {
        instances,
        functions: Vec::new(),
        by_key: HashMap::new(),
        carved: Carved::default(),
    };
    carver.carve(&mut model.graph, paths, 0)?;
    if carver.carved.calls > 0 {
        // constants now copied into bodies and read nowhere else in the main graph
        let g = &model.graph;
        let mut read: HashSet<String> = g.outputs.iter().cloned().collect();
        for n in &g.nodes {
            read.extend(reads(n).into_iter().map(str::to_owned));
        }
        let copied: HashSet<String> = carver
            .functions
            .iter()
            .flat_map(|f| f.graph.initializers.iter().map(|t| t.name.clone()))
            .collect();
        model
            .graph
            .retain_initializers(|n| read.contains(n) || !copied.contains(n));
    }
    for f in &carver.functions {
        model
            .opsets
            .entry(f.domain.clone())
            .or_insert(FUNCTION_DOMAIN_VERSION);
    }
    model.functions.extend(carver.functions);
    Ok(carver.carved)
}

/// Every name a node reads: its inputs, and the outer values its subgraphs read.
fn reads(node: &Node) -> Vec<&str> {
    let mut out: Vec<&str> = node
        .inputs
        .iter()
        .filter(|s| !s.is_empty())
        .map(String::as_str)
        .collect();
    for g in node.subgraphs() {
        outer_reads(g, &mut out);
    }
    out
}

fn outer_reads<'g>(g: &'g Graph, out: &mut Vec<&'g str>) {
    let mut defined: HashSet<&str> = g.inputs.iter().map(String::as_str).collect();
    defined.extend(g.initializers.iter().map(|t| t.name.as_str()));
    for n in &g.nodes {
        defined.extend(n.outputs.iter().map(String::as_str));
    }
    for n in &g.nodes {
        for r in reads(n) {
            if !defined.contains(r) {
                out.push(r);
            }
        }
    }
    out.extend(
        g.outputs
            .iter()
            .map(String::as_str)
            .filter(|o| !defined.contains(o)),
    );
}

impl Carver<'_> {
    fn carve(&mut self, graph: &mut Graph, mut paths: Vec<Vec<u32>>, depth: usize) -> Result<()> {
        // a Transpose of a weight stays outside the body: the call passes the weight transposed, and
        // the main graph's passes store it so (no call transposes at run time)
        for (node, path) in graph.nodes.iter().zip(paths.iter_mut()) {
            if node.op_type == "Transpose"
                && node.domain.is_empty()
                && path.len() > depth
                && node.inputs.first().is_some_and(|i| graph.is_initializer(i))
            {
                path.truncate(depth);
            }
        }
        let mut order: Vec<u32> = Vec::new();
        let mut seen = HashSet::new();
        for p in &paths {
            if let Some(&i) = p.get(depth) {
                if seen.insert(i) {
                    order.push(i);
                }
            }
        }
        // how often each value is read in this graph (outputs count): kept up to date per call, so
        // that each instance finds the values read outside it without a walk over the whole graph
        let mut readers: HashMap<String, usize> = HashMap::new();
        for o in &graph.outputs {
            *readers.entry(o.clone()).or_default() += 1;
        }
        for n in &graph.nodes {
            for r in reads(n) {
                *readers.entry(r.to_owned()).or_default() += 1;
            }
        }
        for inst in order {
            self.carve_instance(graph, &mut paths, depth, inst, &mut readers)?;
        }
        Ok(())
    }

    fn carve_instance(
        &mut self,
        graph: &mut Graph,
        paths: &mut Vec<Vec<u32>>,
        depth: usize,
        inst: u32,
        readers: &mut HashMap<String, usize>,
    ) -> Result<()> {
        let members: Vec<usize> = (0..paths.len())
            .filter(|&i| paths[i].get(depth) == Some(&inst))
            .collect();
        let (Some(&first), Some(&last)) = (members.first(), members.last()) else {
            return Ok(());
        };
        let in_s: HashSet<usize> = members.iter().copied().collect();
        let defined: HashSet<String> = members
            .iter()
            .flat_map(|&i| {
                graph.nodes[i]
                    .outputs
                    .iter()
                    .filter(|o| !o.is_empty())
                    .cloned()
            })
            .collect();
        // convexity: no node outside the set may read the set's values and feed it
        let mut tainted_values: HashSet<&str> = HashSet::new();
        let mut after: HashSet<usize> = HashSet::new();
        let mut convex = true;
        for j in first..=last {
            let node = &graph.nodes[j];
            let r = reads(node);
            if in_s.contains(&j) {
                if r.iter().any(|v| tainted_values.contains(v)) {
                    convex = false;
                    break;
                }
            } else if r
                .iter()
                .any(|v| defined.contains(*v) || tainted_values.contains(v))
            {
                after.insert(j);
                tainted_values.extend(node.outputs.iter().map(String::as_str));
            }
        }
        let info = &self.instances[inst as usize];
        if !convex {
            self.carved.inlined.push(format!(
                "{}: a value computed inside it is needed, through nodes outside it, by its own later \
                 nodes, so its nodes cannot form one call; left inline",
                info.label
            ));
            for &i in &members {
                paths[i].truncate(depth);
            }
            return Ok(());
        }

        // the body: inputs in order of first read, outputs in order of definition
        let mut body = graph.subgraph(&format!("{}_body", info.class_name));
        let mut input_seen: HashSet<&str> = HashSet::new();
        for &i in &members {
            for r in reads(&graph.nodes[i]) {
                if defined.contains(r) || !input_seen.insert(r) {
                    continue;
                }
                let small_constant = graph.initializer(r).filter(|t| {
                    matches!(t.data, TensorData::Owned(_)) && t.data.len() <= CONSTANT_COPY_LIMIT
                });
                if let Some(t) = small_constant {
                    body.insert_initializer(t.clone());
                } else {
                    body.inputs.push(r.to_owned());
                    if let Some(ty) = graph.types.get(r) {
                        body.types.insert(r.to_owned(), ty.clone());
                    }
                }
            }
        }
        let mut read_inside: HashMap<&str, usize> = HashMap::new();
        for &i in &members {
            for r in reads(&graph.nodes[i]) {
                *read_inside.entry(r).or_default() += 1;
            }
        }
        let read_outside = |v: &str| {
            readers.get(v).copied().unwrap_or(0) > read_inside.get(v).copied().unwrap_or(0)
        };
        for &i in &members {
            for o in &graph.nodes[i].outputs {
                if o.is_empty() {
                    continue;
                }
                if let Some(ty) = graph.types.get(o) {
                    body.types.insert(o.clone(), ty.clone());
                }
                if read_outside(o) {
                    body.outputs.push(o.clone());
                }
            }
        }
        if body.outputs.is_empty() {
            // nothing it computes is read: a call without outputs is no function; left as it is
            // (the passes remove the unused nodes)
            for &i in &members {
                paths[i].truncate(depth);
            }
            return Ok(());
        }
        let call_inputs = body.inputs.clone();
        let call_outputs = body.outputs.clone();
        // the members' reads become the call's
        for (v, k) in read_inside {
            if let Some(c) = readers.get_mut(v) {
                *c -= k.min(*c);
            }
        }
        for v in &call_inputs {
            *readers.entry(v.clone()).or_default() += 1;
        }

        // take the nodes out: before | outside, independent | call | outside, reading the set | rest
        let old_nodes = std::mem::take(&mut graph.nodes);
        let old_paths = std::mem::take(paths);
        let mut body_paths = Vec::with_capacity(members.len());
        let mut independent = Vec::new();
        let mut dependent = Vec::new();
        let mut rest = Vec::new();
        for (j, (node, path)) in old_nodes.into_iter().zip(old_paths).enumerate() {
            if in_s.contains(&j) {
                body.nodes.push(node);
                body_paths.push(path);
            } else if j < first {
                graph.nodes.push(node);
                paths.push(path);
            } else if j > last {
                rest.push((node, path));
            } else if after.contains(&j) {
                dependent.push((node, path));
            } else {
                independent.push((node, path));
            }
        }
        for (node, path) in independent {
            graph.nodes.push(node);
            paths.push(path);
        }
        let call_at = graph.nodes.len();
        for (node, path) in dependent.into_iter().chain(rest) {
            graph.nodes.push(node);
            paths.push(path);
        }

        self.carve(&mut body, body_paths, depth + 1)?;
        let key = format!(
            "{}\u{0}{}\u{0}{}",
            info.domain,
            info.class_name,
            structural_key(&body)
        );
        let index = if let Some(&f) = self.by_key.get(&key) {
            f
        } else {
            let name = self.distinct_name(&info.domain, &info.class_name);
            body.name.clone_from(&name);
            self.functions.push(Function {
                domain: info.domain.clone(),
                name,
                graph: body,
            });
            self.by_key.insert(key, self.functions.len() - 1);
            self.functions.len() - 1
        };
        let f = &self.functions[index];
        let scope = info.scope.and_then(|i| graph.scopes.get(i).map(|s| (i, s)));
        let name = graph.names.unique_node(&node_name_hint(
            scope.as_ref().map(|s| s.1.as_ref()),
            &f.name,
        ));
        graph.nodes.insert(
            call_at,
            Node {
                name,
                op_type: f.name.clone(),
                domain: f.domain.clone(),
                inputs: call_inputs,
                outputs: call_outputs,
                attrs: Vec::new(),
                scope: scope.map(|s| s.0),
            },
        );
        paths.insert(call_at, Vec::new());
        self.carved.calls += 1;
        Ok(())
    }

    /// The class name, or `Class_1`, `Class_2`... when another body of that class took it.
    fn distinct_name(&self, domain: &str, class_name: &str) -> String {
        let taken = |n: &str| {
            self.functions
                .iter()
                .any(|f| f.domain == domain && f.name == n)
        };
        if !taken(class_name) {
            return class_name.to_owned();
        }
        // at most one name per function is taken: one of these is free
        (1..=self.functions.len() + 1)
            .map(|k| format!("{class_name}_{k}"))
            .find(|n| !taken(n))
            .unwrap_or_default()
    }
}

fn dims_key(out: &mut String, shape: Option<&Vec<Dim>>) {
    match shape {
        None => out.push('?'),
        Some(dims) => {
            out.push('[');
            for d in dims {
                match d {
                    Dim::Fixed(v) => {
                        let _ = write!(out, "{v},");
                    }
                    Dim::Sym(s) => {
                        let _ = write!(out, "{s:?},");
                    }
                    Dim::Unknown => out.push_str("?,"),
                }
            }
            out.push(']');
        }
    }
}

/// What makes two bodies the same function: their inputs' types, their constants' contents, and
/// every node's op, domain, attributes, wiring (inputs and outputs as positions, not names) and output
/// types. Computed before optimization, so that each distinct body is optimized once. Bodies holding
/// If / Loop / Scan subgraphs are never shared (their subgraphs read values by name).
pub fn structural_key(body: &Graph) -> String {
    let mut local: HashMap<&str, String> = HashMap::new();
    let mut out = String::new();
    for (k, name) in body.inputs.iter().enumerate() {
        let ty = body.types.get(name);
        let _ = write!(out, "i{k}:{:?}", ty.and_then(|t| t.dtype));
        dims_key(&mut out, ty.and_then(|t| t.shape.as_ref()));
        out.push(';');
        local.insert(name, format!("i{k}"));
    }
    for (k, t) in body.initializers.iter().enumerate() {
        let _ = write!(out, "c{k}:{}:{:?}:{:?};", t.dtype, t.dims, t.data.to_vec());
        local.insert(&t.name, format!("c{k}"));
    }
    for (j, n) in body.nodes.iter().enumerate() {
        let _ = write!(out, "|{}:{}(", n.domain, n.op_type);
        for i in &n.inputs {
            let _ = write!(
                out,
                "{},",
                local.get(i.as_str()).map_or("-", String::as_str)
            );
        }
        out.push(')');
        for a in &n.attrs {
            let _ = write!(out, "{}=", a.name);
            match &a.value {
                AttrValue::Int(v) => {
                    let _ = write!(out, "{v}");
                }
                AttrValue::Float(v) => {
                    let _ = write!(out, "f{}", v.to_bits());
                }
                AttrValue::String(v) => {
                    let _ = write!(out, "{v:?}");
                }
                AttrValue::Ints(v) => {
                    let _ = write!(out, "{v:?}");
                }
                AttrValue::Floats(v) => {
                    let bits: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
                    let _ = write!(out, "{bits:?}");
                }
                AttrValue::Strings(v) => {
                    let _ = write!(out, "{v:?}");
                }
                AttrValue::Tensor(t) => {
                    let _ = write!(out, "t{}:{:?}:{:?}", t.dtype, t.dims, t.data.to_vec());
                }
                // subgraphs read outer values by name: a body holding one is its own function
                AttrValue::Graph(g) => {
                    let _ = write!(out, "g{:p}", g.as_ref());
                }
            }
            out.push(',');
        }
        for (k, o) in n.outputs.iter().enumerate() {
            let ty = body.types.get(o);
            let _ = write!(out, "o{k}:{:?}", ty.and_then(|t| t.dtype));
            dims_key(&mut out, ty.and_then(|t| t.shape.as_ref()));
            local.insert(o, format!("n{j}.{k}"));
        }
    }
    out.push_str("|out:");
    for o in &body.outputs {
        let _ = write!(
            out,
            "{},",
            local.get(o.as_str()).map_or("-", String::as_str)
        );
    }
    out
}

/// The domains (with versions) a function's nodes use, for its `opset_import`: the model's version of
/// each, the functions' own domains at [`FUNCTION_DOMAIN_VERSION`].
pub fn function_opsets(
    f: &Function,
    model_opsets: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    fn walk(g: &Graph, out: &mut HashSet<String>) {
        for n in &g.nodes {
            out.insert(n.domain.clone());
            for s in n.subgraphs() {
                walk(s, out);
            }
        }
    }
    let mut used = HashSet::new();
    used.insert(String::new());
    if !f.graph.initializers.is_empty() {
        used.insert(String::new());
    }
    walk(&f.graph, &mut used);
    used.into_iter()
        .map(|d| {
            let v = model_opsets
                .get(&d)
                .copied()
                .unwrap_or(FUNCTION_DOMAIN_VERSION);
            (d, v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype;
    use crate::graph::ValueType;

    fn instance(name: &str) -> Instance {
        Instance {
            domain: "pkg.test".into(),
            class_name: name.into(),
            scope: None,
            label: format!("m ({name})"),
        }
    }

    fn relu_chain(g: &mut Graph, x: &str, n: usize) -> String {
        let mut v = x.to_owned();
        for _ in 0..n {
            v = g
                .add_node("Relu", "", vec![v], &["r".into()], vec![], None)
                .expect("relu")
                .remove(0);
            // as the walker does: torch's type on every value
            let ty = ValueType {
                dtype: Some(dtype::FLOAT),
                shape: Some(vec![Dim::Fixed(2)]),
                sequence: false,
            };
            g.set_type(&v, ty).expect("type");
        }
        v
    }

    #[test]
    fn same_bodies_share_one_function_and_others_get_their_own() {
        let mut m = Model::new(20, 10, "");
        let x = m
            .graph
            .add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2)]));
        let a = relu_chain(&mut m.graph, &x, 2);
        let b = relu_chain(&mut m.graph, &a, 2);
        let c = relu_chain(&mut m.graph, &b, 3);
        m.graph.add_output(&c, Some("y")).expect("out");
        let paths = vec![
            vec![0],
            vec![0],
            vec![1],
            vec![1],
            vec![2],
            vec![2],
            vec![2],
        ];
        let carved = extract_functions(
            &mut m,
            paths,
            &[instance("Block"), instance("Block"), instance("Block")],
        )
        .expect("carve");
        assert_eq!(carved.calls, 3);
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["Block", "Block_1"]);
        let calls: Vec<&str> = m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(calls, ["Block", "Block", "Block_1"]);
        assert_eq!(m.opsets.get("pkg.test"), Some(&1));
    }

    #[test]
    fn a_set_that_is_not_convex_stays_inline() {
        let mut m = Model::new(20, 10, "");
        let x = m.graph.add_input("x", dtype::FLOAT, None);
        let a = relu_chain(&mut m.graph, &x, 1);
        let b = relu_chain(&mut m.graph, &a, 1); // outside, between the two members
        let c = relu_chain(&mut m.graph, &b, 1);
        m.graph.add_output(&c, None).expect("out");
        let carved = extract_functions(&mut m, vec![vec![0], vec![], vec![0]], &[instance("B")])
            .expect("carve");
        assert_eq!(carved.calls, 0);
        assert_eq!(carved.inlined.len(), 1);
        assert!(carved.inlined[0].contains("m (B)"), "{:?}", carved.inlined);
        assert_eq!(m.graph.nodes.len(), 3);
        assert!(m.functions.is_empty());
    }

    #[test]
    fn an_instance_whose_values_nobody_reads_stays_as_it_is() {
        let mut m = Model::new(20, 10, "");
        let x = m
            .graph
            .add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2)]));
        relu_chain(&mut m.graph, &x, 2); // read by nobody
        let y = relu_chain(&mut m.graph, &x, 1);
        m.graph.add_output(&y, None).expect("out");
        let paths = vec![vec![0], vec![0], vec![1]];
        let carved =
            extract_functions(&mut m, paths, &[instance("Dead"), instance("Live")]).expect("carve");
        assert_eq!(carved.calls, 1);
        assert!(carved.inlined.is_empty());
        let ops: Vec<&str> = m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Relu", "Relu", "Live"]);
        assert_eq!(m.functions.len(), 1);
    }

    #[test]
    fn a_weight_transpose_stays_at_the_call_site() {
        let mut m = Model::new(20, 10, "");
        let x = m
            .graph
            .add_input("x", dtype::FLOAT, Some(vec![Dim::Fixed(2)]));
        let w = m
            .graph
            .add_initializer(
                "w",
                dtype::FLOAT,
                vec![2, 2],
                TensorData::Owned(vec![0; 16]),
                None,
            )
            .expect("w");
        let t = m
            .graph
            .add_node(
                "Transpose",
                "",
                vec![w.clone()],
                &["wt".into()],
                vec![],
                None,
            )
            .expect("t")
            .remove(0);
        let y = m
            .graph
            .add_node(
                "MatMul",
                "",
                vec![x, t.clone()],
                &["y".into()],
                vec![],
                None,
            )
            .expect("mm")
            .remove(0);
        m.graph.add_output(&y, None).expect("out");
        extract_functions(&mut m, vec![vec![0], vec![0]], &[instance("Lin")]).expect("carve");
        let ops: Vec<&str> = m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Transpose", "Lin"]);
        assert_eq!(
            m.graph.nodes[1].inputs[1], t,
            "the call reads the transposed weight"
        );
        assert_eq!(m.functions[0].graph.nodes.len(), 1);
    }

    #[test]
    fn bad_paths_are_errors() {
        let mut m = Model::new(20, 10, "");
        let x = m.graph.add_input("x", dtype::FLOAT, None);
        relu_chain(&mut m.graph, &x, 1);
        let err = extract_functions(&mut m, vec![], &[]).expect_err("length");
        assert!(
            err.to_string().contains("0 module paths given for 1 nodes"),
            "{err}"
        );
        let err = extract_functions(&mut m, vec![vec![3]], &[]).expect_err("index");
        assert!(err.to_string().contains("instance 3"), "{err}");
    }
}
