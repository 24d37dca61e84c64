//! Direct peer access between two GPUs of one process (`cuCtxEnablePeerAccess`): without it a
//! copy between GPUs is staged through host memory by the driver; with it the copy engines move
//! the bytes over NVLink or PCIe peer-to-peer, which is what NCCL's P2P transport uses and what
//! the node-local baseline has to measure.

use std::collections::BTreeMap;
use std::sync::Mutex;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

use crate::cuda::Device;
use crate::GpuError;

/// Whether (accessor, owner) has a peer route, asked of the driver once per pair (the topology
/// does not change under a running process). Whether access is *enabled* is not cached: it
/// belongs to the two primary contexts, which the driver destroys when the last user releases
/// them and creates afresh without peer access (a cache keyed by GPU index made every message
/// size after the first fall back to host staging).
static ROUTE: Mutex<BTreeMap<(usize, usize), bool>> = Mutex::new(BTreeMap::new());

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
    /// earlier call or another library enabled it already). Cheap enough to call before every
    /// copy: an enabled pair answers PEER_ACCESS_ALREADY_ENABLED at once.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<bool, GpuError> {
        if peer.index() == self.index() {
            return Ok(true);
        }
        let key = (self.index(), peer.index());
        let known = ROUTE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        let route = match known {
            Some(r) => r,
            None => {
                let r = self.can_access_peer(peer)?;
                ROUTE
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, r);
                r
            }
        };
        if !route {
            return Ok(false);
        }
        self.make_current()?;
        // SAFETY: this GPU's primary context is current on this thread; the peer's context is
        // retained by `peer` for the call. Enabling is idempotent at the driver level (a second
        // call answers PEER_ACCESS_ALREADY_ENABLED, handled below).
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.context().cu_ctx(), 0) };
        match r {
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
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

    /// The primary contexts are destroyed when the last handle goes and made again without peer
    /// access; enabling afterwards goes to the driver again (nothing cached by GPU index answers
    /// for the new contexts) and the new contexts copy correctly. That the copy then takes the
    /// direct path, not host staging, shows only as speed: `tcpx-gpu-bench peer` and the
    /// cudap2p rows of `scaling.sh peer` measure it.
    #[test]
    fn peer_access_survives_contexts_being_made_again() {
        let Some(gpus) = gpus_or_skip("peer access after the contexts are made again", 2) else {
            return;
        };
        if !gpus[0].can_access_peer(&gpus[1]).unwrap() {
            eprintln!("SKIP: peer access after the contexts are made again: no peer route");
            return;
        }
        assert!(gpus[1].enable_peer_access(&gpus[0]).unwrap());
        drop(gpus);
        let (a, b) = (
            crate::Device::open(0).unwrap(),
            crate::Device::open(1).unwrap(),
        );
        assert!(b.enable_peer_access(&a).unwrap());
        // Enabled now in the new contexts: a peer copy reads correctly.
        let (src, dst) = (a.alloc(1 << 20).unwrap(), b.alloc(1 << 20).unwrap());
        let (sa, sb) = (a.new_stream().unwrap(), b.new_stream().unwrap());
        sa.fill_pattern(&src, 0, 1 << 20, 9, 0).unwrap();
        sa.synchronize().unwrap();
        sb.copy_device(&src, 0, &dst, 0, 1 << 20).unwrap();
        assert_eq!(sb.count_pattern_errors(&dst, 0, 1 << 20, 9, 0).unwrap(), 0);
    }
}
