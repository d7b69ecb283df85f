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

/// Bytes per element, or None for types without a fixed byte size (strings, 4-bit types).
pub fn item_size(dtype: i32) -> Option<usize> {
    match dtype {
        UINT8 | INT8 | BOOL => Some(1),
        17..=20 | 23 => Some(1), // float8 variants, float8e8m0
        UINT16 | INT16 | FLOAT16 | BFLOAT16 => Some(2),
        FLOAT | INT32 | UINT32 => Some(4),
        INT64 | DOUBLE | UINT64 | COMPLEX64 => Some(8),
        COMPLEX128 => Some(16),
        _ => None,
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
        _ => "other",
    }
}
