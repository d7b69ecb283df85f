"""The converter library: the building blocks converter families share. Families import only this
package, ``fastonnx.context`` and ``fastonnx.dtypes``, never each other.

- ``kernels``: which dtypes onnxruntime's CPU kernels take (one table), ``compute_dtype``, ``emit``,
  the opmath rule;
- ``ops``: common ONNX forms by opset (Reduce, Squeeze, Split...), ``where``, type promotion, exact
  math pieces (log1p, atan2, hypot, signbit);
- ``shapes``: shape tensors from torch's (symbolic) sizes, slicing, transposes;
- ``random``: uniform draws and dropout masks at every opset;
- ``spatial``: torch's window arguments (int or list), unbatched inputs, ConvTranspose with torch's
  output_padding (convolution, pooling, resampling, pixel rearrangements);
- ``reductions``: reduced-element counts, NaN-aware reductions, vector norms;
- ``matrices``: the unrolled matrix algorithms' building blocks (static sizes, row / column slices,
  masks, LAPACK's info, LU with partial pivoting, triangular substitution, the LU inverse);
- ``float_math``: float formulas in one dtype and float Loops, for the special functions.
- ``attention``: attention's pieces (default scale, grouped-query head repeat, causal mask with an
  offset, closed rows), for torch's scaled_dot_product_attention and torch.onnx.ops' Attention.
"""
