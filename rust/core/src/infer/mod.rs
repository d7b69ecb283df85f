//! The types of the values the builder does not know (issue 39): every value a node makes gets an
//! element type and its full rank in `value_info`, also where a converter or a pass made it without
//! declaring one (the pieces of an op's decomposition, shape arithmetic, fused and contrib nodes,
//! local functions' call sites).
//!
//! [`Inferred::of`] walks the model once, in node order, the subgraphs (If / Loop / Scan bodies) with
//! their nodes: a node whose outputs all have a complete type (element type, every dim known: torch's
//! types, declared by the walker and the passes) is passed over; the others get theirs from an
//! operator rule (`ops.rs`: ONNX's operator definitions), their inputs' types and the contents of
//! their small integer inputs. Those contents (shape tensors: `Shape`, `Gather`, `Concat`, integer
//! constants and arithmetic) are followed through the graph as sizes ([`poly::Poly`]), so that a
//! `Reshape` or `Expand` by a computed shape gets the sizes the graph inputs' dims imply, named by
//! them (`batch`, `2*seq`). A call of a local function gets the types of the function body's outputs,
//! the body walked with the call's input types (its own types where they are the same). A type the
//! builder holds stays as it is; an unknown dim of it is filled where the rule knows it.
//!
//! The writer reads the result beside the builder's types (`writer/value_info.rs`); nothing in the
//! model changes.

mod ops;
mod poly;

use std::collections::HashMap;

use ops::{Inputs, Size, Ty};
use poly::Poly;

use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node, ValueType};
use crate::model::{Function, Model};
use crate::tensor::Tensor;

type Map<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// Tensors with at most this many elements have their contents followed (shape tensors).
const MAX_CONTENTS: usize = 64;

/// Function bodies nested deeper than this are not walked (a body calling itself).
const MAX_DEPTH: usize = 16;

/// The types the inference found for values whose type the builder does not hold complete.
#[derive(Debug, Default)]
pub struct Inferred {
    types: Map<ValueType>,
}

impl Inferred {
    /// The types of the values of `m`'s graph and subgraphs the builder does not know completely.
    pub fn of(m: &Model) -> Inferred {
        let mut e = Engine::new(&m.functions, 0);
        e.graph(&Frame {
            graph: &m.graph,
            trust: true,
            parent: None,
        });
        Inferred { types: e.types }
    }

    /// What was found for `name`: its element type, its shape where known (an unknown dim stays
    /// `Dim::Unknown`).
    pub fn get(&self, name: &str) -> Option<&ValueType> {
        self.types.get(name)
    }

    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// The type `g` holds for `name` when complete, else the one found here, else `g`'s.
    pub fn type_of<'a>(&'a self, g: &'a Graph, name: &str) -> Option<&'a ValueType> {
        match g.value_type(name) {
            Some(t) if complete(t) => Some(t),
            stored => self.types.get(name).or(stored),
        }
    }
}

/// An element type and every dim known.
pub(crate) fn complete(t: &ValueType) -> bool {
    t.dtype.is_some_and(|d| d > 0)
        && t.shape
            .as_ref()
            .is_some_and(|s| !s.iter().any(|d| matches!(d, Dim::Unknown)))
}

/// A graph being walked, inside the graphs it is a subgraph of. Not `trust`ed: a local function's body
/// walked for a call on other types than its own, whose values' stored types are not the call's.
struct Frame<'g> {
    graph: &'g Graph,
    trust: bool,
    parent: Option<&'g Frame<'g>>,
}

impl<'g> Frame<'g> {
    /// The type a graph holds for `name` (a value of this graph or an enclosing one).
    fn stored(&self, name: &str) -> Option<&'g ValueType> {
        let mut f = Some(self);
        while let Some(fr) = f {
            if let Some(t) = fr.graph.types.get(name) {
                if fr.trust
                    || fr.graph.is_initializer(name)
                    || fr.graph.inputs.iter().any(|i| i == name)
                {
                    return Some(t);
                }
            }
            f = fr.parent;
        }
        None
    }

    fn initializer(&self, name: &str) -> Option<&'g Tensor> {
        let mut f = Some(self);
        while let Some(fr) = f {
            if let Some(t) = fr.graph.initializer(name) {
                return Some(t);
            }
            f = fr.parent;
        }
        None
    }
}

struct Engine<'m> {
    functions: &'m [Function],
    depth: usize,
    types: Map<ValueType>,
    values: Map<Vec<Size>>,
    /// a function call's output types, by function and input types
    calls: HashMap<String, Vec<Option<ValueType>>>,
}

fn to_ty(t: Option<&ValueType>) -> Ty {
    match t {
        Some(t) => Ty::new(
            t.dtype.filter(|&d| d > 0),
            t.shape
                .as_ref()
                .map(|s| s.iter().map(Poly::from_dim).collect()),
        ),
        None => Ty::default(),
    }
}

fn to_dim(s: &Size) -> Dim {
    s.as_ref().map_or(Dim::Unknown, Poly::to_dim)
}

/// The builder's type with what the rule found where it knows nothing (its rank wins). A sequence's
/// stored type is its elements': no rule here speaks of sequences, it stays as it is.
fn merge(stored: Option<&ValueType>, found: &Ty) -> ValueType {
    if let Some(t) = stored.filter(|t| t.sequence) {
        return t.clone();
    }
    let dtype = stored
        .and_then(|t| t.dtype)
        .filter(|&d| d > 0)
        .or(found.dtype);
    let shape = match (stored.and_then(|t| t.shape.as_ref()), &found.dims) {
        (Some(s), Some(f)) if s.len() == f.len() => Some(
            s.iter()
                .zip(f)
                .map(|(a, b)| match a {
                    Dim::Unknown => to_dim(b),
                    _ => a.clone(),
                })
                .collect(),
        ),
        (Some(s), _) => Some(s.clone()),
        (None, Some(f)) => Some(f.iter().map(to_dim).collect()),
        (None, None) => None,
    };
    ValueType {
        dtype,
        shape,
        sequence: false,
    }
}

/// The contents of a small integer tensor (None for others).
pub(super) fn tensor_ints(t: &Tensor) -> Option<Vec<Size>> {
    let bytes = t.data.as_slice()?;
    if t.dims.len() > 1 || t.dims.iter().product::<i64>() > MAX_CONTENTS as i64 {
        return None;
    }
    let v: Vec<i64> = match t.dtype {
        dtype::INT64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        dtype::INT32 => bytes
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
            .collect(),
        _ => return None,
    };
    Some(v.into_iter().map(|c| Some(Poly::constant(c))).collect())
}

/// The contents of a small float tensor (Resize's scales).
fn tensor_floats(t: &Tensor) -> Option<Vec<f32>> {
    let bytes = t.data.as_slice()?;
    if t.dtype != dtype::FLOAT || t.dims.len() != 1 || t.dims[0] > MAX_CONTENTS as i64 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            .collect(),
    )
}

/// Ops whose integer results [`ops::value`] computes.
fn computes_contents(op: &str) -> bool {
    matches!(
        op,
        "Shape"
            | "Size"
            | "Identity"
            | "Reshape"
            | "Squeeze"
            | "Unsqueeze"
            | "Flatten"
            | "Cast"
            | "Concat"
            | "Gather"
            | "Slice"
            | "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Max"
            | "Neg"
            | "Constant"
    )
}

/// A small integer tensor: its contents are worth following.
fn holds_sizes(t: &ValueType) -> bool {
    matches!(t.dtype, Some(dtype::INT64 | dtype::INT32))
        && t.shape.as_ref().is_some_and(|s| match s.as_slice() {
            [] => true,
            [Dim::Fixed(n)] => *n as usize <= MAX_CONTENTS,
            [_] => true,
            _ => false,
        })
}

/// A type that may turn out to be a small integer tensor's, once inferred.
fn may_hold_sizes(t: &ValueType) -> bool {
    t.dtype
        .is_none_or(|d| d == dtype::INT64 || d == dtype::INT32)
        && t.shape.as_ref().is_none_or(|s| s.len() <= 1)
}

impl<'m> Engine<'m> {
    fn new(functions: &'m [Function], depth: usize) -> Engine<'m> {
        Engine {
            functions,
            depth,
            types: Map::default(),
            values: Map::default(),
            calls: HashMap::new(),
        }
    }

    fn graph(&mut self, frame: &Frame) {
        for n in &frame.graph.nodes {
            self.node(frame, n);
        }
    }

    fn type_of<'a>(&'a self, frame: &Frame<'a>, name: &str) -> Option<&'a ValueType> {
        self.types.get(name).or_else(|| frame.stored(name))
    }

    fn contents(&self, frame: &Frame, name: &str) -> Option<Vec<Size>> {
        if name.is_empty() {
            return None;
        }
        if let Some(v) = self.values.get(name) {
            return Some(v.clone());
        }
        tensor_ints(frame.initializer(name)?)
    }

    fn inputs<'n>(&self, frame: &Frame, n: &'n Node) -> Inputs<'n> {
        let types = n
            .inputs
            .iter()
            .map(|i| {
                if i.is_empty() {
                    Ty::default()
                } else {
                    to_ty(self.type_of(frame, i))
                }
            })
            .collect();
        let values = n.inputs.iter().map(|i| self.contents(frame, i)).collect();
        let floats = if n.op_type == "Resize" || n.op_type == "Upsample" {
            n.inputs
                .iter()
                .map(|i| frame.initializer(i).and_then(tensor_floats))
                .collect()
        } else {
            Vec::new()
        };
        Inputs {
            node: n,
            types,
            values,
            floats,
        }
    }

    fn node(&mut self, frame: &Frame, n: &Node) {
        let has_sub = n
            .attrs
            .iter()
            .any(|a| matches!(a.value, AttrValue::Graph(_)));
        let known = n
            .outputs
            .iter()
            .all(|o| o.is_empty() || frame.stored(o).is_some_and(complete));
        let sizes = n.domain.is_empty()
            && computes_contents(&n.op_type)
            && n.outputs
                .first()
                .and_then(|o| self.type_of(frame, o))
                .is_none_or(may_hold_sizes);
        if known && !sizes && !has_sub {
            return;
        }
        let x = self.inputs(frame, n);
        // the rules speak of tensors: a node reading a sequence gets nothing from them
        let reads_sequence = n
            .inputs
            .iter()
            .any(|i| !i.is_empty() && self.type_of(frame, i).is_some_and(|t| t.sequence));
        let found = if has_sub {
            self.subgraphs(frame, n, &x)
        } else if !known && !reads_sequence {
            match self.function(n) {
                Some(f) => self.call(f, &x),
                None => ops::infer(&x),
            }
        } else {
            Vec::new()
        };
        if !known {
            for (o, f) in n.outputs.iter().zip(&found) {
                if o.is_empty() {
                    continue;
                }
                let stored = frame.stored(o);
                if stored.is_some_and(complete) {
                    continue;
                }
                let t = merge(stored, f);
                if t.dtype.is_some() || t.shape.is_some() {
                    self.types.insert(o.clone(), t);
                }
            }
        }
        if sizes {
            let Some(out) = n.outputs.first().filter(|o| !o.is_empty()) else {
                return;
            };
            if self.type_of(frame, out).is_some_and(holds_sizes) {
                if let Some(v) = ops::value(&x) {
                    self.values.insert(out.clone(), v);
                }
            }
        }
    }

    fn function(&self, n: &Node) -> Option<&'m Function> {
        if n.domain.is_empty() || n.domain == "com.microsoft" {
            return None;
        }
        self.functions
            .iter()
            .find(|f| f.domain == n.domain && f.name == n.op_type)
    }

    /// The output types of a call of `f` on inputs of the types `x` holds.
    fn call(&mut self, f: &'m Function, x: &Inputs) -> Vec<Ty> {
        if self.depth >= MAX_DEPTH {
            return Vec::new();
        }
        let body = &f.graph;
        let actual: Vec<ValueType> = x
            .types
            .iter()
            .map(|t| ValueType {
                dtype: t.dtype,
                shape: t.dims.as_ref().map(|d| d.iter().map(to_dim).collect()),
                sequence: false,
            })
            .collect();
        // the body's own types hold when the call's inputs have them
        let same = body.inputs.len() == actual.len()
            && body
                .inputs
                .iter()
                .zip(&actual)
                .all(|(i, t)| body.value_type(i) == Some(t));
        let key = format!("{}.{}:{same}:{actual:?}", f.domain, f.name);
        if let Some(found) = self.calls.get(&key) {
            return found.iter().map(|t| to_ty(t.as_ref())).collect();
        }
        let mut e = Engine::new(self.functions, self.depth + 1);
        if !same {
            for (i, t) in body.inputs.iter().zip(&actual) {
                e.types.insert(i.clone(), t.clone());
            }
            for (i, v) in body.inputs.iter().zip(&x.values) {
                if let Some(v) = v {
                    e.values.insert(i.clone(), v.clone());
                }
            }
        }
        let frame = Frame {
            graph: body,
            trust: same,
            parent: None,
        };
        e.graph(&frame);
        let found: Vec<Option<ValueType>> = body
            .outputs
            .iter()
            .map(|o| e.type_of(&frame, o).cloned())
            .collect();
        let out = found.iter().map(|t| to_ty(t.as_ref())).collect();
        self.calls.insert(key, found);
        out
    }

    /// Walks a node's subgraphs; the output types of If, Loop and Scan from their bodies' outputs.
    fn subgraphs(&mut self, frame: &Frame, n: &Node, x: &Inputs) -> Vec<Ty> {
        let mut bodies: Vec<(&str, Vec<Ty>)> = Vec::new();
        for a in &n.attrs {
            if let AttrValue::Graph(g) = &a.value {
                let child = Frame {
                    graph: g,
                    trust: frame.trust,
                    parent: Some(frame),
                };
                self.graph(&child);
                let outs = g
                    .outputs
                    .iter()
                    .map(|o| to_ty(self.type_of(&child, o)))
                    .collect();
                bodies.push((a.name.as_str(), outs));
            }
        }
        let body = |name: &str| bodies.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
        match (n.domain.as_str(), n.op_type.as_str()) {
            ("", "If") => match (body("then_branch"), body("else_branch")) {
                (Some(a), Some(b)) => a.iter().zip(b).map(|(p, q)| either(p, q)).collect(),
                _ => Vec::new(),
            },
            ("", "Loop") => {
                let Some(outs) = body("body") else {
                    return Vec::new();
                };
                // body outputs: condition, the N loop-carried values, the K scanned ones
                let carried = x.types.len().saturating_sub(2);
                let trips = x
                    .values
                    .first()
                    .cloned()
                    .flatten()
                    .and_then(|v| v.first().cloned().flatten());
                let mut v: Vec<Ty> = (0..carried)
                    .map(|i| {
                        let out = outs.get(i + 1).cloned().unwrap_or_default();
                        either(&x.types[i + 2], &out)
                    })
                    .collect();
                v.extend(
                    outs.iter()
                        .skip(1 + carried)
                        .map(|t| stacked(t, trips.clone())),
                );
                v
            }
            ("", "Scan") => {
                let Some(outs) = body("body") else {
                    return Vec::new();
                };
                let scans = usize::try_from(match n.attr("num_scan_inputs") {
                    Some(AttrValue::Int(k)) => *k,
                    _ => 0,
                })
                .unwrap_or(0);
                let states = x.types.len().saturating_sub(scans);
                let axis0 = match n.attr("scan_input_axes") {
                    Some(AttrValue::Ints(a)) => a.first().copied().unwrap_or(0),
                    _ => 0,
                };
                let length = x
                    .types
                    .get(states)
                    .and_then(|t| t.dims.as_ref())
                    .and_then(|d| {
                        let r = d.len() as i64;
                        let a = if axis0 < 0 { axis0 + r } else { axis0 };
                        d.get(usize::try_from(a).ok()?).cloned()
                    })
                    .flatten();
                let out_axes = match n.attr("scan_output_axes") {
                    Some(AttrValue::Ints(a)) => a.clone(),
                    _ => Vec::new(),
                };
                let mut v: Vec<Ty> = outs.iter().take(states).cloned().collect();
                for (k, t) in outs.iter().skip(states).enumerate() {
                    let at = out_axes.get(k).copied().unwrap_or(0);
                    v.push(match at {
                        0 => stacked(t, length.clone()),
                        _ => Ty::new(t.dtype, None),
                    });
                }
                v
            }
            _ => Vec::new(),
        }
    }
}

/// One of two types (If's branches, a loop's state before and after an iteration): dims that
/// differ unknown, a rank that differs unknown.
fn either(a: &Ty, b: &Ty) -> Ty {
    let dims = match (&a.dims, &b.dims) {
        (Some(p), Some(q)) if p.len() == q.len() => Some(
            p.iter()
                .zip(q)
                .map(|(x, y)| if x == y { x.clone() } else { None })
                .collect(),
        ),
        _ => None,
    };
    Ty::new(a.dtype.or(b.dtype), dims)
}

/// A value stacked once per iteration along a new first axis.
fn stacked(t: &Ty, count: Size) -> Ty {
    Ty::new(
        t.dtype,
        t.dims.as_ref().map(|d| {
            let mut v = vec![count];
            v.extend(d.iter().cloned());
            v
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::Inferred;
    use crate::dtype;
    use crate::graph::{AttrValue, Attribute, Dim, ValueType};
    use crate::model::{Function, Model};
    use crate::testing::{int, GraphExt};

    fn sym(s: &str) -> Dim {
        Dim::Sym(s.into())
    }

    fn shape_of(i: &Inferred, m: &Model, name: &str) -> Option<Vec<Dim>> {
        i.type_of(&m.graph, name).and_then(|t| t.shape.clone())
    }

    #[test]
    fn computed_shapes_are_named_by_the_input_dims() {
        let mut m = Model::new(18, 8, "test");
        let g = &mut m.graph;
        let x = g.add_input(
            "x",
            dtype::FLOAT,
            Some(vec![sym("batch"), sym("seq"), Dim::Fixed(8)]),
        );
        // (batch, seq, 8) -> Reshape to (batch, 2 * seq, 4) through Shape / Gather / Mul / Concat
        let s = g.op("Shape", &[&x]);
        let b = g.i64s(&[1], &[0]);
        let batch = g.op("Gather", &[&s, &b]);
        let one = g.i64s(&[1], &[1]);
        let seq = g.op("Gather", &[&s, &one]);
        let two = g.i64s(&[1], &[2]);
        let twice = g.op("Mul", &[&seq, &two]);
        let four = g.i64s(&[1], &[4]);
        let target = g.op_with("Concat", &[&batch, &twice, &four], vec![int("axis", 0)]);
        let r = g.op("Reshape", &[&x, &target]);
        // Expand a (1, 1, 4) constant to r's shape, then MatMul by (4, 3)
        let c = g.f32s(&[1, 1, 4], &[0.0; 4]);
        let shape_r = g.op("Shape", &[&r]);
        let e = g.op("Expand", &[&c, &shape_r]);
        let w = g.f32s(&[4, 3], &[0.0; 12]);
        let y = g.op("MatMul", &[&e, &w]);
        let t = g.op_with("Transpose", &[&y], vec![]);
        let found = Inferred::of(&m);
        assert_eq!(
            shape_of(&found, &m, &r),
            Some(vec![sym("batch"), sym("2*seq"), Dim::Fixed(4)])
        );
        assert_eq!(
            shape_of(&found, &m, &e),
            Some(vec![sym("batch"), sym("2*seq"), Dim::Fixed(4)])
        );
        assert_eq!(
            shape_of(&found, &m, &t),
            Some(vec![Dim::Fixed(3), sym("2*seq"), sym("batch")])
        );
        let ty = found.type_of(&m.graph, &target).expect("target");
        assert_eq!(ty.dtype, Some(dtype::INT64));
        assert_eq!(ty.shape, Some(vec![Dim::Fixed(3)]));
    }

    #[test]
    fn a_size_computed_from_data_is_unknown_and_the_rank_known() {
        let mut m = Model::new(18, 8, "test");
        let g = &mut m.graph;
        let x = g.add_input("x", dtype::FLOAT, Some(vec![sym("n"), Dim::Fixed(3)]));
        let nz = g.op("NonZero", &[&x]);
        let starts = g.i64s(&[1], &[0]);
        let axes = g.i64s(&[1], &[0]);
        let ends = g.op("ReduceMax", &[&nz]);
        let sl = g.op("Slice", &[&x, &starts, &ends, &axes]);
        let found = Inferred::of(&m);
        assert_eq!(
            shape_of(&found, &m, &nz),
            Some(vec![Dim::Fixed(2), Dim::Unknown])
        );
        assert_eq!(
            shape_of(&found, &m, &sl),
            Some(vec![Dim::Unknown, Dim::Fixed(3)])
        );
    }

    #[test]
    fn a_sequence_keeps_its_type_and_gives_no_tensor_type() {
        let mut m = Model::new(18, 8, "test");
        let g = &mut m.graph;
        let x = g.add_input("x", dtype::FLOAT, Some(vec![sym("n"), Dim::Fixed(3)]));
        let seq = g.op("SplitToSequence", &[&x]);
        let elements = ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(vec![Dim::Unknown, Dim::Fixed(3)]),
            sequence: true,
        };
        g.set_type(&seq, elements.clone()).expect("type");
        let copy = g.op("Identity", &[&seq]);
        let found = Inferred::of(&m);
        assert_eq!(found.type_of(&m.graph, &seq), Some(&elements));
        // Identity's rule would give its output the input's shape, as a tensor's: not a sequence's
        // (no shape: no value_info entry)
        let copied = found.type_of(&m.graph, &copy);
        assert!(copied.is_none_or(|t| t.shape.is_none() && !t.sequence));
    }

    #[test]
    fn branches_and_function_calls_get_their_bodies_types() {
        let mut m = Model::new(18, 8, "test");
        let x = m
            .graph
            .add_input("x", dtype::FLOAT, Some(vec![sym("n"), Dim::Fixed(4)]));
        let c = m.graph.add_input("c", dtype::BOOL, Some(vec![]));
        // If: then (n, 4), else (n, 4) through a Transpose pair: both known to the inference only
        let mut then_b = m.graph.subgraph("then");
        let a = then_b.op("Relu", &[&x]);
        then_b.add_output(&a, None).expect("out");
        let mut else_b = m.graph.subgraph("else");
        let t = else_b.op("Transpose", &[&x]);
        let back = else_b.op("Transpose", &[&t]);
        else_b.add_output(&back, None).expect("out");
        let attrs = vec![
            Attribute {
                name: "then_branch".into(),
                value: AttrValue::Graph(Box::new(then_b)),
            },
            Attribute {
                name: "else_branch".into(),
                value: AttrValue::Graph(Box::new(else_b)),
            },
        ];
        let branched = m.graph.op_with("If", &[&c], attrs);
        // a local function doubling its input's last dim, called on (n, 4)
        let mut body = crate::graph::Graph::new("f");
        let fx = body.add_input("fx", dtype::FLOAT, Some(vec![Dim::Fixed(1), Dim::Fixed(2)]));
        let fy = body.op_with("Concat", &[&fx, &fx], vec![int("axis", -1)]);
        body.typed(&fy, dtype::FLOAT, &[1, 4]);
        body.add_output(&fy, None).expect("out");
        m.functions.push(Function {
            domain: "pkg.test".into(),
            name: "Twice".into(),
            graph: body,
        });
        let call = m
            .graph
            .add_node(
                "Twice",
                "pkg.test",
                vec![branched.clone()],
                &["call".into()],
                vec![],
                None,
            )
            .expect("call")
            .remove(0);
        let found = Inferred::of(&m);
        // a body's values (names are unique across a model's graphs)
        assert_eq!(
            found.get(&t).and_then(|t| t.shape.clone()),
            Some(vec![Dim::Fixed(4), sym("n")])
        );
        assert_eq!(
            shape_of(&found, &m, &branched),
            Some(vec![sym("n"), Dim::Fixed(4)])
        );
        assert_eq!(
            found.type_of(&m.graph, &call),
            Some(&ValueType {
                dtype: Some(dtype::FLOAT),
                shape: Some(vec![sym("n"), Dim::Fixed(8)]),
                sequence: false,
            })
        );
    }
}
