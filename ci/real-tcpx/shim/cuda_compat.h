// Force-included into the plugin's CUDA compilations by ci/real-tcpx/build.sh. CUDA 13 made
// cuCtxCreate take a CUctxCreateParams pointer (cuCtxCreate_v4); the plugin calls the older
// three-argument form (only when NCCL_GPUDIRECTTCPX_CUDA_USE_PRIMARY_CTX=0). Map that form onto
// the new one. Part of tcpx-lab's build of the plugin, not of the plugin.
#ifndef TCPX_LAB_CUDA_COMPAT_H_
#define TCPX_LAB_CUDA_COMPAT_H_

#include <cuda.h>

#if CUDA_VERSION >= 13000
static inline CUresult tcpx_lab_cuCtxCreate3(CUcontext* ctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate(ctx, nullptr, flags, dev);
}
#undef cuCtxCreate
#define cuCtxCreate tcpx_lab_cuCtxCreate3
#endif

#endif  // TCPX_LAB_CUDA_COMPAT_H_
