//! One rule per operator: the element types and shapes of a node's outputs from its inputs' types,
//! the contents of its small integer inputs (shape tensors) and its attributes, as the ONNX operator
//! definitions state them (standard domain, the com.microsoft operators fastonnx emits and
//! onnxruntime's SimplifiedLayerNormalization); and the contents of the small integer tensors the shape
//! arithmetic computes ([`value`]). An unknown size stays `None`; a rule that cannot tell the rank
//! gives no shape.

use super::poly::Poly;
use crate::dtype;
use crate::graph::{AttrValue, Node};

/// A size: None where unknown.
pub(super) type Size = Option<Poly>;

/// An element type and shape as the rules compute them (None: unknown element type or rank).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Ty {
    pub dtype: Option<i32>,
    pub dims: Option<Vec<Size>>,
}

impl Ty {
    pub(super) fn new(dtype: Option<i32>, dims: Option<Vec<Size>>) -> Ty {
        Ty { dtype, dims }
    }
    fn rank(&self) -> Option<usize> {
        self.dims.as_ref().map(Vec::len)
    }
    fn with_dtype(&self, dtype: Option<i32>) -> Ty {
        Ty::new(dtype, self.dims.clone())
    }
}

/// What a rule reads: the node, its inputs' types and contents (a missing optional input: default
/// type, no contents).
pub(super) struct Inputs<'a> {
    pub node: &'a Node,
    pub types: Vec<Ty>,
    pub values: Vec<Option<Vec<Size>>>,
    /// The float contents of a small constant input (Resize's scales), by input index.
    pub floats: Vec<Option<Vec<f32>>>,
}

impl Inputs<'_> {
    fn ty(&self, i: usize) -> Ty {
        self.types.get(i).cloned().unwrap_or_default()
    }
    fn dims(&self, i: usize) -> Option<&Vec<Size>> {
        self.types.get(i)?.dims.as_ref()
    }
    fn dtype(&self, i: usize) -> Option<i32> {
        self.types.get(i)?.dtype
    }
    fn present(&self, i: usize) -> bool {
        self.node.inputs.get(i).is_some_and(|n| !n.is_empty())
    }
    fn value(&self, i: usize) -> Option<&Vec<Size>> {
        self.values.get(i)?.as_ref()
    }
    /// The integer contents of input `i`, each known.
    fn ints(&self, i: usize) -> Option<Vec<i64>> {
        self.value(i)?
            .iter()
            .map(|v| v.as_ref()?.as_const())
            .collect()
    }
    fn int(&self, name: &str) -> Option<i64> {
        match self.node.attr(name) {
            Some(AttrValue::Int(v)) => Some(*v),
            _ => None,
        }
    }
    fn int_or(&self, name: &str, default: i64) -> i64 {
        self.int(name).unwrap_or(default)
    }
    fn ints_attr(&self, name: &str) -> Option<Vec<i64>> {
        match self.node.attr(name) {
            Some(AttrValue::Ints(v)) => Some(v.clone()),
            _ => None,
        }
    }
    fn string(&self, name: &str) -> Option<&[u8]> {
        match self.node.attr(name) {
            Some(AttrValue::String(v)) => Some(v),
            _ => None,
        }
    }
    /// An integer list given as attribute (older opsets) or as input `i` (newer ones).
    fn list(&self, name: &str, i: usize) -> Option<Vec<i64>> {
        self.ints_attr(name).or_else(|| self.ints(i))
    }
}

#[allow(clippy::unnecessary_wraps)] // a size, as every rule holds one
fn fixed(v: i64) -> Size {
    Some(Poly::constant(v))
}

fn is_one(d: &Size) -> bool {
    d.as_ref().and_then(Poly::as_const) == Some(1)
}

/// `axis` (negative from the end) as an index below `rank`.
fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if a < 0 { a + r } else { a };
    (0..r)
        .contains(&a)
        .then(|| usize::try_from(a).ok())
        .flatten()
}

/// One size from two that must be equal: the known one.
fn same(a: &Size, b: &Size) -> Size {
    match (a, b) {
        (Some(x), Some(y)) if x.as_const().is_none() && y.as_const().is_some() => b.clone(),
        (Some(_), _) => a.clone(),
        _ => b.clone(),
    }
}

/// Multidirectional broadcasting of one dim.
fn broadcast_dim(a: &Size, b: &Size) -> Size {
    match (a, b) {
        _ if is_one(a) => b.clone(),
        _ if is_one(b) => a.clone(),
        (Some(x), Some(y)) if x == y => a.clone(),
        // the other is 1 or equal
        (Some(x), _) if x.as_const().is_some() => a.clone(),
        (_, Some(y)) if y.as_const().is_some() => b.clone(),
        _ => None,
    }
}

fn broadcast(shapes: &[&Vec<Size>]) -> Vec<Size> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..rank)
        .map(|i| {
            let mut out: Size = fixed(1);
            for s in shapes {
                if let Some(d) = (i + s.len()).checked_sub(rank).and_then(|k| s.get(k)) {
                    out = broadcast_dim(&out, d);
                }
            }
            out
        })
        .collect()
}

/// The broadcast shape of the inputs `from..`, when every rank is known.
fn broadcast_inputs(x: &Inputs, from: usize) -> Option<Vec<Size>> {
    let shapes: Option<Vec<&Vec<Size>>> = (from..x.node.inputs.len())
        .filter(|&i| x.present(i))
        .map(|i| x.dims(i))
        .collect();
    Some(broadcast(&shapes?))
}

fn product(dims: &[Size]) -> Size {
    dims.iter()
        .try_fold(Poly::constant(1), |acc, d| Some(acc.mul(d.as_ref()?)))
}

/// The output types of `x.node`, one per output (default where the rule knows nothing).
pub(super) fn infer(x: &Inputs) -> Vec<Ty> {
    let n = x.node;
    let outs = n.outputs.len();
    let mut out = match n.domain.as_str() {
        "" | "ai.onnx" => standard(x),
        "com.microsoft" => contrib(x),
        _ => Vec::new(),
    };
    out.resize(outs, Ty::default());
    out
}

fn one(t: Ty) -> Vec<Ty> {
    vec![t]
}

fn standard(x: &Inputs) -> Vec<Ty> {
    let n = x.node;
    let t0 = x.ty(0);
    match n.op_type.as_str() {
        "Identity"
        | "Abs"
        | "Neg"
        | "Relu"
        | "Sigmoid"
        | "Tanh"
        | "Exp"
        | "Log"
        | "Sqrt"
        | "Reciprocal"
        | "Erf"
        | "Sin"
        | "Cos"
        | "Tan"
        | "Asin"
        | "Acos"
        | "Atan"
        | "Sinh"
        | "Cosh"
        | "Asinh"
        | "Acosh"
        | "Atanh"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Sign"
        | "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "Gelu"
        | "CumSum"
        | "Clip"
        | "Trilu"
        | "LeakyRelu"
        | "Elu"
        | "Selu"
        | "Celu"
        | "HardSigmoid"
        | "HardSwish"
        | "Softplus"
        | "Softsign"
        | "Mish"
        | "ThresholdedRelu"
        | "Shrink"
        | "BitwiseNot"
        | "Not"
        | "LpNormalization"
        | "InstanceNormalization"
        | "MeanVarianceNormalization"
        | "LRN"
        | "RMSNormalization"
        | "GroupNormalization"
        | "ReverseSequence"
        | "ScatterElements"
        | "ScatterND"
        | "Scatter"
        | "Erfc" => one(t0),
        "IsNaN" | "IsInf" => one(t0.with_dtype(Some(dtype::BOOL))),
        "Dropout" => vec![t0.clone(), t0.with_dtype(Some(dtype::BOOL))],
        "BatchNormalization" => {
            let c = x.dims(1).and_then(|d| d.first().cloned());
            let stat = Ty::new(x.dtype(3), Some(vec![c.flatten()]));
            vec![t0, stat.clone(), stat]
        }
        "LayerNormalization" | "SimplifiedLayerNormalization" => {
            let stash = match x.int_or("stash_type", 1) {
                1 => Some(dtype::FLOAT),
                s => i32::try_from(s).ok(),
            };
            let stat_dims = t0.dims.as_ref().and_then(|d| {
                let a = axis(x.int_or("axis", -1), d.len())?;
                Some(
                    d.iter()
                        .enumerate()
                        .map(|(i, v)| if i < a { v.clone() } else { fixed(1) })
                        .collect(),
                )
            });
            let stat = Ty::new(stash, stat_dims);
            if n.op_type == "LayerNormalization" {
                vec![t0, stat.clone(), stat]
            } else {
                vec![t0, stat]
            }
        }
        "PRelu" | "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Sum"
        | "Mean" | "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" => {
            one(Ty::new(t0.dtype, broadcast_inputs(x, 0)))
        }
        "And" | "Or" | "Xor" | "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" => {
            one(Ty::new(Some(dtype::BOOL), broadcast_inputs(x, 0)))
        }
        "Where" => one(Ty::new(x.dtype(1).or(x.dtype(2)), broadcast_inputs(x, 0))),
        "Cast" => one(t0.with_dtype(x.int("to").and_then(|v| i32::try_from(v).ok()))),
        "CastLike" => one(t0.with_dtype(x.dtype(1))),
        "Shape" => one(Ty::new(
            Some(dtype::INT64),
            t0.rank()
                .map(|r| vec![fixed(shape_range(x, r).len() as i64)]),
        )),
        "Size" => one(Ty::new(Some(dtype::INT64), Some(vec![]))),
        "NonZero" => one(Ty::new(
            Some(dtype::INT64),
            t0.rank().map(|r| vec![fixed(r as i64), None]),
        )),
        "ConstantOfShape" => {
            let dt = match n.attr("value") {
                Some(AttrValue::Tensor(t)) => Some(t.dtype),
                _ => Some(dtype::FLOAT),
            };
            let dims = x.value(0).cloned().or_else(|| {
                let len = x.dims(0)?.first()?.as_ref()?.as_const()?;
                Some(vec![None; usize::try_from(len).ok()?])
            });
            one(Ty::new(dt, dims))
        }
        "Constant" => one(constant(x)),
        "EyeLike" | "RandomUniformLike" | "RandomNormalLike" | "Bernoulli" => one(t0.with_dtype(
            x.int("dtype")
                .and_then(|v| i32::try_from(v).ok())
                .or(t0.dtype),
        )),
        "RandomUniform" | "RandomNormal" => one(Ty::new(
            Some(
                x.int("dtype")
                    .and_then(|v| i32::try_from(v).ok())
                    .unwrap_or(dtype::FLOAT),
            ),
            x.ints_attr("shape")
                .map(|s| s.into_iter().map(fixed).collect()),
        )),
        "Range" => one(Ty::new(t0.dtype, Some(vec![range_len(x)]))),
        "Reshape" => one(Ty::new(t0.dtype, reshape(x))),
        "Expand" => {
            let dims = match (x.dims(0), x.value(1)) {
                (Some(d), Some(v)) => Some(broadcast(&[d, v])),
                (d, _) => (|| {
                    let len = x.dims(1)?.first()?.as_ref()?.as_const()?;
                    let rank = usize::try_from(len).ok()?.max(d.map_or(0, Vec::len));
                    Some(vec![None; rank])
                })(),
            };
            one(Ty::new(t0.dtype, dims))
        }
        "Unsqueeze" => one(Ty::new(t0.dtype, unsqueeze(x))),
        "Squeeze" => one(Ty::new(t0.dtype, squeeze(x))),
        "Flatten" => one(Ty::new(
            t0.dtype,
            t0.dims.as_ref().and_then(|d| {
                let r = d.len() as i64;
                let a = x.int_or("axis", 1);
                let a = usize::try_from(if a < 0 { a + r } else { a }).ok()?;
                (a <= d.len()).then(|| vec![product(&d[..a]), product(&d[a..])])
            }),
        )),
        "Transpose" => one(Ty::new(
            t0.dtype,
            t0.dims.as_ref().and_then(|d| {
                let perm = x
                    .ints_attr("perm")
                    .unwrap_or_else(|| (0..d.len() as i64).rev().collect());
                perm.iter()
                    .map(|&p| d.get(axis(p, d.len())?).cloned())
                    .collect()
            }),
        )),
        "Concat" => one(Ty::new(t0.dtype, concat(x))),
        "Split" => split(x),
        "Slice" => one(Ty::new(t0.dtype, slice(x))),
        "Gather" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let a = axis(x.int_or("axis", 0), d.len())?;
                let mut out = d[..a].to_vec();
                out.extend(x.dims(1)?.iter().cloned());
                out.extend(d[a + 1..].iter().cloned());
                Some(out)
            })(),
        )),
        "GatherElements" => one(Ty::new(t0.dtype, x.dims(1).cloned())),
        "GatherND" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let idx = x.dims(1)?;
                let b = usize::try_from(x.int_or("batch_dims", 0)).ok()?;
                let last = usize::try_from(idx.last()?.as_ref()?.as_const()?).ok()?;
                let mut out = idx[..idx.len() - 1].to_vec();
                out.extend(d.get(b + last..)?.iter().cloned());
                Some(out)
            })(),
        )),
        "Tile" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let r = x.value(1)?;
                (r.len() == d.len()).then(|| {
                    d.iter()
                        .zip(r)
                        .map(|(a, b)| Some(a.as_ref()?.mul(b.as_ref()?)))
                        .collect()
                })
            })(),
        )),
        "Pad" => one(Ty::new(t0.dtype, pad(x))),
        "MatMul" | "MatMulInteger" => {
            let dt = if n.op_type == "MatMul" {
                t0.dtype
            } else {
                Some(dtype::INT32)
            };
            one(Ty::new(dt, matmul(x.dims(0), x.dims(1), false, false)))
        }
        "Gemm" => one(Ty::new(
            t0.dtype,
            (|| {
                let a = x.dims(0)?;
                let b = x.dims(1)?;
                let m = if x.int_or("transA", 0) != 0 {
                    a.get(1)
                } else {
                    a.first()
                };
                let nn = if x.int_or("transB", 0) != 0 {
                    b.first()
                } else {
                    b.get(1)
                };
                Some(vec![m?.clone(), nn?.clone()])
            })(),
        )),
        "Conv" | "ConvInteger" => one(Ty::new(
            if n.op_type == "Conv" {
                t0.dtype
            } else {
                Some(dtype::INT32)
            },
            conv(x, false),
        )),
        "ConvTranspose" => one(Ty::new(t0.dtype, conv(x, true))),
        "MaxPool" | "AveragePool" | "LpPool" => {
            let dims = pool(x);
            let mut v = vec![Ty::new(t0.dtype, dims.clone())];
            if n.op_type == "MaxPool" {
                v.push(Ty::new(Some(dtype::INT64), dims));
            }
            v
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => one(Ty::new(
            t0.dtype,
            t0.dims.as_ref().map(|d| {
                d.iter()
                    .enumerate()
                    .map(|(i, v)| if i < 2 { v.clone() } else { fixed(1) })
                    .collect()
            }),
        )),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" => {
            one(Ty::new(t0.dtype, reduce(x)))
        }
        "ArgMax" | "ArgMin" => one(Ty::new(
            Some(dtype::INT64),
            t0.dims.as_ref().and_then(|d| {
                let a = axis(x.int_or("axis", 0), d.len())?;
                Some(keep_or_drop(d, &[a], x.int_or("keepdims", 1) != 0))
            }),
        )),
        "TopK" => {
            let dims = (|| {
                let mut d = x.dims(0)?.clone();
                let a = axis(x.int_or("axis", -1), d.len())?;
                d[a] = x.value(1).and_then(|v| v.first().cloned()).flatten();
                Some(d)
            })();
            vec![
                Ty::new(t0.dtype, dims.clone()),
                Ty::new(Some(dtype::INT64), dims),
            ]
        }
        "Einsum" => one(Ty::new(t0.dtype, einsum(x))),
        "Resize" | "Upsample" => one(Ty::new(t0.dtype, resize(x))),
        "DepthToSpace" | "SpaceToDepth" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let b = x.int("blocksize")?;
                if d.len() != 4 {
                    return None;
                }
                let (c, s) = if n.op_type == "DepthToSpace" {
                    (
                        d[1].as_ref()?.div_exact(&Poly::constant(b * b)),
                        Poly::constant(b),
                    )
                } else {
                    (Some(d[1].as_ref()?.scale(b * b)), Poly::constant(1))
                };
                let sp = |v: &Size| -> Size {
                    if n.op_type == "DepthToSpace" {
                        Some(v.as_ref()?.mul(&s))
                    } else {
                        v.as_ref()?.div_exact(&Poly::constant(b))
                    }
                };
                Some(vec![d[0].clone(), c, sp(&d[2]), sp(&d[3])])
            })(),
        )),
        "OneHot" => one(Ty::new(
            x.dtype(2),
            (|| {
                let mut d = x.dims(0)?.clone();
                let a = x.int_or("axis", -1);
                let r = d.len() as i64 + 1;
                let a = usize::try_from(if a < 0 { a + r } else { a }).ok()?;
                let depth = x.value(1).and_then(|v| v.first().cloned()).flatten();
                (a <= d.len()).then(|| {
                    d.insert(a, depth);
                    d
                })
            })(),
        )),
        "DequantizeLinear" => one(t0.with_dtype(
            x.int("output_dtype")
                .filter(|&v| v != 0)
                .and_then(|v| i32::try_from(v).ok())
                .or(x.dtype(1)),
        )),
        "QuantizeLinear" => one(t0.with_dtype(
            x.int("output_dtype")
                .filter(|&v| v != 0)
                .and_then(|v| i32::try_from(v).ok())
                .or(x.dtype(2))
                .or(Some(dtype::UINT8)),
        )),
        "DynamicQuantizeLinear" => vec![
            t0.with_dtype(Some(dtype::UINT8)),
            Ty::new(Some(dtype::FLOAT), Some(vec![])),
            Ty::new(Some(dtype::UINT8), Some(vec![])),
        ],
        "Attention" => attention(x),
        "GridSample" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let g = x.dims(1)?;
                let mut out = vec![d.first()?.clone(), d.get(1)?.clone()];
                out.extend(g.get(1..g.len().checked_sub(1)?)?.iter().cloned());
                Some(out)
            })(),
        )),
        "RoiAlign" => one(Ty::new(
            t0.dtype,
            (|| {
                Some(vec![
                    x.dims(1)?.first()?.clone(),
                    x.dims(0)?.get(1)?.clone(),
                    fixed(x.int_or("output_height", 1)),
                    fixed(x.int_or("output_width", 1)),
                ])
            })(),
        )),
        "NonMaxSuppression" => one(Ty::new(Some(dtype::INT64), Some(vec![None, fixed(3)]))),
        "Compress" | "Unique" => {
            let r = if x.int("axis").is_some() {
                t0.rank()
            } else {
                Some(1)
            };
            one(Ty::new(t0.dtype, r.map(|r| vec![None; r])))
        }
        "LSTM" | "GRU" | "RNN" => rnn(x),
        "Det" => one(Ty::new(
            t0.dtype,
            t0.dims
                .as_ref()
                .and_then(|d| Some(d[..d.len().checked_sub(2)?].to_vec())),
        )),
        _ => Vec::new(),
    }
}

fn contrib(x: &Inputs) -> Vec<Ty> {
    let t0 = x.ty(0);
    match x.node.op_type.as_str() {
        "Gelu" | "FastGelu" | "QuickGelu" | "BiasGelu" | "RotaryEmbedding" => one(t0),
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => {
            vec![t0.clone(), Ty::default(), Ty::default(), t0]
        }
        "FusedMatMul" => one(Ty::new(
            t0.dtype,
            matmul(
                x.dims(0),
                x.dims(1),
                x.int_or("transA", 0) != 0,
                x.int_or("transB", 0) != 0,
            ),
        )),
        "MatMulNBits" => one(Ty::new(
            t0.dtype,
            (|| {
                let d = x.dims(0)?;
                let mut out = d[..d.len().checked_sub(1)?].to_vec();
                out.push(fixed(x.int("N")?));
                Some(out)
            })(),
        )),
        "MultiHeadAttention" => one(Ty::new(
            t0.dtype,
            (|| {
                let q = x.dims(0)?;
                if q.len() != 3 {
                    return None;
                }
                let v = x.dims(2)?;
                let hidden = match v.len() {
                    3 => v[2].clone(),
                    4 => Some(v[1].as_ref()?.mul(v[3].as_ref()?)),
                    _ => None,
                };
                Some(vec![q[0].clone(), q[1].clone(), hidden])
            })(),
        )),
        _ => Vec::new(),
    }
}

/// The `[start, end)` of the dims `Shape` returns (opset 15's attributes).
fn shape_range(x: &Inputs, rank: usize) -> std::ops::Range<usize> {
    let r = rank as i64;
    let clamp = |v: i64| usize::try_from((if v < 0 { v + r } else { v }).clamp(0, r)).unwrap_or(0);
    let start = clamp(x.int_or("start", 0));
    let end = x.int("end").map_or(rank, clamp);
    start..end.max(start)
}

fn constant(x: &Inputs) -> Ty {
    let n = x.node;
    if let Some(AttrValue::Tensor(t)) = n.attr("value") {
        return Ty::new(
            Some(t.dtype),
            Some(t.dims.iter().map(|&d| fixed(d)).collect()),
        );
    }
    match n.attrs.first().map(|a| (a.name.as_str(), &a.value)) {
        Some(("value_int", _)) => Ty::new(Some(dtype::INT64), Some(vec![])),
        Some(("value_float", _)) => Ty::new(Some(dtype::FLOAT), Some(vec![])),
        Some(("value_ints", AttrValue::Ints(v))) => {
            Ty::new(Some(dtype::INT64), Some(vec![fixed(v.len() as i64)]))
        }
        Some(("value_floats", AttrValue::Floats(v))) => {
            Ty::new(Some(dtype::FLOAT), Some(vec![fixed(v.len() as i64)]))
        }
        _ => Ty::default(),
    }
}

fn range_len(x: &Inputs) -> Size {
    let v = |i: usize| x.value(i).and_then(|v| v.first().cloned()).flatten();
    let (start, limit, delta) = (v(0)?, v(1)?, v(2)?);
    let d = delta.as_const()?;
    if d == 0 {
        return None;
    }
    if let (Some(s), Some(l)) = (start.as_const(), limit.as_const()) {
        let span = l.checked_sub(s)?;
        let n = if d > 0 {
            span.div_euclid(d) + i64::from(span.rem_euclid(d) != 0)
        } else {
            let (span, d) = (span.checked_neg()?, d.checked_neg()?);
            span.div_euclid(d) + i64::from(span.rem_euclid(d) != 0)
        };
        return fixed(n.max(0));
    }
    // a symbolic span: a size counted up from the start
    (d > 0).then(|| limit.sub(&start).ceil_div(d)).flatten()
}

fn reshape(x: &Inputs) -> Option<Vec<Size>> {
    let input = x.dims(0);
    let Some(target) = x.value(1) else {
        let len = x.dims(1)?.first()?.as_ref()?.as_const()?;
        return Some(vec![None; usize::try_from(len).ok()?]);
    };
    let allow_zero = x.int_or("allowzero", 0) != 0;
    let mut out: Vec<Size> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_ref().and_then(Poly::as_const) {
            Some(0) if !allow_zero => out.push(input.and_then(|d| d.get(i).cloned()).flatten()),
            Some(-1) => {
                infer_at = Some(i);
                out.push(None);
            }
            _ => out.push(t.clone()),
        }
    }
    if let Some(at) = infer_at {
        let known: Size = out
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != at)
            .try_fold(Poly::constant(1), |acc, (_, d)| Some(acc.mul(d.as_ref()?)));
        out[at] = (|| product(input?)?.div_exact(&known?))();
    }
    Some(out)
}

fn unsqueeze(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let axes = x.list("axes", 1)?;
    let rank = d.len() + axes.len();
    let mut at: Vec<usize> = axes.iter().map(|&a| axis(a, rank)).collect::<Option<_>>()?;
    at.sort_unstable();
    let mut src = d.iter();
    Some(
        (0..rank)
            .map(|i| {
                if at.binary_search(&i).is_ok() {
                    fixed(1)
                } else {
                    src.next().cloned().flatten()
                }
            })
            .collect(),
    )
}

fn squeeze(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let axes = match x.list("axes", 1) {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, d.len()))
            .collect::<Option<Vec<_>>>()?,
        None if x.present(1) => return None,
        // every dim of size 1: known only when every dim is known
        None => {
            let mut v = Vec::new();
            for (i, s) in d.iter().enumerate() {
                match s.as_ref()?.as_const() {
                    Some(1) => v.push(i),
                    Some(_) => {}
                    None => return None,
                }
            }
            v
        }
    };
    Some(keep_or_drop(d, &axes, false))
}

/// `d` with the dims at `axes` made 1 (`keep`) or dropped.
fn keep_or_drop(d: &[Size], axes: &[usize], keep: bool) -> Vec<Size> {
    d.iter()
        .enumerate()
        .filter_map(|(i, v)| match (axes.contains(&i), keep) {
            (false, _) => Some(v.clone()),
            (true, true) => Some(fixed(1)),
            (true, false) => None,
        })
        .collect()
}

fn concat(x: &Inputs) -> Option<Vec<Size>> {
    let shapes: Vec<&Vec<Size>> = (0..x.node.inputs.len())
        .map(|i| x.dims(i))
        .collect::<Option<_>>()?;
    let first = shapes.first()?;
    let a = axis(x.int_or("axis", 0), first.len())?;
    let mut out = (*first).clone();
    let mut total = Some(Poly::constant(0));
    for s in &shapes {
        if s.len() != out.len() {
            return None;
        }
        total = (|| Some(total?.add(s[a].as_ref()?)))();
        for (i, d) in s.iter().enumerate() {
            if i != a {
                out[i] = same(&out[i], d);
            }
        }
    }
    out[a] = total;
    Some(out)
}

fn split(x: &Inputs) -> Vec<Ty> {
    let t0 = x.ty(0);
    let k = x.node.outputs.len();
    let Some(d) = t0.dims.as_ref() else {
        return vec![Ty::new(t0.dtype, None); k];
    };
    let Some(a) = axis(x.int_or("axis", 0), d.len()) else {
        return Vec::new();
    };
    let sizes: Vec<Size> = match x.list("split", 1) {
        Some(s) => s.into_iter().map(fixed).collect(),
        None if x.present(1) => vec![None; k],
        None => d[a]
            .as_ref()
            .map_or_else(|| vec![None; k], |total| equal_parts(total, k)),
    };
    sizes
        .into_iter()
        .map(|s| {
            let mut dims = d.clone();
            dims[a] = s;
            Ty::new(t0.dtype, Some(dims))
        })
        .collect()
}

/// `total` split in `k` parts as Split without sizes does: each `ceil(total / k)`, the last what is
/// left.
fn equal_parts(total: &Poly, k: usize) -> Vec<Size> {
    let kk = i64::try_from(k).unwrap_or(1).max(1);
    let Some(t) = total.as_const() else {
        return vec![total.div_exact(&Poly::constant(kk)); k];
    };
    let part = t.div_euclid(kk) + i64::from(t.rem_euclid(kk) != 0);
    (0..kk)
        .map(|i| fixed(part.min(t - part * i).max(0)))
        .collect()
}

/// Values at or above this end a slice at the end of its axis.
const LARGE: i64 = 1 << 31;

fn slice(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let axes: Option<Vec<i64>> = match x.ints_attr("axes") {
        Some(a) => Some(a),
        None if x.present(3) => match x.ints(3) {
            Some(a) => Some(a),
            None => return Some(vec![None; d.len()]),
        },
        None => None,
    };
    let (starts, ends) = match (x.ints_attr("starts"), x.ints_attr("ends")) {
        (Some(s), Some(e)) => (
            s.into_iter().map(fixed).collect::<Vec<_>>(),
            e.into_iter().map(fixed).collect::<Vec<_>>(),
        ),
        _ => {
            if let (Some(s), Some(e)) = (x.value(1), x.value(2)) {
                (s.clone(), e.clone())
            } else {
                // bounds computed at run time: the sliced axes' sizes are unknown, the others kept
                let Some(axes) = axes else {
                    return Some(vec![None; d.len()]);
                };
                let mut out = d.clone();
                for a in axes {
                    out[axis(a, d.len())?] = None;
                }
                return Some(out);
            }
        }
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps: Vec<i64> = if x.present(4) {
        x.ints(4)?
    } else {
        vec![1; starts.len()]
    };
    if [ends.len(), axes.len(), steps.len()] != [starts.len(); 3] {
        return None;
    }
    let mut out = d.clone();
    for i in 0..starts.len() {
        let a = axis(axes[i], d.len())?;
        out[a] = slice_len(&d[a], &starts[i], &ends[i], steps[i]);
    }
    Some(out)
}

fn slice_len(dim: &Size, start: &Size, end: &Size, step: i64) -> Size {
    let dim = dim.as_ref()?;
    let start = start.as_ref()?;
    let end = end.as_ref()?;
    if step == 0 {
        return None;
    }
    if let (Some(n), Some(s), Some(e)) = (dim.as_const(), start.as_const(), end.as_const()) {
        if n <= 0 {
            return fixed(0);
        }
        let (s, e) = if step > 0 {
            let s = if s < 0 { s.saturating_add(n) } else { s }.clamp(0, n);
            let e = if e < 0 { e.saturating_add(n) } else { e }.clamp(0, n);
            (s, e)
        } else {
            let s = if s < 0 { s.saturating_add(n) } else { s }.clamp(0, n - 1);
            let e = if e < 0 { e.saturating_add(n) } else { e }.clamp(-1, n - 1);
            (s, e)
        };
        let span = e - s;
        let len = if step > 0 {
            span.saturating_add(step - 1).div_euclid(step)
        } else {
            span.saturating_add(step + 1).div_euclid(step)
        };
        return fixed(len.max(0));
    }
    if step != 1 {
        return None;
    }
    let s = start.as_const()?;
    if s < 0 {
        return None;
    }
    // to the end: the axis past the start (which the graph's own sizes put inside it)
    if end.as_const().is_some_and(|e| e >= LARGE) || end == dim {
        return Some(dim.sub(&Poly::constant(s)));
    }
    None
}

fn pad(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let pads: Vec<Size> = match x.ints_attr("pads") {
        Some(p) => p.into_iter().map(fixed).collect(),
        None => x.value(1)?.clone(),
    };
    let axes: Vec<usize> = if x.present(3) {
        x.ints(3)?
            .iter()
            .map(|&a| axis(a, d.len()))
            .collect::<Option<_>>()?
    } else {
        (0..d.len()).collect()
    };
    if pads.len() != 2 * axes.len() {
        return None;
    }
    let mut out = d.clone();
    for (k, &a) in axes.iter().enumerate() {
        out[a] = (|| {
            Some(
                d[a].as_ref()?
                    .add(pads[k].as_ref()?)
                    .add(pads[k + axes.len()].as_ref()?),
            )
        })();
    }
    Some(out)
}

/// numpy's matmul: 1-D operands promoted and their dim dropped, batch dims broadcast; `trans_*`
/// swap an operand's last two dims first (FusedMatMul).
fn matmul(
    a: Option<&Vec<Size>>,
    b: Option<&Vec<Size>>,
    trans_a: bool,
    trans_b: bool,
) -> Option<Vec<Size>> {
    let (mut a, mut b) = (a?.clone(), b?.clone());
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (a1, b1) = (a.len() == 1, b.len() == 1);
    if a1 {
        a.insert(0, fixed(1));
    }
    if b1 {
        b.push(fixed(1));
    }
    let swap = |v: &mut Vec<Size>| {
        let r = v.len();
        v.swap(r - 1, r - 2);
    };
    if trans_a && !a1 {
        swap(&mut a);
    }
    if trans_b && !b1 {
        swap(&mut b);
    }
    let (ab, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let mut out = broadcast(&[&ab.to_vec(), &bb.to_vec()]);
    if !a1 {
        out.push(a[a.len() - 2].clone());
    }
    if !b1 {
        out.push(b[b.len() - 1].clone());
    }
    Some(out)
}

/// Per spatial axis: (kernel, stride, dilation, pad begin, pad end), from attributes.
/// One spatial axis' window: kernel, stride, dilation, pad begin, pad end.
type Window = (i64, i64, i64, i64, i64);

fn window(x: &Inputs, spatial: usize, kernel: &[i64]) -> Option<Vec<Window>> {
    let strides = x.ints_attr("strides").unwrap_or_else(|| vec![1; spatial]);
    let dil = x.ints_attr("dilations").unwrap_or_else(|| vec![1; spatial]);
    let pads = x.ints_attr("pads").unwrap_or_else(|| vec![0; 2 * spatial]);
    if kernel.len() != spatial
        || strides.len() != spatial
        || dil.len() != spatial
        || pads.len() != 2 * spatial
    {
        return None;
    }
    Some(
        (0..spatial)
            .map(|i| (kernel[i], strides[i], dil[i], pads[i], pads[i + spatial]))
            .collect(),
    )
}

/// A windowed axis' output size: `(in + pads - dilated kernel) / stride + 1`, rounded down (or up:
/// `ceil_mode`), or as `auto_pad` SAME_* says.
fn window_out(input: &Size, (k, s, d, pb, pe): Window, auto: &[u8], ceil: bool) -> Size {
    let input = input.as_ref()?;
    if auto == b"SAME_UPPER" || auto == b"SAME_LOWER" {
        return input.ceil_div(s);
    }
    let (pb, pe) = if auto == b"VALID" { (0, 0) } else { (pb, pe) };
    let reach = d.checked_mul(k.checked_sub(1)?)?;
    let span = input.add(&Poly::constant(
        pb.checked_add(pe)?.checked_sub(reach)?.checked_sub(1)?,
    ));
    let q = if ceil {
        span.ceil_div(s)
    } else {
        span.floor_div(s)
    }?;
    let mut out = q.add(&Poly::constant(1));
    if ceil {
        // the last window must start inside the input or its begin padding
        if let Some(o) = out.as_const() {
            let n = input.as_const()?;
            if (o - 1) * s >= n + pb {
                out = Poly::constant(o - 1);
            }
        }
    }
    Some(out)
}

fn conv(x: &Inputs, transposed: bool) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let w = x.dims(1)?;
    if d.len() < 3 || w.len() != d.len() {
        return None;
    }
    let spatial = d.len() - 2;
    let kernel: Vec<i64> = match x.ints_attr("kernel_shape") {
        Some(k) => k,
        None => w[2..]
            .iter()
            .map(|v| v.as_ref()?.as_const())
            .collect::<Option<_>>()?,
    };
    let win = window(x, spatial, &kernel)?;
    let auto = x.string("auto_pad").unwrap_or(b"NOTSET").to_vec();
    let group = x.int_or("group", 1);
    let mut out = vec![d[0].clone()];
    if transposed {
        out.push(w[1].as_ref().map(|c| c.scale(group)));
        if let Some(shape) = x.ints_attr("output_shape") {
            out.extend(shape.into_iter().map(fixed));
            return Some(out);
        }
        let extra = x
            .ints_attr("output_padding")
            .unwrap_or_else(|| vec![0; spatial]);
        for (i, &(k, s, dl, pb, pe)) in win.iter().enumerate() {
            let size = (|| {
                let input = d[2 + i].as_ref()?;
                if auto == b"SAME_UPPER" || auto == b"SAME_LOWER" {
                    return Some(input.scale(s));
                }
                let pad = if auto == b"VALID" { 0 } else { pb + pe };
                let c = extra.get(i).copied().unwrap_or(0) + (k - 1) * dl + 1 - pad;
                Some(
                    input
                        .add(&Poly::constant(-1))
                        .scale(s)
                        .add(&Poly::constant(c)),
                )
            })();
            out.push(size);
        }
    } else {
        out.push(w[0].clone());
        for (i, &win) in win.iter().enumerate() {
            out.push(window_out(&d[2 + i], win, &auto, false));
        }
    }
    Some(out)
}

fn pool(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    if d.len() < 3 {
        return None;
    }
    let spatial = d.len() - 2;
    let win = window(x, spatial, &x.ints_attr("kernel_shape")?)?;
    let auto = x.string("auto_pad").unwrap_or(b"NOTSET").to_vec();
    let ceil = x.int_or("ceil_mode", 0) != 0;
    let mut out = vec![d[0].clone(), d[1].clone()];
    for (i, &win) in win.iter().enumerate() {
        out.push(window_out(&d[2 + i], win, &auto, ceil));
    }
    Some(out)
}

fn reduce(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let keep = x.int_or("keepdims", 1) != 0;
    let axes = match x.list("axes", 1) {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&a| axis(a, d.len()))
            .collect::<Option<Vec<_>>>()?,
        None if x.present(1) => return None,
        _ if x.int_or("noop_with_empty_axes", 0) != 0 => return Some(d.clone()),
        _ => (0..d.len()).collect(),
    };
    Some(keep_or_drop(d, &axes, keep))
}

fn einsum(x: &Inputs) -> Option<Vec<Size>> {
    let eq: String = String::from_utf8(x.string("equation")?.to_vec())
        .ok()?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if eq.contains("...") {
        return None;
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_owned(), Some(r.to_owned())),
        None => (eq.clone(), None),
    };
    let mut sizes: Vec<(char, Size)> = Vec::new();
    let mut counts: std::collections::BTreeMap<char, usize> = std::collections::BTreeMap::new();
    for (i, term) in lhs.split(',').enumerate() {
        let d = x.dims(i)?;
        if term.chars().count() != d.len() {
            return None;
        }
        for (c, s) in term.chars().zip(d) {
            *counts.entry(c).or_default() += 1;
            match sizes.iter_mut().find(|(k, _)| *k == c) {
                Some((_, v)) => *v = broadcast_dim(v, s),
                None => sizes.push((c, s.clone())),
            }
        }
    }
    let out: String = match rhs {
        Some(r) => r,
        None => counts
            .iter()
            .filter(|(_, &n)| n == 1)
            .map(|(c, _)| *c)
            .collect(),
    };
    out.chars()
        .map(|c| sizes.iter().find(|(k, _)| *k == c).map(|(_, v)| v.clone()))
        .collect()
}

fn resize(x: &Inputs) -> Option<Vec<Size>> {
    let d = x.dims(0)?;
    let old = x.node.op_type == "Upsample";
    let (scales_at, sizes_at) = if old { (1, usize::MAX) } else { (2, 3) };
    if x.ints_attr("axes").is_some() {
        return None;
    }
    if x.present(sizes_at) {
        let sizes = x.value(sizes_at)?;
        return (sizes.len() == d.len()).then(|| sizes.clone());
    }
    let scales = x.floats.get(scales_at)?.as_ref()?;
    if scales.len() != d.len() {
        return None;
    }
    Some(
        d.iter()
            .zip(scales)
            .map(|(v, &s)| -> Size {
                let v = v.as_ref()?;
                if let Some(n) = v.as_const() {
                    return fixed((n as f64 * f64::from(s)).floor() as i64);
                }
                let k = s.round();
                ((s - k).abs() < f32::EPSILON && k >= 1.0).then(|| v.scale(k as i64))
            })
            .collect(),
    )
}

/// ONNX's Attention (opset 23): Y in the query's layout with the value's head size, present keys and
/// values with the past's sequence plus the new one.
fn attention(x: &Inputs) -> Vec<Ty> {
    let t0 = x.ty(0);
    let (Some(q), Some(k), Some(v)) = (x.dims(0), x.dims(1), x.dims(2)) else {
        return vec![Ty::new(t0.dtype, None)];
    };
    let y = match (q.len(), v.len()) {
        (4, 4) => Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]),
        (3, 3) => (|| {
            let kv_heads = x.int("kv_num_heads")?;
            let q_heads = x.int("q_num_heads")?;
            let head = v[2].as_ref()?.div_exact(&Poly::constant(kv_heads))?;
            Some(vec![q[0].clone(), q[1].clone(), Some(head.scale(q_heads))])
        })(),
        _ => None,
    };
    let mut out = vec![Ty::new(t0.dtype, y)];
    let present = |kv: &Vec<Size>, past_at: usize| -> Option<Vec<Size>> {
        if kv.len() != 4 {
            return None;
        }
        let seq = if x.present(past_at) {
            Some(x.dims(past_at)?.get(2)?.as_ref()?.add(kv[2].as_ref()?))
        } else {
            kv[2].clone()
        };
        Some(vec![kv[0].clone(), kv[1].clone(), seq, kv[3].clone()])
    };
    out.push(Ty::new(x.dtype(1), present(k, 4)));
    out.push(Ty::new(x.dtype(2), present(v, 5)));
    out
}

fn rnn(x: &Inputs) -> Vec<Ty> {
    let t0 = x.ty(0);
    let dirs = if x.string("direction") == Some(b"bidirectional") {
        2
    } else {
        1
    };
    let hidden = x.int("hidden_size").map(Poly::constant);
    let Some(d) = t0.dims.as_ref().filter(|d| d.len() == 3) else {
        return Vec::new();
    };
    let batch_first = x.int_or("layout", 0) != 0;
    let (seq, batch) = if batch_first {
        (&d[1], &d[0])
    } else {
        (&d[0], &d[1])
    };
    let y = if batch_first {
        vec![batch.clone(), seq.clone(), fixed(dirs), hidden.clone()]
    } else {
        vec![seq.clone(), fixed(dirs), batch.clone(), hidden.clone()]
    };
    let state = if batch_first {
        vec![batch.clone(), fixed(dirs), hidden]
    } else {
        vec![fixed(dirs), batch.clone(), hidden]
    };
    vec![
        Ty::new(t0.dtype, Some(y)),
        Ty::new(t0.dtype, Some(state.clone())),
        Ty::new(t0.dtype, Some(state)),
    ]
}

/// The contents of the node's first output when it is a small integer tensor computed from known
/// contents (shape arithmetic: `Shape`, `Gather`, `Concat`, `Slice`, elementwise integer math...).
/// A 0-d result is one element.
pub(super) fn value(x: &Inputs) -> Option<Vec<Size>> {
    let n = x.node;
    if !n.domain.is_empty() {
        return None;
    }
    let elementwise = |f: &dyn Fn(&Poly, &Poly) -> Option<Poly>| -> Option<Vec<Size>> {
        let (a, b) = (x.value(0)?, x.value(1)?);
        let len = a.len().max(b.len());
        if (a.len() != len && a.len() != 1) || (b.len() != len && b.len() != 1) {
            return None;
        }
        Some(
            (0..len)
                .map(|i| {
                    let p = a.get(i).or(a.first())?.as_ref()?;
                    let q = b.get(i).or(b.first())?.as_ref()?;
                    f(p, q)
                })
                .collect(),
        )
    };
    match n.op_type.as_str() {
        "Shape" => {
            let d = x.dims(0)?;
            Some(d[shape_range(x, d.len())].to_vec())
        }
        "Size" => Some(vec![product(x.dims(0)?)]),
        "Identity" | "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" => {
            // contents unchanged; the result is 0-D or 1-D (only those have contents)
            x.value(0).cloned()
        }
        "Cast" => {
            let to = i32::try_from(x.int("to")?).ok()?;
            matches!(to, dtype::INT64 | dtype::INT32).then(|| x.value(0).cloned())?
        }
        "Concat" => {
            // a part of unknown contents but known length: that many unknown sizes
            let mut out = Vec::new();
            for i in 0..n.inputs.len() {
                if let Some(v) = x.value(i) {
                    out.extend(v.iter().cloned());
                } else {
                    let len = match x.dims(i)?.as_slice() {
                        [] => 1,
                        [d] => usize::try_from(d.as_ref()?.as_const()?).ok()?,
                        _ => return None,
                    };
                    out.extend(std::iter::repeat_n(None, len));
                }
            }
            Some(out)
        }
        "Gather" => {
            let data = x.value(0)?;
            if x.int_or("axis", 0) != 0 || x.dims(0)?.len() != 1 {
                return None;
            }
            let len = data.len() as i64;
            x.ints(1)?
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + len } else { i };
                    data.get(usize::try_from(i).ok()?).cloned()
                })
                .collect()
        }
        "Slice" => {
            let data = x.value(0)?;
            if x.dims(0)?.len() != 1 {
                return None;
            }
            let len = data.len() as i64;
            let s = x.ints(1)?.first().copied()?;
            let e = x.ints(2)?.first().copied()?;
            let step = if x.present(4) {
                x.ints(4)?.first().copied()?
            } else {
                1
            };
            if step != 1 {
                return None;
            }
            let norm =
                |v: i64| usize::try_from((if v < 0 { v + len } else { v }).clamp(0, len)).ok();
            let (s, e) = (norm(s)?, norm(e)?);
            Some(data.get(s..e.max(s))?.to_vec())
        }
        "Add" => elementwise(&|p, q| Some(p.add(q))),
        "Sub" => elementwise(&|p, q| Some(p.sub(q))),
        "Mul" => elementwise(&|p, q| Some(p.mul(q))),
        "Div" => elementwise(&|p, q| {
            let d = q.as_const()?;
            if let Some(c) = p.as_const() {
                // integer division truncates
                return c.checked_div(d).map(Poly::constant);
            }
            p.div_exact(q)
        }),
        "Max" if n.inputs.len() == 2 => elementwise(&|p, q| p.max(q)),
        "Neg" => Some(
            x.value(0)?
                .iter()
                .map(|v| Some(v.as_ref()?.scale(-1)))
                .collect(),
        ),
        "Constant" => match n.attr("value") {
            Some(AttrValue::Tensor(t)) => super::tensor_ints(t),
            _ => match n.attr("value_ints").or(n.attr("value_int")) {
                Some(AttrValue::Ints(v)) => Some(v.iter().map(|&c| fixed(c)).collect()),
                Some(AttrValue::Int(v)) => Some(vec![fixed(*v)]),
                _ => None,
            },
        },
        _ => None,
    }
}
