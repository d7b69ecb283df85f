//! Weight-only quantization at export (`to_onnx(quantize=...)`): which weights products read, and
//! their quantized forms (computed by the writer as it streams, see `fastonnx_core::tensor::quantize`).

use std::path::PathBuf;

use fastonnx_core::passes::{
    quantizable_experts, quantizable_weights, quantize_weights, QuantizeSettings, ShardSource,
};
use fastonnx_core::tensor::quantize::{BlockQuant, Form};
use pyo3::prelude::*;

use crate::{py_err, GraphBuilder, GraphError};

/// A weight to quantize and, when its bytes are to be read from a checkpoint shard, (shard path,
/// offset, stored ONNX float type).
type Chosen = (String, Option<(PathBuf, u64, i32)>);

#[pymethods]
impl GraphBuilder {
    /// The 2-D float weights MatMul / Gemm products read (the forms `quantize_weights` rewrites):
    /// (initializer, N, K, products reading it), in graph order.
    fn quantizable_weights(&self) -> Vec<(String, i64, i64, usize)> {
        quantizable_weights(&self.model)
    }

    /// The expert weights of `com.microsoft.MoE` nodes (QMoE at the "onnxruntime" level): (fc1, fc2,
    /// experts, hidden size, intermediate size), in graph order. `quantizable_weights` lists them too.
    fn quantizable_experts(&self) -> Vec<(String, String, usize, usize, usize)> {
        quantizable_experts(&self.model)
    }

    /// Quantizes the weights `chosen` per block: each is (initializer, None or (shard path, offset,
    /// stored ONNX float type)) — its bytes are read from its own memory or from the shard as the file
    /// is written. `form` is "dequantize" (DequantizeLinear -> MatMul, opset 21) or "matmulnbits"
    /// (com.microsoft.MatMulNBits). `gather_codes`: in the MatMulNBits form, a tied table's Gathers read
    /// its head's codes (GatherBlockQuantized) and the float table goes. Returns (weight, bytes of its
    /// quantized tensors, products, Gathers reading its codes).
    #[pyo3(signature = (chosen, bits, block_size, symmetric, form, accuracy_level = None, gather_codes = false))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the list as an owned value
    #[allow(clippy::too_many_arguments)] // the Python method's keywords, one by one
    fn quantize_weights(
        &mut self,
        chosen: Vec<Chosen>,
        bits: u32,
        block_size: usize,
        symmetric: bool,
        form: &str,
        accuracy_level: Option<i64>,
        gather_codes: bool,
    ) -> PyResult<Vec<(String, usize, usize, usize)>> {
        let form = match form {
            "dequantize" => Form::Dequantize,
            "matmulnbits" => Form::MatMulNBits,
            other => {
                return Err(GraphError::new_err(format!(
                    "unknown quantized form {other:?}: 'dequantize' or 'matmulnbits'"
                )))
            }
        };
        let quant = BlockQuant::new(bits, block_size, symmetric).map_err(py_err)?;
        let mut items = Vec::with_capacity(chosen.len());
        for (name, shard) in chosen {
            let shard = match shard {
                None => None,
                Some((path, offset, dtype)) => {
                    let file = std::fs::File::open(&path).map_err(|e| {
                        GraphError::new_err(format!(
                            "weight {name:?}: cannot open {}: {e}",
                            path.display()
                        ))
                    })?;
                    Some(ShardSource {
                        file,
                        offset,
                        dtype,
                    })
                }
            };
            items.push((name, shard));
        }
        let settings = QuantizeSettings {
            quant,
            form,
            accuracy_level,
            gather_codes,
        };
        quantize_weights(&mut self.model, items, &settings).map_err(py_err)
    }
}
