//! The one error type of the core; the Python bindings map each variant to one exception class.

/// Everything that can go wrong while building, optimizing or writing a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The graph is inconsistent: unknown value, bad attribute, buffer of the wrong size.
    #[error("{0}")]
    Graph(String),
    /// The model could not be serialized (bad tensor, bad path).
    #[error("{0}")]
    Serialization(String),
    /// An I/O operation on a file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Inline serialization would produce a protobuf over the 2 GiB limit.
    #[error(
        "the model's protobuf would be {size} bytes, over the 2 GiB protobuf limit; \
         save it with external_data=True (or None, which switches on its own)"
    )]
    TooLarge { size: u64 },
    /// The caller's hook (see [`crate::hook`]) asked the operation to stop (Ctrl-C, in Python).
    #[error("stopped: {0}")]
    Interrupted(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn graph_err(msg: impl Into<String>) -> Error {
    Error::Graph(msg.into())
}

pub(crate) fn io_err(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}
