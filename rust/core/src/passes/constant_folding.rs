//! Constant folding: nodes whose inputs are all small constants (or whose result follows from static
//! shapes, like Shape) are evaluated here and replaced by a constant. The evaluator covers shape
//! arithmetic and plumbing on small tensors; results over FOLD_LIMIT elements are left to the runtime
//! so that folding never inflates the file.

use std::collections::{HashMap, HashSet};

use super::rewrite::retain_nodes;
use crate::dtype;
use crate::graph::{AttrValue, Dim, Graph, Node};
use crate::tensor::{le_f32s, le_f64s, le_i32s, le_i64s, Tensor, TensorData};

/// Largest result folded, in elements.
const FOLD_LIMIT: usize = 1 << 14;
/// Largest borrowed tensor (a small buffer, not a weight) read, in bytes.
const SMALL_BORROWED: usize = 1 << 12;
/// Largest constant input read, in bytes.
const READ_LIMIT: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq)]
enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

#[derive(Debug, Clone, PartialEq)]
struct Arr {
    dims: Vec<usize>,
    data: Data,
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    fn dtype(&self) -> i32 {
        match self {
            Data::F32(_) => dtype::FLOAT,
            Data::F64(_) => dtype::DOUBLE,
            Data::I64(_) => dtype::INT64,
            Data::I32(_) => dtype::INT32,
            Data::Bool(_) => dtype::BOOL,
        }
    }

    fn as_f64(&self) -> Vec<f64> {
        match self {
            Data::F32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            Data::F64(v) => v.clone(),
            Data::I64(v) => v.iter().map(|x| *x as f64).collect(),
            Data::I32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            Data::Bool(v) => v.iter().map(|x| f64::from(u8::from(*x))).collect(),
        }
    }

    fn as_i64(&self) -> Vec<i64> {
        match self {
            Data::F32(v) => v.iter().map(|x| *x as i64).collect(),
            Data::F64(v) => v.iter().map(|x| *x as i64).collect(),
            Data::I64(v) => v.clone(),
            Data::I32(v) => v.iter().map(|x| i64::from(*x)).collect(),
            Data::Bool(v) => v.iter().map(|x| i64::from(*x)).collect(),
        }
    }

    /// Elements picked by index, in the same type.
    fn pick(&self, idx: &[usize]) -> Data {
        match self {
            Data::F32(v) => Data::F32(idx.iter().map(|&i| v[i]).collect()),
            Data::F64(v) => Data::F64(idx.iter().map(|&i| v[i]).collect()),
            Data::I64(v) => Data::I64(idx.iter().map(|&i| v[i]).collect()),
            Data::I32(v) => Data::I32(idx.iter().map(|&i| v[i]).collect()),
            Data::Bool(v) => Data::Bool(idx.iter().map(|&i| v[i]).collect()),
        }
    }

    fn cast(&self, to: i32) -> Option<Data> {
        Some(match to {
            dtype::FLOAT => Data::F32(self.as_f64().into_iter().map(|x| x as f32).collect()),
            dtype::DOUBLE => Data::F64(self.as_f64()),
            dtype::INT64 => Data::I64(self.as_i64()),
            dtype::INT32 => Data::I32(self.as_i64().into_iter().map(|x| x as i32).collect()),
            dtype::BOOL => Data::Bool(self.as_f64().into_iter().map(|x| x != 0.0).collect()),
            _ => return None,
        })
    }

    fn concat(parts: &[Data]) -> Option<Data> {
        let first = parts.first()?;
        macro_rules! join {
            ($variant:ident) => {{
                let mut out = Vec::new();
                for p in parts {
                    match p {
                        Data::$variant(v) => out.extend_from_slice(v),
                        _ => return None,
                    }
                }
                Data::$variant(out)
            }};
        }
        Some(match first {
            Data::F32(_) => join!(F32),
            Data::F64(_) => join!(F64),
            Data::I64(_) => join!(I64),
            Data::I32(_) => join!(I32),
            Data::Bool(_) => join!(Bool),
        })
    }
}

fn read(t: &Tensor) -> Option<Arr> {
    // constants, and small buffers (rotary frequencies...): a weight is never copied into a result
    let bytes = match &t.data {
        TensorData::Owned(b) => b.as_slice(),
        TensorData::Borrowed(b) if b.bytes().len() <= SMALL_BORROWED => b.bytes(),
        _ => return None,
    };
    if bytes.len() > READ_LIMIT {
        return None;
    }
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|d| usize::try_from(*d).ok())
        .collect::<Option<_>>()?;
    let data = match t.dtype {
        dtype::FLOAT => Data::F32(le_f32s(bytes)),
        dtype::DOUBLE => Data::F64(le_f64s(bytes)),
        dtype::INT64 => Data::I64(le_i64s(bytes)),
        dtype::INT32 => Data::I32(le_i32s(bytes)),
        dtype::BOOL => Data::Bool(bytes.iter().map(|b| *b != 0).collect()),
        _ => return None,
    };
    (data.len() == numel(&dims)).then_some(Arr { dims, data })
}

fn to_bytes(d: &Data) -> Vec<u8> {
    match d {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::Bool(v) => v.iter().map(|x| u8::from(*x)).collect(),
    }
}

fn attr_int(n: &Node, name: &str) -> Option<i64> {
    match n.attr(name) {
        Some(AttrValue::Int(v)) => Some(*v),
        _ => None,
    }
}

fn attr_ints<'a>(n: &'a Node, name: &str) -> Option<&'a [i64]> {
    match n.attr(name) {
        Some(AttrValue::Ints(v)) => Some(v),
        _ => None,
    }
}

fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r.max(1)).contains(&a).then_some(a as usize)
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// For each output element of the broadcast of `shapes`, the flat index into each input.
fn broadcast(shapes: &[&[usize]]) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (k, d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + k];
            if *o == 1 {
                *o = *d;
            } else if *d != 1 && *d != *o {
                return None;
            }
        }
    }
    let total = numel(&out);
    if total > FOLD_LIMIT {
        return None;
    }
    let out_strides = strides(&out);
    let mut maps = Vec::with_capacity(shapes.len());
    for s in shapes {
        let st = strides(s);
        let pad = rank - s.len();
        let idx = (0..total)
            .map(|flat| {
                let mut src = 0;
                for k in 0..s.len() {
                    let coord = (flat / out_strides[pad + k]) % out[pad + k];
                    if s[k] != 1 {
                        src += coord * st[k];
                    }
                }
                src
            })
            .collect();
        maps.push(idx);
    }
    Some((out, maps))
}

fn binary(op: &str, a: &Arr, b: &Arr) -> Option<Arr> {
    let (dims, maps) = broadcast(&[&a.dims, &b.dims])?;
    let (x, y) = (a.data.pick(&maps[0]), b.data.pick(&maps[1]));
    let cmp = |f: &dyn Fn(f64, f64) -> bool| -> Data {
        Data::Bool(
            x.as_f64()
                .iter()
                .zip(y.as_f64())
                .map(|(p, q)| f(*p, q))
                .collect(),
        )
    };
    let data = match op {
        "Equal" => match (&x, &y) {
            (Data::I64(p), Data::I64(q)) => {
                Data::Bool(p.iter().zip(q).map(|(p, q)| p == q).collect())
            }
            _ => cmp(&|p, q| p == q),
        },
        "Less" => cmp(&|p, q| p < q),
        "LessOrEqual" => cmp(&|p, q| p <= q),
        "Greater" => cmp(&|p, q| p > q),
        "GreaterOrEqual" => cmp(&|p, q| p >= q),
        "And" | "Or" | "Xor" => match (&x, &y) {
            (Data::Bool(p), Data::Bool(q)) => Data::Bool(
                p.iter()
                    .zip(q)
                    .map(|(p, q)| match op {
                        "And" => *p && *q,
                        "Or" => *p || *q,
                        _ => *p != *q,
                    })
                    .collect(),
            ),
            _ => return None,
        },
        _ => match (&x, &y) {
            (Data::I64(p), Data::I64(q)) => Data::I64(int_op(op, p, q)?),
            (Data::I32(p), Data::I32(q)) => {
                let (p, q): (Vec<i64>, Vec<i64>) = (
                    p.iter().map(|v| i64::from(*v)).collect(),
                    q.iter().map(|v| i64::from(*v)).collect(),
                );
                Data::I32(int_op(op, &p, &q)?.into_iter().map(|v| v as i32).collect())
            }
            (Data::F32(p), Data::F32(q)) => Data::F32(
                p.iter()
                    .zip(q)
                    .map(|(p, q)| float_op(op, f64::from(*p), f64::from(*q)).map(|v| v as f32))
                    .collect::<Option<_>>()?,
            ),
            (Data::F64(p), Data::F64(q)) => Data::F64(
                p.iter()
                    .zip(q)
                    .map(|(p, q)| float_op(op, *p, *q))
                    .collect::<Option<_>>()?,
            ),
            _ => return None,
        },
    };
    Some(Arr { dims, data })
}

fn int_op(op: &str, p: &[i64], q: &[i64]) -> Option<Vec<i64>> {
    p.iter()
        .zip(q)
        .map(|(a, b)| match op {
            "Add" => a.checked_add(*b),
            "Sub" => a.checked_sub(*b),
            "Mul" => a.checked_mul(*b),
            // ONNX integer Div truncates toward zero, like Rust
            "Div" => a.checked_div(*b),
            "Max" => Some(*a.max(b)),
            "Min" => Some(*a.min(b)),
            _ => None,
        })
        .collect()
}

fn float_op(op: &str, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        "Add" => a + b,
        "Sub" => a - b,
        "Mul" => a * b,
        "Div" => a / b,
        "Max" => a.max(b),
        "Min" => a.min(b),
        "Pow" => a.powf(b),
        _ => return None,
    })
}

fn unary(op: &str, a: &Arr) -> Option<Arr> {
    let data = match (&a.data, op) {
        (Data::Bool(v), "Not") => Data::Bool(v.iter().map(|x| !x).collect()),
        (Data::I64(v), "Neg") => {
            Data::I64(v.iter().map(|x| x.checked_neg()).collect::<Option<_>>()?)
        }
        (Data::I64(v), "Abs") => {
            Data::I64(v.iter().map(|x| x.checked_abs()).collect::<Option<_>>()?)
        }
        (Data::F32(v), _) => {
            let f: fn(f32) -> f32 = match op {
                "Neg" => |x| -x,
                "Abs" => f32::abs,
                "Sqrt" => f32::sqrt,
                "Reciprocal" => |x| 1.0 / x,
                "Floor" => f32::floor,
                "Ceil" => f32::ceil,
                "Cos" => f32::cos,
                "Sin" => f32::sin,
                "Exp" => f32::exp,
                _ => return None,
            };
            Data::F32(v.iter().map(|x| f(*x)).collect())
        }
        _ => return None,
    };
    Some(Arr {
        dims: a.dims.clone(),
        data,
    })
}

/// Batched float32 matrix product of two arrays of rank >= 2 (batch dims broadcast).
fn matmul(a: &Arr, b: &Arr) -> Option<Arr> {
    let (Data::F32(x), Data::F32(y)) = (&a.data, &b.data) else {
        return None;
    };
    let (ra, rb) = (a.dims.len(), b.dims.len());
    if ra < 2 || rb < 2 || a.dims[ra - 1] != b.dims[rb - 2] {
        return None;
    }
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    let (batch, maps) = broadcast(&[&a.dims[..ra - 2], &b.dims[..rb - 2]])?;
    let mut dims = batch.clone();
    dims.extend([m, n]);
    if numel(&dims) > FOLD_LIMIT {
        return None;
    }
    let mut out = Vec::with_capacity(numel(&dims));
    for (ia, ib) in maps[0].iter().zip(&maps[1]) {
        let (xa, yb) = (ia * m * k, ib * k * n);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0f64;
                for t in 0..k {
                    acc += f64::from(x[xa + i * k + t]) * f64::from(y[yb + t * n + j]);
                }
                out.push(acc as f32);
            }
        }
    }
    Some(Arr {
        dims,
        data: Data::F32(out),
    })
}

fn ints_of(a: &Arr) -> Option<Vec<i64>> {
    match &a.data {
        Data::I64(v) => Some(v.clone()),
        Data::I32(v) => Some(v.iter().map(|x| i64::from(*x)).collect()),
        _ => None,
    }
}

fn reshape_dims(input: &[usize], shape: &[i64], allowzero: bool) -> Option<Vec<usize>> {
    let total = numel(input);
    let mut out = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (k, s) in shape.iter().enumerate() {
        match *s {
            -1 if infer.is_none() => {
                infer = Some(k);
                out.push(1);
            }
            0 if !allowzero => out.push(*input.get(k)?),
            v if v >= 0 => out.push(v as usize),
            _ => return None,
        }
    }
    if let Some(k) = infer {
        let rest: usize = out
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != k)
            .map(|(_, d)| *d)
            .product();
        if rest == 0 || !total.is_multiple_of(rest) {
            return None;
        }
        out[k] = total / rest;
    }
    (numel(&out) == total).then_some(out)
}

/// Evaluates one node on constant inputs; None when the op or its arguments are not handled.
fn eval(n: &Node, ins: &[Option<Arr>], g: &Graph) -> Option<Vec<Arr>> {
    let get = |i: usize| ins.get(i).and_then(|a| a.as_ref());
    let one = |a: Arr| Some(vec![a]);
    match n.op_type.as_str() {
        "Shape" => {
            // from the static type: no constant input needed
            let shape = g.value_type(&n.inputs[0])?.shape.as_ref()?;
            let dims: Vec<i64> = shape
                .iter()
                .map(|d| {
                    if let Dim::Fixed(v) = d {
                        Some(*v)
                    } else {
                        None
                    }
                })
                .collect::<Option<_>>()?;
            let r = dims.len() as i64;
            let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
            let start = clamp(attr_int(n, "start").unwrap_or(0));
            let end = clamp(attr_int(n, "end").unwrap_or(r));
            let v: Vec<i64> = dims.get(start..end.max(start))?.to_vec();
            one(Arr {
                dims: vec![v.len()],
                data: Data::I64(v),
            })
        }
        "Identity" => one(get(0)?.clone()),
        "Cast" => {
            let a = get(0)?;
            let to = i32::try_from(attr_int(n, "to")?).ok()?;
            one(Arr {
                dims: a.dims.clone(),
                data: a.data.cast(to)?,
            })
        }
        "Reshape" => {
            let a = get(0)?;
            let shape = ints_of(get(1)?)?;
            let dims = reshape_dims(&a.dims, &shape, attr_int(n, "allowzero") == Some(1))?;
            one(Arr {
                dims,
                data: a.data.clone(),
            })
        }
        "Unsqueeze" => {
            let a = get(0)?;
            let axes = ints_of(get(1)?)?;
            let rank = a.dims.len() + axes.len();
            let mut axes: Vec<usize> = axes
                .iter()
                .map(|x| norm_axis(*x, rank))
                .collect::<Option<_>>()?;
            axes.sort_unstable();
            let mut dims = a.dims.clone();
            for ax in axes {
                if ax > dims.len() {
                    return None;
                }
                dims.insert(ax, 1);
            }
            one(Arr {
                dims,
                data: a.data.clone(),
            })
        }
        "Squeeze" => {
            let a = get(0)?;
            let dims: Vec<usize> = match get(1) {
                Some(ax) => {
                    let axes: Vec<usize> = ints_of(ax)?
                        .iter()
                        .map(|x| norm_axis(*x, a.dims.len()))
                        .collect::<Option<_>>()?;
                    if axes.iter().any(|x| a.dims.get(*x) != Some(&1)) {
                        return None;
                    }
                    a.dims
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !axes.contains(i))
                        .map(|(_, d)| *d)
                        .collect()
                }
                None => a.dims.iter().copied().filter(|d| *d != 1).collect(),
            };
            one(Arr {
                dims,
                data: a.data.clone(),
            })
        }
        "Concat" => {
            let parts: Vec<&Arr> = (0..n.inputs.len()).map(get).collect::<Option<_>>()?;
            let rank = parts.first()?.dims.len();
            let axis = norm_axis(attr_int(n, "axis")?, rank)?;
            if parts.iter().any(|p| p.dims.len() != rank) {
                return None;
            }
            let outer: usize = parts[0].dims[..axis].iter().product();
            let mut dims = parts[0].dims.clone();
            dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
            if numel(&dims) > FOLD_LIMIT {
                return None;
            }
            let mut chunks = Vec::new();
            for o in 0..outer {
                for p in &parts {
                    let inner: usize = p.dims[axis..].iter().product();
                    let idx: Vec<usize> = (o * inner..(o + 1) * inner).collect();
                    chunks.push(p.data.pick(&idx));
                }
            }
            one(Arr {
                dims,
                data: Data::concat(&chunks)?,
            })
        }
        "Gather" => {
            let (a, idx) = (get(0)?, get(1)?);
            let axis = norm_axis(attr_int(n, "axis").unwrap_or(0), a.dims.len())?;
            let indices = ints_of(idx)?;
            let d = a.dims[axis] as i64;
            let outer: usize = a.dims[..axis].iter().product();
            let inner: usize = a.dims[axis + 1..].iter().product();
            let mut dims: Vec<usize> = a.dims[..axis].to_vec();
            dims.extend_from_slice(&idx.dims);
            dims.extend_from_slice(&a.dims[axis + 1..]);
            if numel(&dims) > FOLD_LIMIT {
                return None;
            }
            let mut pick = Vec::with_capacity(numel(&dims));
            for o in 0..outer {
                for &i in &indices {
                    let i = if i < 0 { i + d } else { i };
                    if !(0..d).contains(&i) {
                        return None;
                    }
                    let base = (o * a.dims[axis] + i as usize) * inner;
                    pick.extend(base..base + inner);
                }
            }
            one(Arr {
                dims,
                data: a.data.pick(&pick),
            })
        }
        "Slice" => {
            let a = get(0)?;
            let starts = ints_of(get(1)?)?;
            let ends = ints_of(get(2)?)?;
            let axes: Vec<i64> = match get(3) {
                Some(x) => ints_of(x)?,
                None => (0..starts.len() as i64).collect(),
            };
            let steps: Vec<i64> = match get(4) {
                Some(x) => ints_of(x)?,
                None => vec![1; starts.len()],
            };
            let rank = a.dims.len();
            let mut ranges: Vec<Vec<usize>> = a.dims.iter().map(|d| (0..*d).collect()).collect();
            for k in 0..starts.len() {
                let ax = norm_axis(*axes.get(k)?, rank)?;
                let d = a.dims[ax] as i64;
                let step = *steps.get(k)?;
                if step == 0 {
                    return None;
                }
                let fix = |v: i64, lo: i64, hi: i64| {
                    let v = if v < 0 { v + d } else { v };
                    v.clamp(lo, hi)
                };
                let mut picked = Vec::new();
                if step > 0 {
                    let (s, e) = (fix(starts[k], 0, d), fix(ends[k], 0, d));
                    let mut i = s;
                    while i < e {
                        picked.push(i as usize);
                        i += step;
                    }
                } else {
                    let (s, e) = (fix(starts[k], -1, d - 1), fix(ends[k], -1, d - 1));
                    let mut i = s;
                    while i > e {
                        picked.push(i as usize);
                        i += step;
                    }
                }
                ranges[ax] = picked;
            }
            let dims: Vec<usize> = ranges.iter().map(Vec::len).collect();
            let st = strides(&a.dims);
            let mut idx = vec![0usize];
            for (ax, r) in ranges.iter().enumerate() {
                let step = st[ax];
                idx = idx
                    .iter()
                    .flat_map(|base| r.iter().map(move |i| base + i * step))
                    .collect();
            }
            one(Arr {
                dims,
                data: a.data.pick(&idx),
            })
        }
        "Transpose" => {
            let a = get(0)?;
            let rank = a.dims.len();
            let perm: Vec<usize> = match attr_ints(n, "perm") {
                Some(p) => p
                    .iter()
                    .map(|x| norm_axis(*x, rank))
                    .collect::<Option<_>>()?,
                None => (0..rank).rev().collect(),
            };
            if perm.len() != rank {
                return None;
            }
            let dims: Vec<usize> = perm.iter().map(|p| a.dims[*p]).collect();
            let (src, out) = (strides(&a.dims), strides(&dims));
            let idx: Vec<usize> = (0..numel(&dims))
                .map(|flat| {
                    (0..rank)
                        .map(|k| (flat / out[k]) % dims[k] * src[perm[k]])
                        .sum()
                })
                .collect();
            one(Arr {
                dims,
                data: a.data.pick(&idx),
            })
        }
        "Range" => {
            let (s, l, d) = (get(0)?, get(1)?, get(2)?);
            match (&s.data, &l.data, &d.data) {
                (Data::I64(s), Data::I64(l), Data::I64(d)) => {
                    let (s, l, d) = (*s.first()?, *l.first()?, *d.first()?);
                    if d == 0 {
                        return None;
                    }
                    let count = ((l - s) as f64 / d as f64).ceil().max(0.0) as usize;
                    if count > FOLD_LIMIT {
                        return None;
                    }
                    let v: Vec<i64> = (0..count as i64).map(|i| s + i * d).collect();
                    one(Arr {
                        dims: vec![v.len()],
                        data: Data::I64(v),
                    })
                }
                _ => None,
            }
        }
        "ConstantOfShape" => {
            let dims: Vec<usize> = ints_of(get(0)?)?
                .iter()
                .map(|d| usize::try_from(*d).ok())
                .collect::<Option<_>>()?;
            let total = numel(&dims);
            if total > FOLD_LIMIT {
                return None;
            }
            let value = match n.attr("value") {
                Some(AttrValue::Tensor(t)) => read(t)?,
                None => Arr {
                    dims: vec![1],
                    data: Data::F32(vec![0.0]),
                },
                _ => return None,
            };
            one(Arr {
                dims,
                data: value.data.pick(&vec![0; total]),
            })
        }
        "Expand" => {
            let a = get(0)?;
            let shape: Vec<usize> = ints_of(get(1)?)?
                .iter()
                .map(|d| usize::try_from(*d).ok())
                .collect::<Option<_>>()?;
            let (dims, maps) = broadcast(&[&a.dims, &shape])?;
            one(Arr {
                dims,
                data: a.data.pick(&maps[0]),
            })
        }
        "Where" => {
            let (c, x, y) = (get(0)?, get(1)?, get(2)?);
            let (dims, maps) = broadcast(&[&c.dims, &x.dims, &y.dims])?;
            let Data::Bool(cond) = c.data.pick(&maps[0]) else {
                return None;
            };
            let (xs, ys) = (x.data.pick(&maps[1]), y.data.pick(&maps[2]));
            let pick: Vec<usize> = cond
                .iter()
                .enumerate()
                .map(|(i, c)| if *c { i } else { i + cond.len() })
                .collect();
            let both = Data::concat(&[xs, ys])?;
            one(Arr {
                dims,
                data: both.pick(&pick),
            })
        }
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" | "Equal" | "Less"
        | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor"
            if n.inputs.len() == 2 =>
        {
            one(binary(&n.op_type, get(0)?, get(1)?)?)
        }
        "Neg" | "Abs" | "Not" | "Sqrt" | "Reciprocal" | "Floor" | "Ceil" | "Cos" | "Sin"
        | "Exp" => one(unary(&n.op_type, get(0)?)?),
        "MatMul" => one(matmul(get(0)?, get(1)?)?),
        "ReduceMax" | "ReduceMin" => {
            let axes = match (n.attr("axes"), get(1)) {
                (Some(AttrValue::Ints(a)), _) => a.clone(),
                (None, Some(a)) => ints_of(a)?,
                (None, None) if attr_int(n, "noop_with_empty_axes") == Some(1) => {
                    return one(get(0)?.clone())
                }
                (None, None) => vec![],
                _ => return None,
            };
            let keepdims = attr_int(n, "keepdims") != Some(0);
            one(reduce_extreme(
                get(0)?,
                &axes,
                keepdims,
                n.op_type == "ReduceMax",
            )?)
        }
        _ => None,
    }
}

/// ReduceMax / ReduceMin over `axes` (all when empty), in the input's type; NaN propagates.
fn reduce_extreme(a: &Arr, axes: &[i64], keepdims: bool, max: bool) -> Option<Arr> {
    let rank = a.dims.len();
    let mut reduced = vec![axes.is_empty(); rank];
    for &ax in axes {
        let k = if ax < 0 { ax + rank as i64 } else { ax };
        *reduced.get_mut(usize::try_from(k).ok()?)? = true;
    }
    if a.dims.iter().zip(&reduced).any(|(&d, &r)| r && d == 0) {
        return None; // the extreme of nothing is not defined
    }
    let dims: Vec<usize> = a
        .dims
        .iter()
        .zip(&reduced)
        .filter_map(|(&d, &r)| match (r, keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    // output position of each input element, from a running multi-index
    let values = a.data.as_f64();
    let mut best: Vec<Option<usize>> = vec![None; numel(&dims)];
    let mut index = vec![0usize; rank];
    for (flat, v) in values.iter().enumerate() {
        let mut at = 0;
        for k in 0..rank {
            if !reduced[k] {
                at = at * a.dims[k] + index[k];
            }
        }
        let better = match best[at] {
            None => true,
            Some(b) => {
                let cur = values[b];
                !cur.is_nan() && (v.is_nan() || if max { *v > cur } else { *v < cur })
            }
        };
        if better {
            best[at] = Some(flat);
        }
        for k in (0..rank).rev() {
            index[k] += 1;
            if index[k] < a.dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    let picks: Vec<usize> = best.into_iter().collect::<Option<_>>()?;
    Some(Arr {
        dims,
        data: a.data.pick(&picks),
    })
}

/// Folds every node it can evaluate, in one forward pass (a folded result feeds later folds).
pub fn fold_constants(g: &mut Graph) -> usize {
    let outputs: HashSet<String> = g.outputs.iter().cloned().collect();
    let mut known: HashMap<String, Arr> = HashMap::new();
    let mut folded: HashSet<usize> = HashSet::new();
    let mut new_inits: Vec<Tensor> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.domain.is_empty()
            || n.outputs.len() != 1
            || n.outputs[0].is_empty()
            || outputs.contains(&n.outputs[0])
        {
            continue;
        }
        if n.attrs
            .iter()
            .any(|a| matches!(a.value, AttrValue::Graph(_)))
        {
            continue;
        }
        let ins: Vec<Option<Arr>> = n
            .inputs
            .iter()
            .map(|name| {
                if name.is_empty() {
                    return None;
                }
                known
                    .get(name)
                    .cloned()
                    .or_else(|| g.initializer(name).and_then(read))
            })
            .collect();
        let all_const = n
            .inputs
            .iter()
            .zip(&ins)
            .all(|(name, a)| name.is_empty() || a.is_some());
        if !all_const && n.op_type != "Shape" {
            continue;
        }
        let Some(mut result) = eval(n, &ins, g) else {
            continue;
        };
        let Some(out) = result.pop() else { continue };
        if out.data.len() > FOLD_LIMIT {
            continue;
        }
        new_inits.push(Tensor {
            name: n.outputs[0].clone(),
            dtype: out.data.dtype(),
            dims: out.dims.iter().map(|d| *d as i64).collect(),
            data: TensorData::Owned(to_bytes(&out.data)),
        });
        known.insert(n.outputs[0].clone(), out);
        folded.insert(i);
    }
    let count = folded.len();
    for t in new_inits {
        g.insert_initializer(t);
    }
    retain_nodes(g, |i| !folded.contains(&i));
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixed, GraphExt};

    fn value(g: &Graph, name: &str) -> Arr {
        read(g.initializer(name).expect("folded")).expect("readable")
    }

    #[test]
    fn quantized_weights_stay_quantized() {
        // QDQ: an int8 weight read through DequantizeLinear stays int8 in the file (a float copy
        // would be 4x the bytes and lose the quantization), and so does a QuantizeLinear of constants
        let mut g = Graph::new("g");
        let w = g
            .add_constant("w", dtype::INT8, vec![2, 2], vec![1, 255, 3, 128])
            .expect("test constant");
        let scale = g.f32s(&[2], &[0.5, 0.25]);
        let zp = g
            .add_constant("zp", dtype::INT8, vec![2], vec![0, 1])
            .expect("test constant");
        let dq = g.op_with(
            "DequantizeLinear",
            &[&w, &scale, &zp],
            vec![crate::testing::int("axis", 0)],
        );
        let x = g.f32s(&[2], &[0.3, -1.2]);
        let s = g.f32s(&[], &[0.1]);
        let q = g.op("QuantizeLinear", &[&x, &s]);
        g.outputs.push(dq);
        g.outputs.push(q);
        assert_eq!(fold_constants(&mut g), 0);
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["DequantizeLinear", "QuantizeLinear"]);
        assert_eq!(g.initializer(&w).map(|t| t.dtype), Some(dtype::INT8));
    }

    #[test]
    fn shape_arithmetic_folds() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", dtype::FLOAT, fixed(&[2, 3, 4]));
        let s = g.op("Shape", &[&x]);
        let idx = g.i64s(&[2], &[2, 0]);
        let gat = g.op("Gather", &[&s, &idx]);
        let two = g.i64s(&[], &[2]);
        let mul = g.op("Mul", &[&gat, &two]);
        let ax = g.i64s(&[1], &[0]);
        let un = g.op("Unsqueeze", &[&mul, &ax]);
        let r = g.op("Reshape", &[&x, &un]);
        g.outputs.push(r);
        assert_eq!(fold_constants(&mut g), 4);
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(
            value(&g, &un),
            Arr {
                dims: vec![1, 2],
                data: Data::I64(vec![8, 4])
            }
        );
    }

    #[test]
    fn where_slice_concat_and_broadcast() {
        let mut g = Graph::new("g");
        let a = g.i64s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let s0 = g.i64s(&[1], &[-1]);
        let e0 = g.i64s(&[1], &[i64::MIN]);
        let ax = g.i64s(&[1], &[1]);
        let rev = g.op("Slice", &[&a, &s0, &e0, &ax, &s0]);
        let three = g.i64s(&[], &[3]);
        let lt = g.op("Less", &[&a, &three]);
        let w = g.op("Where", &[&lt, &a, &rev]);
        let out = g.op("Neg", &[&w]);
        g.outputs.push(out);
        assert_eq!(fold_constants(&mut g), 3);
        assert_eq!(value(&g, &rev).data, Data::I64(vec![3, 2, 1, 6, 5, 4]));
        assert_eq!(value(&g, &w).data, Data::I64(vec![1, 2, 1, 6, 5, 4]));
    }

    #[test]
    fn extremes_reduce_in_the_input_type() {
        let a = Arr {
            dims: vec![2, 3],
            data: Data::I64(vec![4, i64::MAX, -2, 7, 0, 1]),
        };
        let max_rows = reduce_extreme(&a, &[-1], true, true).expect("max");
        assert_eq!(max_rows.dims, vec![2, 1]);
        assert_eq!(max_rows.data, Data::I64(vec![i64::MAX, 7]));
        let min_cols = reduce_extreme(&a, &[0], false, false).expect("min");
        assert_eq!(min_cols.dims, vec![3]);
        assert_eq!(min_cols.data, Data::I64(vec![4, 0, -2]));
        let all = reduce_extreme(&a, &[], false, false).expect("all");
        assert_eq!((all.dims, all.data), (vec![], Data::I64(vec![-2])));
        let nan = Arr {
            dims: vec![3],
            data: Data::F32(vec![1.0, f32::NAN, 3.0]),
        };
        let Data::F32(v) = reduce_extreme(&nan, &[0], true, true).expect("nan").data else {
            panic!("type kept")
        };
        assert!(v[0].is_nan());
        let empty = Arr {
            dims: vec![2, 0],
            data: Data::F32(vec![]),
        };
        assert!(reduce_extreme(&empty, &[1], true, true).is_none());
    }

    #[test]
    fn small_transposes_fold() {
        let mut g = Graph::new("g");
        let a = g.i64s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let t = g.op("Transpose", &[&a]);
        let out = g.op("Neg", &[&t]);
        g.outputs.push(out);
        assert_eq!(fold_constants(&mut g), 1);
        assert_eq!(
            value(&g, &t),
            Arr {
                dims: vec![3, 2],
                data: Data::I64(vec![1, 4, 2, 5, 3, 6])
            }
        );
    }
}
