//! Direct peer access between two GPUs of one process (`cuCtxEnablePeerAccess`): without it a
//! copy between GPUs is staged through host memory by the driver; with it the copy engines move
//! the bytes over NVLink or PCIe peer-to-peer, which is what NCCL's P2P transport uses and what
//! the node-local baseline has to measure.

use std::collections::BTreeSet;
use std::sync::Mutex;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

use crate::cuda::{Device, GpuError};

/// Pairs (accessor, owner) enabled by this process; enabling is once per context pair.
static ENABLED: Mutex<BTreeSet<(usize, usize)>> = Mutex::new(BTreeSet::new());

impl Device {
    /// Whether this GPU can map `peer`'s memory directly (`cuDeviceCanAccessPeer`).
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool, GpuError> {
        if peer.index() == self.index() {
            return Ok(true);
        }
        let mut can: std::ffi::c_int = 0;
        // SAFETY: `can` is a valid out pointer; both device handles come from retained contexts.
        unsafe {
            sys::cuDeviceCanAccessPeer(
                &mut can,
                self.context().cu_device(),
                peer.context().cu_device(),
            )
        }
        .result()
        .map_err(|e| self.err("cuDeviceCanAccessPeer", e))?;
        Ok(can != 0)
    }

    /// Lets this GPU's context read and write `peer`'s memory directly. Returns `false` (and
    /// changes nothing) when the driver reports no peer route between the two, so the caller
    /// can say that copies will be staged through the host; `true` once enabled (also when an
    /// earlier call or another library enabled it already).
    pub fn enable_peer_access(&self, peer: &Device) -> Result<bool, GpuError> {
        if peer.index() == self.index() {
            return Ok(true);
        }
        let key = (self.index(), peer.index());
        let mut enabled = ENABLED.lock().unwrap_or_else(|p| p.into_inner());
        if enabled.contains(&key) {
            return Ok(true);
        }
        if !self.can_access_peer(peer)? {
            return Ok(false);
        }
        self.make_current()?;
        // SAFETY: this GPU's primary context is current on this thread; the peer's context is
        // retained by `peer` for the call. Enabling is idempotent at the driver level (a second
        // call answers PEER_ACCESS_ALREADY_ENABLED, handled below).
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.context().cu_ctx(), 0) };
        match r {
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                enabled.insert(key);
                Ok(true)
            }
            other => Err(self.err("cuCtxEnablePeerAccess", DriverError(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::gpus_or_skip;

    /// On a machine with two GPUs: the answer is stable, and enabling twice is fine.
    #[test]
    fn peer_access_is_enabled_once_and_reported() {
        let Some(gpus) = gpus_or_skip("peer access between GPU 0 and GPU 1", 2) else {
            return;
        };
        let (a, b) = (&gpus[0], &gpus[1]);
        let can = a.can_access_peer(b).unwrap();
        assert_eq!(a.enable_peer_access(b).unwrap(), can);
        assert_eq!(a.enable_peer_access(b).unwrap(), can);
        assert!(a.enable_peer_access(a).unwrap());
    }
}
