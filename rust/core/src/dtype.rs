//! ONNX element types (TensorProto.DataType) and their sizes.

pub const FLOAT: i32 = 1;
pub const UINT8: i32 = 2;
pub const INT8: i32 = 3;
pub const UINT16: i32 = 4;
pub const INT16: i32 = 5;
pub const INT32: i32 = 6;
pub const INT64: i32 = 7;
pub const STRING: i32 = 8;
pub const BOOL: i32 = 9;
pub const FLOAT16: i32 = 10;
pub const DOUBLE: i32 = 11;
pub const UINT32: i32 = 12;
pub const UINT64: i32 = 13;
pub const COMPLEX64: i32 = 14;
pub const COMPLEX128: i32 = 15;
pub const BFLOAT16: i32 = 16;
pub const UINT4: i32 = 21;
pub const INT4: i32 = 22;
pub const FLOAT4E2M1: i32 = 23;
pub const FLOAT8E8M0: i32 = 24;

/// Bytes per element, or None for types without a fixed byte size (strings, 4-bit types).
pub fn item_size(dtype: i32) -> Option<usize> {
    match dtype {
        UINT8 | INT8 | BOOL => Some(1),
        17..=20 | FLOAT8E8M0 => Some(1), // float8 variants
        UINT16 | INT16 | FLOAT16 | BFLOAT16 => Some(2),
        FLOAT | INT32 | UINT32 => Some(4),
        INT64 | DOUBLE | UINT64 | COMPLEX64 => Some(8),
        COMPLEX128 => Some(16),
        _ => None,
    }
}

/// Bytes that hold `numel` elements stored as raw data: packed two per byte (the last one padded
/// with 4 zero bits) for the 4-bit types, `numel * item_size` otherwise; None for strings.
pub fn data_len(dtype: i32, numel: usize) -> Option<usize> {
    match dtype {
        UINT4 | INT4 | FLOAT4E2M1 => Some(numel.div_ceil(2)),
        _ => item_size(dtype).map(|item| numel * item),
    }
}

/// A human-readable name for error messages.
pub fn name(dtype: i32) -> &'static str {
    match dtype {
        FLOAT => "float32",
        UINT8 => "uint8",
        INT8 => "int8",
        UINT16 => "uint16",
        INT16 => "int16",
        INT32 => "int32",
        INT64 => "int64",
        STRING => "string",
        BOOL => "bool",
        FLOAT16 => "float16",
        DOUBLE => "float64",
        UINT32 => "uint32",
        UINT64 => "uint64",
        COMPLEX64 => "complex64",
        COMPLEX128 => "complex128",
        BFLOAT16 => "bfloat16",
        UINT4 => "uint4",
        INT4 => "int4",
        FLOAT4E2M1 => "float4e2m1",
        FLOAT8E8M0 => "float8e8m0",
        _ => "other",
    }
}
