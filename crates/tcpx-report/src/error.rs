//! [`Error`]: why a report file, a tuned file, a chart or a CSV file could not be written or
//! read. Every message names the file and what to check.
//!
//! A variant that adds what was being done to another error ([`Error::Context`]) carries the
//! whole chain of that error in its own message and has no `source()`: `{}` and `{:#}` print
//! the same text, whether the error is printed here or after `?` into `anyhow` (no part is
//! printed twice). Errors of the libraries below (IO, CSV, JSON) passed on unchanged are
//! transparent: their message and sources are theirs.

/// Why a report file, a tuned file, a chart or a CSV file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An IO call failed: what was being done, the IO error, and a hint for the usual causes (a
    /// full disk, a directory that cannot be written, a read-only file system; empty when none
    /// applies).
    #[error("{doing}: {error}{hint}")]
    Io {
        doing: String,
        error: std::io::Error,
        hint: String,
    },
    /// What was being done when `cause` happened: `<context>: <cause and its causes>`.
    #[error("{context}: {}", chain(.cause))]
    Context { context: String, cause: Box<Error> },
    /// A path, a file's contents or a value refused: a link, a FIFO or device, a CSV file with
    /// another header, a variable name or value a tuned file may not hold, a file too large. The
    /// message says what to do instead.
    #[error("{0}")]
    Refused(String),
    /// A row that could not be appended whole, or a file that could not be encoded.
    #[error("{0}")]
    Write(String),
    /// A chart that could not be drawn.
    #[error("{0}")]
    Chart(String),
    /// An IO error passed on as it is.
    #[error(transparent)]
    RawIo(#[from] std::io::Error),
    /// A CSV encoding error passed on as it is.
    #[error(transparent)]
    Csv(#[from] csv::Error),
    /// A JSON encoding or parsing error passed on as it is.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) use tcpx_model::error_chain as chain;

/// Adds what was being done to an error ([`Error::Context`]), as `anyhow`'s `with_context`
/// did.
pub(crate) trait Context<T> {
    fn with_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn with_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: context().into(),
            cause: Box::new(e.into()),
        })
    }
}

/// `Err(Error::Refused(format!(...)))`.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_prints_its_whole_chain_once() {
        let inner: Result<()> = Err(Error::Refused("inner".into()));
        let e = inner.with_context(|| "middle").with_context(|| "outer");
        let e = e.unwrap_err();
        assert_eq!(e.to_string(), "outer: middle: inner");
        assert_eq!(format!("{e:#}"), "outer: middle: inner");
        let a = anyhow::Error::from(e).context("caller");
        assert_eq!(format!("{a:#}"), "caller: outer: middle: inner");
    }
}
