//! The metadata of the ONNX nodes made from one FX node, composed here rather than in Python (Python's
//! string formatting was most of the metadata's cost), after the passes and only for the FX nodes whose
//! ONNX nodes survived them. The keys and the module-stack and target parts come from
//! `fastonnx.metadata`, computed there once per module stack / target.

use std::collections::HashMap;
use std::fmt::Write;
use std::rc::Rc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

static FX_NODE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DTYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static LAYOUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static MEMORY_FORMAT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DEVICE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    module: &str,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.get_or_try_init(py, || {
        Ok(py
            .import(module)?
            .getattr(name)?
            .cast_into::<PyType>()?
            .unbind())
    })
    .map(|t| t.bind(py))
}

/// Appends an FX argument as torch's FX printer writes it (`%name` for a node, containers with their
/// brackets, `str()` of numbers, strings, None, dtypes, layouts, memory formats and devices without
/// an index). False for any other type: the caller then leaves the whole text to torch.
fn arg_text(a: &Bound<'_, PyAny>, out: &mut String) -> PyResult<bool> {
    let py = a.py();
    // exact type checks: a pointer comparison, where isinstance would go through __instancecheck__
    let ty = a.get_type();
    if ty.is(class(py, &FX_NODE, "torch.fx", "Node")?) {
        out.push('%');
        out.push_str(
            &a.getattr(intern!(py, "name"))?
                .cast_into::<PyString>()?
                .to_cow()?,
        );
        return Ok(true);
    }
    // the commonest arguments written here, without a call to Python's str()
    if a.is_exact_instance_of::<PyInt>() {
        if let Ok(v) = a.extract::<i64>() {
            // writing to a String cannot fail
            let _ = write!(out, "{v}");
            return Ok(true);
        }
    }
    if a.is_exact_instance_of::<PyString>() {
        out.push_str(&a.cast::<PyString>()?.to_cow()?);
        return Ok(true);
    }
    if a.is_none() {
        out.push_str("None");
        return Ok(true);
    }
    if a.is_exact_instance_of::<PyInt>()
        || a.is_exact_instance_of::<PyBool>()
        || a.is_exact_instance_of::<PyFloat>()
        || ty.is(class(py, &DTYPE, "torch", "dtype")?)
        || ty.is(class(py, &LAYOUT, "torch", "layout")?)
        || ty.is(class(py, &MEMORY_FORMAT, "torch", "memory_format")?)
        // a device without an index prints as its str; with one, the printer may shorten it
        || (ty.is(class(py, &DEVICE, "torch", "device")?)
            && a.getattr(intern!(py, "index"))?.is_none())
    {
        out.push_str(&a.str()?.to_cow()?);
        return Ok(true);
    }
    if let Ok(t) = a.cast::<PyTuple>() {
        out.push('(');
        if !items(t.iter(), out)? {
            return Ok(false);
        }
        if t.len() == 1 {
            out.push(',');
        }
        out.push(')');
        return Ok(true);
    }
    if let Ok(l) = a.cast::<PyList>() {
        out.push('[');
        if !items(l.iter(), out)? {
            return Ok(false);
        }
        out.push(']');
        return Ok(true);
    }
    if let Ok(d) = a.cast::<PyDict>() {
        out.push('{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(&k.str()?.to_cow()?);
            out.push_str(": ");
            if !arg_text(&v, out)? {
                return Ok(false);
            }
        }
        out.push('}');
        return Ok(true);
    }
    Ok(false)
}

fn items<'py>(it: impl Iterator<Item = Bound<'py, PyAny>>, out: &mut String) -> PyResult<bool> {
    for (i, x) in it.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if !arg_text(&x, out)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The text of item `i` of a tuple of strings.
fn text(t: &Bound<'_, PyTuple>, i: usize) -> PyResult<PyBackedStr> {
    t.get_item(i)?.extract()
}

/// The three strings of each `(str, str, str)` tuple met, read once per tuple: the module-stack and
/// target parts repeat across FX nodes (one tuple per stack / target). Keyed by the tuple's address,
/// valid while the caller's lists hold the tuples (one `compose_fx_scopes` call).
#[derive(Default)]
pub(crate) struct TupleTexts(HashMap<usize, Rc<[PyBackedStr; 3]>>);

impl TupleTexts {
    pub(crate) fn get(&mut self, t: &Bound<'_, PyAny>) -> PyResult<Rc<[PyBackedStr; 3]>> {
        let key = t.as_ptr() as usize;
        if let Some(v) = self.0.get(&key) {
            return Ok(Rc::clone(v));
        }
        let t = t.cast::<PyTuple>()?;
        let v = Rc::new([text(t, 0)?, text(t, 1)?, text(t, 2)?]);
        self.0.insert(key, Rc::clone(&v));
        Ok(v)
    }
}

/// `node.args` / `node.kwargs` read from the attribute the property returns (`_args`: no Python
/// call), through the property where a torch version has no such attribute.
fn field<'py>(
    node: &Bound<'py, PyAny>,
    stored: &Bound<'py, PyString>,
    property: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    match node.getattr(stored) {
        Ok(v) => Ok(v),
        Err(_) => node.getattr(property),
    }
}

/// The parts joined, allocated once.
fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// The metadata of the ONNX nodes made from the FX call `node`, values in `keys`' order (namespace,
/// class hierarchy, name scopes, FX node text, stack trace), or None when an argument's text (or the
/// stack trace, not a str) must come from torch. `levels` holds the module stack's namespace, class
/// hierarchy and name scopes without the node's part (the two lists without their closing bracket),
/// `target` the target's str, its repr and its text in the FX printer: both are computed once per
/// module stack / target by `fastonnx.metadata`.
pub(crate) fn compose(
    keys: &[String; 5],
    levels: &[PyBackedStr; 3],
    node: &Bound<'_, PyAny>,
    target: &[PyBackedStr; 3],
) -> PyResult<Option<Vec<(String, String)>>> {
    let py = node.py();
    let name = node.getattr(intern!(py, "name"))?;
    let name = name.cast::<PyString>()?.to_cow()?;
    let users = node.getattr(intern!(py, "users"))?.len()?;
    let stack = node
        .getattr(intern!(py, "meta"))?
        .cast_into::<PyDict>()?
        .get_item(intern!(py, "stack_trace"))?;
    let stack = match stack {
        None => String::new(),
        Some(s) if s.is_none() => String::new(),
        Some(s) => match s.cast::<PyString>() {
            Ok(s) => s.to_cow()?.into_owned(),
            Err(_) => return Ok(None),
        },
    };
    let printed = &target[2];
    let mut fx = String::with_capacity(256);
    for part in ["%", &name, " : [num_users="] {
        fx.push_str(part);
    }
    let _ = write!(fx, "{users}"); // writing to a String cannot fail
    for part in ["] = call_function[target=", printed, "](args = "] {
        fx.push_str(part);
    }
    if !arg_text(
        &field(node, intern!(py, "_args"), intern!(py, "args"))?,
        &mut fx,
    )? {
        return Ok(None);
    }
    fx.push_str(", kwargs = ");
    if !arg_text(
        &field(node, intern!(py, "_kwargs"), intern!(py, "kwargs"))?,
        &mut fx,
    )? {
        return Ok(None);
    }
    fx.push(')');
    let [namespace, classes, paths] = levels;
    let values = [
        concat(&[namespace, &name, ": ", &target[0]]),
        concat(&[classes, &target[1], "]"]),
        concat(&[paths, "'", &name, "']"]),
        fx,
        stack,
    ];
    Ok(Some(keys.iter().cloned().zip(values).collect()))
}
