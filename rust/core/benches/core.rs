//! Criterion benches of the core: building a large graph, optimizing it, and writing weights.
//! Run with `cargo bench -p fastonnx-core`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastonnx_core::passes::{self, optimize, Level};
use fastonnx_core::{dtype, writer, Model, TensorData};

/// A chain of `n` nodes (Add with a shared constant, Identity every tenth) over one input.
fn chain(n: usize) -> Model {
    let mut m = Model::new(20, 9, "bench");
    let g = &mut m.graph;
    let mut x = g.add_input("x", dtype::FLOAT, None);
    let one = g
        .add_constant("one", dtype::FLOAT, vec![], 1f32.to_le_bytes().to_vec())
        .expect("constant");
    for i in 0..n {
        let op = if i % 10 == 0 { "Identity" } else { "Add" };
        let inputs = if op == "Add" {
            vec![x.clone(), one.clone()]
        } else {
            vec![x.clone()]
        };
        x = g
            .add_node(op, "", inputs, &["v".to_owned()], vec![], None)
            .expect("node")
            .remove(0);
    }
    g.set_type(
        &x,
        fastonnx_core::ValueType {
            dtype: Some(dtype::FLOAT),
            shape: None,
            sequence: false,
        },
    )
    .expect("type");
    g.add_output(&x, Some("y")).expect("output");
    m
}

type Pass = fn(&mut fastonnx_core::Graph) -> usize;

fn builder(c: &mut Criterion) {
    c.bench_function("builder: add 100k nodes", |b| {
        b.iter(|| black_box(chain(100_000)));
    });
    c.bench_function("lookup: dtype of 100k values", |b| {
        let m = chain(100_000);
        let names: Vec<String> = m.graph.nodes.iter().map(|n| n.outputs[0].clone()).collect();
        b.iter(|| {
            names
                .iter()
                .filter(|n| m.graph.value_type(n).is_some())
                .count()
        });
    });
    let passes: [(&str, Pass); 5] = [
        ("constant folding", passes::fold_constants),
        ("no-op removal", passes::mark_noops),
        ("CSE", passes::eliminate_common_subexpressions),
        ("identity removal", passes::remove_identities),
        ("unused removal", passes::remove_unused_nodes),
    ];
    for (name, pass) in passes {
        c.bench_function(&format!("pass: {name} on 10k nodes"), |b| {
            b.iter_batched(
                || chain(10_000),
                |mut m| black_box(pass(&mut m.graph)),
                criterion::BatchSize::LargeInput,
            );
        });
    }
    c.bench_function("passes: all of optimize=True on 10k nodes", |b| {
        b.iter_batched(
            || chain(10_000),
            |mut m| black_box(optimize(&mut m.graph, Level::Default, 20)),
            criterion::BatchSize::LargeInput,
        );
    });
}

fn writer_bench(c: &mut Criterion) {
    const WEIGHTS: usize = 1 << 30;
    let mut m = chain(10_000);
    let per = WEIGHTS / 16;
    for i in 0..16 {
        m.graph
            .add_initializer(
                &format!("w{i}"),
                dtype::UINT8,
                vec![per as i64],
                TensorData::Owned(vec![1; per]),
                None,
            )
            .expect("weight");
    }
    let dir = std::env::var("FASTONNX_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".to_owned());
    let path = std::path::Path::new(&dir).join("fastonnx-bench.onnx");
    let mut group = c.benchmark_group("writer");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(WEIGHTS as u64));
    group.bench_function("1 GiB + 10k nodes, inline", |b| {
        b.iter(|| writer::save(&m, &path, Some(false), None).expect("save"));
    });
    group.bench_function("1 GiB + 10k nodes, external data", |b| {
        b.iter(|| writer::save(&m, &path, Some(true), None).expect("save"));
    });
    group.finish();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("onnx.data"));
}

/// Owned bytes lent to a tensor as if they were a torch storage.
struct Bytes(Vec<u8>);

impl fastonnx_core::ByteSource for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

fn transpose_bench(c: &mut Criterion) {
    // a Llama 2048-hidden MLP projection (2048 x 5632 float32, 46 MB), written transposed to a sink
    let (rows, cols) = (2048usize, 5632usize);
    let data = TensorData::Transposed {
        source: std::sync::Arc::new(Bytes(vec![3u8; rows * cols * 4])),
        dims: vec![rows, cols],
        perm: vec![1, 0],
        item: 4,
    };
    let mut group = c.benchmark_group("transpose");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((rows * cols * 4) as u64));
    group.bench_function("2048x5632 f32 to a sink", |b| {
        b.iter(|| data.write_to(&mut std::io::sink()).expect("write"));
    });
    // the same bytes as batched expert weights read as [experts, out, in], and through general
    // permutations: a 3-D one that reverses the axes (a convolution's [out, in, k] -> [k, in, out])
    // and a 4-D one
    for (name, dims, perm) in [
        (
            "8x2048x704 f32 perm [0, 2, 1]",
            vec![8, 2048, 704],
            vec![0, 2, 1],
        ),
        (
            "1024x1408x8 f32 perm [2, 1, 0]",
            vec![1024, 1408, 8],
            vec![2, 1, 0],
        ),
        (
            "16x64x88x128 f32 perm [2, 0, 3, 1]",
            vec![16, 64, 88, 128],
            vec![2, 0, 3, 1],
        ),
    ] {
        let data = TensorData::Transposed {
            source: std::sync::Arc::new(Bytes(vec![3u8; rows * cols * 4])),
            dims,
            perm,
            item: 4,
        };
        group.bench_function(name, |b| {
            b.iter(|| data.write_to(&mut std::io::sink()).expect("write"));
        });
    }
    group.finish();
}

fn transposed_writer_bench(c: &mut Criterion) {
    // Llama-like projections stored transposed (the writer transposes them as it writes): square,
    // wide, tall and a vocabulary-sized one, 174 MB of float32 in all
    let mut m = chain(1000);
    let mut bytes = 0;
    for (i, (rows, cols)) in [
        (2048usize, 2048usize),
        (2048, 5632),
        (5632, 2048),
        (32000, 512),
    ]
    .into_iter()
    .enumerate()
    {
        let data = TensorData::Transposed {
            source: std::sync::Arc::new(Bytes(vec![(i + 1) as u8; rows * cols * 4])),
            dims: vec![rows, cols],
            perm: vec![1, 0],
            item: 4,
        };
        bytes += rows * cols * 4;
        m.graph
            .add_initializer(
                &format!("wt{i}"),
                dtype::FLOAT,
                vec![cols as i64, rows as i64],
                data,
                None,
            )
            .expect("weight");
    }
    let dir = std::env::var("FASTONNX_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".to_owned());
    let path = std::path::Path::new(&dir).join("fastonnx-bench-t.onnx");
    let mut group = c.benchmark_group("writer");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("174 MB transposed, inline", |b| {
        b.iter(|| writer::save(&m, &path, Some(false), None).expect("save"));
    });
    group.bench_function("174 MB transposed, external data", |b| {
        b.iter(|| writer::save(&m, &path, Some(true), None).expect("save"));
    });
    group.finish();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("onnx.data"));
}

criterion_group!(
    benches,
    builder,
    writer_bench,
    transpose_bench,
    transposed_writer_bench
);
criterion_main!(benches);
