//! The metadata of the ONNX nodes made from one FX node, composed here rather than in Python: an export
//! makes one per FX node, and Python's string formatting was most of the metadata's cost. The keys and
//! the module-stack parts come from `fastonnx.metadata`, computed there once per module stack.

use pyo3::intern;
use pyo3::prelude::*;
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
    if a.is_none()
        || a.is_exact_instance_of::<PyInt>()
        || a.is_exact_instance_of::<PyBool>()
        || a.is_exact_instance_of::<PyFloat>()
        || a.is_exact_instance_of::<PyString>()
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

/// What `fastonnx.metadata` hands over for one FX node call.
pub(crate) struct FxCall<'a, 'py> {
    /// namespace, class hierarchy and name scopes of the module stack, each without the node's part
    /// (the two lists without their closing bracket)
    pub levels: (&'a str, &'a str, &'a str),
    pub name: &'a str,
    pub users: usize,
    /// the target's str, its repr, and its text in the FX printer
    pub target: (&'a str, &'a str, &'a str),
    pub args: &'a Bound<'py, PyAny>,
    pub kwargs: &'a Bound<'py, PyAny>,
}

/// The five values (namespace, class hierarchy, name scopes, FX node text, stack trace order is the
/// caller's) or None when an argument's text must come from torch's printer.
pub(crate) fn values(call: &FxCall<'_, '_>) -> PyResult<Option<[String; 4]>> {
    let (ns, classes, paths) = call.levels;
    let (target, target_repr, printed) = call.target;
    let mut fx = format!(
        "%{} : [num_users={}] = call_function[target={printed}](args = ",
        call.name, call.users
    );
    if !arg_text(call.args, &mut fx)? {
        return Ok(None);
    }
    fx.push_str(", kwargs = ");
    if !arg_text(call.kwargs, &mut fx)? {
        return Ok(None);
    }
    fx.push(')');
    Ok(Some([
        format!("{ns}{}: {target}", call.name),
        format!("{classes}{target_repr}]"),
        format!("{paths}'{}']", call.name),
        fx,
    ]))
}
