//! [`MeasureError`]: why an NCCL measurement (one rank of a validation run, or the all-reduce
//! child) produced no figures.

use tcpx_ffi::nccl::NcclError;
use tcpx_gpu::GpuError;

/// Why an NCCL measurement produced no figures: NCCL's or the GPU's own account (which says
/// what to check), the step it failed in, or data that arrived wrong.
///
/// [`MeasureError::During`] carries the whole chain of its cause in its own message and has no
/// `source()`, so `{}` and `{:#}` print the same text, here or after `?` into `anyhow`. NCCL's
/// and the GPU's errors are transparent: their message and sources are theirs.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// libnccl could not be loaded, or an NCCL call failed.
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// A GPU could not be opened, or a GPU call failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// What was being done when `cause` happened: `<step>: <cause and its causes>`.
    #[error("{step}: {}", chain(.cause))]
    During {
        step: String,
        cause: Box<MeasureError>,
    },
    /// A rank other than 0 and 1 was asked for.
    #[error("rank {0}: a validation has ranks 0 and 1")]
    NoSuchRank(usize),
    /// A thread that initialised one rank's communicator panicked.
    #[error("an NCCL rank's init thread panicked")]
    InitPanicked,
    /// The bytes checked after the timed runs were not what was sent or summed.
    #[error("{0}")]
    WrongData(String),
}

pub(crate) use tcpx_model::error_chain as chain;

/// Names the step an error happened in ([`MeasureError::During`]).
pub(crate) trait During<T> {
    fn during<S: Into<String>>(self, step: impl FnOnce() -> S) -> Result<T, MeasureError>;
}

impl<T, E: Into<MeasureError>> During<T> for Result<T, E> {
    fn during<S: Into<String>>(self, step: impl FnOnce() -> S) -> Result<T, MeasureError> {
        self.map_err(|e| MeasureError::During {
            step: step().into(),
            cause: Box::new(e.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step and NCCL's own chain, once, in `{}` as in `{:#}` (a GPU error inside an NCCL
    /// error is NCCL's source, as `anyhow` printed it).
    #[test]
    fn a_step_prints_its_causes_chain() {
        let gpu = GpuError::IndexOutOfRange { index: 3, count: 1 };
        let r: Result<(), NcclError> = Err(NcclError::Gpu(gpu.clone()));
        let e = r.during(|| "the checked run").unwrap_err();
        let want = format!("the checked run: {gpu}: {gpu}");
        assert_eq!(e.to_string(), want);
        assert_eq!(format!("{e:#}"), want);
        assert_eq!(format!("{:#}", anyhow::Error::from(e)), want);
    }
}
