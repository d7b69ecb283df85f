//! The save API's tests, and the model they write (`sample`), which the submodules' tests share.

use std::path::Path;

use prost::Message;

use super::proto::{graph_full, model_header, value_infos};
use super::value_info::encode_value_infos;
use super::*;
use crate::dtype;
use crate::graph::{AttrValue, Attribute, Dim, ValueType};
use crate::infer::Inferred;
use crate::proto::onnx;
use crate::tensor::TensorData;

pub(super) fn sample(weight_len: usize) -> Model {
    let mut m = Model::new(18, 8, "test");
    let g = &mut m.graph;
    let x = g.add_input(
        "x",
        dtype::FLOAT,
        Some(vec![Dim::Sym("n".into()), Dim::Fixed(2)]),
    );
    let w = g
        .add_initializer(
            "w",
            dtype::UINT8,
            vec![weight_len as i64],
            TensorData::Owned((0..weight_len).map(|i| (i % 251) as u8).collect()),
            None,
        )
        .expect("w");
    let c = g
        .add_constant("c", dtype::FLOAT, vec![2], vec![0, 0, 128, 63, 0, 0, 0, 64])
        .expect("c");
    let y = g
        .add_node(
            "Add",
            "",
            vec![x, c],
            &["y".into()],
            vec![Attribute {
                name: "note".into(),
                value: AttrValue::Ints(vec![1, 2]),
            }],
            None,
        )
        .expect("add");
    g.set_type(
        &y[0],
        ValueType {
            dtype: Some(dtype::FLOAT),
            shape: Some(vec![Dim::Sym("n".into()), Dim::Fixed(2)]),
            sequence: false,
        },
    )
    .expect("type");
    g.add_output(&y[0], None).expect("out");
    g.add_output(&w, Some("w_out")).expect("w out");
    m
}

#[test]
fn streamed_bytes_decode_with_prost() {
    let m = sample(3000);
    let bytes = to_bytes(&m).expect("bytes");
    let decoded = onnx::ModelProto::decode(bytes.as_slice()).expect("decode");
    assert_eq!(decoded.ir_version, Some(8));
    let g = decoded.graph.expect("graph");
    assert_eq!(g.node.len(), 2);
    assert_eq!(g.initializer.len(), 2);
    let w = &g.initializer[0];
    assert_eq!(
        w.raw_data.as_deref(),
        Some(m.graph.initializers[0].data.to_vec().as_slice())
    );
    assert_eq!(g.input[0].name.as_deref(), Some("x"));
    // the streamed form decodes to the same message prost builds in one piece (field order differs)
    let mut whole = model_header(&m).expect("header");
    whole.graph =
        Some(graph_full(&m.graph, m.value_info.then(|| Inferred::of(&m)).as_ref()).expect("full"));
    let again = onnx::ModelProto::decode(bytes.as_slice()).expect("decode");
    assert!(again == whole, "streamed model differs from prost's");
    assert!(whole.encode_to_vec().len() == bytes.len());
}

#[test]
fn external_data_is_aligned_and_complete() {
    let dir = tempfile::tempdir().expect("dir");
    let m = sample(3 << 20);
    let path = dir.path().join("m.onnx");
    let info = save(&m, &path, Some(true), None).expect("save");
    assert!(info.external_data && info.external_tensors == 1);
    let data = std::fs::read(dir.path().join("m.onnx.data")).expect("data");
    let decoded =
        onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice()).expect("decode");
    let g = decoded.graph.expect("graph");
    let w = &g.initializer[0];
    let get = |k: &str| {
        w.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(k))
            .and_then(|e| e.value.clone())
            .expect("entry")
    };
    let offset: usize = get("offset").parse().expect("offset");
    let length: usize = get("length").parse().expect("length");
    assert_eq!(offset % ALIGN_LARGE as usize, 0);
    assert_eq!(
        &data[offset..offset + length],
        m.graph.initializers[0].data.to_vec().as_slice()
    );
    // the small constant stays inline
    assert!(g.initializer[1].raw_data.is_some());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(std::result::Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn deferred_weights_leave_holes_in_the_data_file() {
    let dir = tempfile::tempdir().expect("dir");
    let mut m = sample(2 << 20);
    let d = m
        .graph
        .add_deferred_initializer("late", dtype::FLOAT, vec![1024, 1024])
        .expect("deferred");
    m.graph.add_output(&d, None).expect("out");
    m.metadata.insert("k".into(), "v".into());
    assert!(to_bytes(&m).is_err());
    let path = dir.path().join("m.onnx");
    assert!(save(&m, &path, Some(false), None).is_err());
    let info = save(&m, &path, None, None).expect("save");
    assert!(info.external_data && info.external_tensors == 2);
    let data = std::fs::metadata(dir.path().join("m.onnx.data")).expect("data");
    assert_eq!(data.len(), info.data_bytes);
    let decoded =
        onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice()).expect("decode");
    assert_eq!(decoded.metadata_props[0].value.as_deref(), Some("v"));
    let g = decoded.graph.expect("graph");
    let late = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("late"))
        .expect("late");
    assert_eq!(
        late.data_location,
        Some(onnx::tensor_proto::DataLocation::External as i32)
    );
}

fn external_entries(t: &onnx::TensorProto) -> Vec<(String, String)> {
    t.external_data
        .iter()
        .map(|e| {
            (
                e.key.clone().unwrap_or_default(),
                e.value.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn referenced_weights_point_into_their_file_and_write_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let mut m = sample(100);
    let d = m
        .graph
        .add_deferred_initializer("r", dtype::FLOAT, vec![4, 8])
        .expect("deferred");
    m.graph.add_output(&d, None).expect("out");
    assert!(m
        .graph
        .reference_initializer("nope", "shard.safetensors", 8, 128)
        .is_err());
    assert!(m
        .graph
        .reference_initializer("r", "shard.safetensors", 8, 100)
        .is_err());
    assert!(m
        .graph
        .reference_initializer("r", "../shard.safetensors", 8, 128)
        .is_err());
    assert!(m
        .graph
        .reference_initializer("r", "shard.safetensors", 1000, 128)
        .expect("referenced"));
    // an owned (computed or copied) weight is not as stored: it stays to be written
    assert!(!m
        .graph
        .reference_initializer("w", "shard.safetensors", 8, 100)
        .expect("kept"));
    assert!(m
        .graph
        .initializer("w")
        .expect("w")
        .data
        .as_slice()
        .is_some());
    assert!(to_bytes(&m).is_err());
    let path = dir.path().join("m.onnx");
    assert!(save(&m, &path, Some(false), None).is_err());
    let info = save(&m, &path, None, None).expect("save");
    assert!(info.external_data);
    assert_eq!((info.referenced_tensors, info.referenced_bytes), (1, 128));
    // the only external tensor is referenced: no data file of our own
    assert_eq!((info.external_tensors, info.data_path.clone()), (0, None));
    assert_eq!(listing(dir.path()), ["m.onnx"]);
    let decoded =
        onnx::ModelProto::decode(std::fs::read(&path).expect("model").as_slice()).expect("decode");
    let g = decoded.graph.expect("graph");
    let r = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("r"))
        .expect("r");
    assert!(r.raw_data.is_none());
    assert_eq!(
        r.data_location,
        Some(onnx::tensor_proto::DataLocation::External as i32)
    );
    let want = [
        ("location", "shard.safetensors"),
        ("offset", "1000"),
        ("length", "128"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    assert_eq!(external_entries(r), want);
}

pub(super) fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(std::result::Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_hook_error_stops_the_save_and_keeps_the_old_files() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, b"old model").expect("old");
    std::fs::write(dir.path().join("m.onnx.data"), b"old data").expect("old");
    let m = sample(64 << 20);
    for stop_at in [8u64 << 20, u64::MAX] {
        // u64::MAX: every byte written, stopped at the last call before the renames
        let mut last = (0, 0);
        let options = SaveOptions {
            external: Some(true),
            ..SaveOptions::default()
        };
        let err = save_with(&m, &path, &options, &mut |done, total| {
            last = (done, total);
            if done >= stop_at.min(total) {
                return Err(Error::Interrupted("asked".into()));
            }
            Ok(())
        })
        .expect_err("stopped");
        assert!(
            matches!(err, Error::Interrupted(ref m) if m == "asked"),
            "{err}"
        );
        if stop_at == u64::MAX {
            assert_eq!(last.0, last.1);
        } else {
            assert!(
                last.0 >= stop_at && last.0 < stop_at + (4 << 20),
                "{last:?}"
            );
        }
        assert_eq!(std::fs::read(&path).expect("model"), b"old model");
        let data = std::fs::read(dir.path().join("m.onnx.data")).expect("data");
        assert_eq!(data, b"old data");
        assert_eq!(listing(dir.path()), ["m.onnx", "m.onnx.data"]);
    }
}

#[test]
fn the_hook_counts_every_byte_and_durable_saves_write_the_same_files() {
    let dir = tempfile::tempdir().expect("dir");
    let m = sample(5 << 20);
    let mut files = Vec::new();
    for durable in [false, true] {
        let path = dir.path().join(format!("m{durable}.onnx"));
        let mut calls = Vec::new();
        let options = SaveOptions {
            external: Some(true),
            location: Some("w.bin"),
            durable,
        };
        let info = save_with(&m, &path, &options, &mut |done, total| {
            calls.push((done, total));
            Ok(())
        })
        .expect("save");
        let total = info.model_bytes + info.data_bytes;
        assert_eq!(calls.last(), Some(&(total, total)));
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{calls:?}");
        assert!(calls.len() >= 3, "{calls:?}"); // every 2 MiB of the 5 MiB weight, then the end
        files.push(std::fs::read(&path).expect("model"));
        std::fs::rename(
            dir.path().join("w.bin"),
            dir.path().join(format!("w{durable}")),
        )
        .expect("keep");
    }
    assert!(files[0] == files[1]);
    let data: Vec<Vec<u8>> = ["wfalse", "wtrue"]
        .iter()
        .map(|n| std::fs::read(dir.path().join(n)).expect("data"))
        .collect();
    assert!(data[0] == data[1]);
}

#[test]
fn failed_save_leaves_existing_file_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, b"old").expect("old");
    let mut m = sample(10);
    m.graph.outputs.push("ghost".into()); // no type: serialization fails before any rename
    assert!(save(&m, &path, Some(false), None).is_err());
    assert_eq!(std::fs::read(&path).expect("read"), b"old");
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
}

#[test]
fn value_info_types_every_value_nodes_make() {
    let typed = |dims: Vec<Dim>| ValueType {
        dtype: Some(dtype::FLOAT),
        shape: Some(dims),
        sequence: false,
    };
    let mut m = sample(16);
    let x = m.graph.inputs[0].clone();
    let g = &mut m.graph;
    let r = g
        .add_node("Relu", "", vec![x.clone()], &["r".into()], vec![], None)
        .expect("relu");
    g.set_type(&r[0], typed(vec![Dim::Sym("n".into()), Dim::Unknown]))
        .expect("type");
    // the builder knows Neg's dtype only: its shape is inferred (from r's, completed from x's)
    let n = g
        .add_node("Neg", "", r.clone(), &["n".into()], vec![], None)
        .expect("neg");
    let mut body = g.subgraph("then");
    let inner = body
        .add_node("Abs", "", n.clone(), &["inner".into()], vec![], None)
        .expect("abs");
    body.set_type(&inner[0], typed(vec![Dim::Fixed(3)]))
        .expect("type");
    let out = body
        .add_node("Neg", "", inner, &["then_out".into()], vec![], None)
        .expect("neg");
    body.set_type(&out[0], typed(vec![Dim::Fixed(3)]))
        .expect("type");
    body.add_output(&out[0], None).expect("out");
    let cond = g.add_input("c", dtype::BOOL, Some(vec![]));
    let attrs = vec![Attribute {
        name: "then_branch".into(),
        value: AttrValue::Graph(Box::new(body)),
    }];
    let branched = g
        .add_node("If", "", vec![cond], &["branched".into()], attrs, None)
        .expect("if");
    g.set_type(&branched[0], typed(vec![Dim::Fixed(3)]))
        .expect("type");
    g.add_output(&branched[0], None).expect("out");

    let decode = |m: &Model| {
        let bytes = to_bytes(m).expect("bytes");
        onnx::ModelProto::decode(bytes.as_slice())
            .expect("decode")
            .graph
            .expect("graph")
    };
    let names = |infos: &[onnx::ValueInfoProto]| -> Vec<String> {
        infos.iter().filter_map(|v| v.name.clone()).collect()
    };
    let then_branch = |g: &onnx::GraphProto| {
        g.node
            .iter()
            .find(|n| n.op_type.as_deref() == Some("If"))
            .and_then(|n| n.attribute[0].g.clone())
            .expect("then")
    };
    let off = decode(&m);
    assert!(off.value_info.is_empty() && then_branch(&off).value_info.is_empty());

    m.value_info = true;
    let on = decode(&m);
    // graph outputs (y, branched) are typed in `output`
    assert_eq!(names(&on.value_info), ["r", "n"]);
    let dims = match &on.value_info[0]
        .r#type
        .as_ref()
        .and_then(|t| t.value.clone())
    {
        Some(onnx::type_proto::Value::TensorType(t)) => t.shape.clone().expect("shape").dim,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        dims[0].value,
        Some(onnx::tensor_shape_proto::dimension::Value::DimParam(
            "n".into()
        ))
    );
    // the dim the builder left unknown is Relu's input's
    assert_eq!(
        dims[1].value,
        Some(onnx::tensor_shape_proto::dimension::Value::DimValue(2))
    );
    assert_eq!(names(&then_branch(&on).value_info), ["inner"]);
    // the streamed form still decodes to what prost builds in one piece
    let mut whole = model_header(&m).expect("header");
    whole.graph = Some(graph_full(&m.graph, Some(&Inferred::of(&m))).expect("full"));
    let bytes = to_bytes(&m).expect("bytes");
    assert!(onnx::ModelProto::decode(bytes.as_slice()).expect("decode") == whole);
    assert_eq!(whole.encode_to_vec().len(), bytes.len());
}

/// value_info's two forms agree: the bytes `encode_value_infos` writes into the top graph's skeleton
/// are what prost encodes for the messages the subgraphs get.
#[test]
fn the_bytes_are_what_prost_encodes_for_the_messages() {
    let mut m = sample(16);
    let g = &mut m.graph;
    let mut x = g.inputs[0].clone();
    let shapes = [
        Some(vec![]), // a scalar: a shape without dims
        Some(vec![Dim::Fixed(0), Dim::Fixed(1 << 40), Dim::Unknown]),
        Some(vec![Dim::Sym("batch".into()), Dim::Sym("2*seq+1".into())]),
        Some(vec![Dim::Sym("é".repeat(100))]), // a length past one varint byte
        Some(vec![Dim::Unknown, Dim::Fixed(3)]), // a sequence of such tensors
        None,                                  // unknown rank: left out
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        x = g
            .add_node("Relu", "", vec![x], &[format!("v{i}")], vec![], None)
            .expect("node")
            .remove(0);
        let dtype = if i == 1 {
            dtype::BFLOAT16
        } else {
            dtype::INT64
        };
        g.set_type(
            &x,
            ValueType {
                dtype: Some(dtype),
                shape,
                sequence: i == 4,
            },
        )
        .expect("type");
    }
    let none = Inferred::default();
    let messages = value_infos(g, &none);
    assert_eq!(messages.len(), 5);
    assert!(matches!(
        messages[4].r#type.as_ref().and_then(|t| t.value.as_ref()),
        Some(onnx::type_proto::Value::SequenceType(_))
    ));
    let mut bytes = Vec::new();
    assert_eq!(encode_value_infos(g, &none, &mut bytes), 5);
    let prost = onnx::GraphProto {
        value_info: messages,
        ..Default::default()
    };
    assert_eq!(bytes, prost.encode_to_vec());
}
