/*
 * hip_compat.h — the portability header of the GPU backend (spec platform.md §1, Appendix A).
 *
 * The backend is written in the HIP dialect.  On AMD it compiles against the real HIP headers
 * (hipcc / amdclang++ / clang++ -x hip, --offload-arch=gfx1151 by default).  On NVIDIA it compiles
 * with `nvcc -x cu` against the CUDA runtime: the HIP names the backend uses are mapped onto CUDA
 * here, because the vendor's nvidia_detail headers do not compile with CUDA 12/13 (platform.md
 * §1.3).  Add a name here when the backend starts using it.
 *
 * Every kernel assumes 32-lane warps (GPU_WARP): NVIDIA always, RDNA (gfx10/11/12) in its default
 * wave32 mode.  Wave64 targets (GCN/CDNA gfx9, or -mwavefrontsize64) are refused at compile time.
 * Nothing here enables fast-math; the backend is built without it (platform.md §0.6).
 */
#ifndef DS4_HIP_COMPAT_H
#define DS4_HIP_COMPAT_H

#if defined(__HIP_PLATFORM_AMD__) || (defined(__HIP__) && !defined(__CUDACC__))
#define GPU_AMD 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define GPU_PLATFORM "hip"
#define GPU_RUNTIME_NAME "ROCm" /* in messages, as engine/gpu.py names the runtime */
#elif defined(__CUDACC__)
#define GPU_NVIDIA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define GPU_PLATFORM "cuda"
#define GPU_RUNTIME_NAME "CUDA"
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaGraph_t hipGraph_t;
typedef cudaGraphExec_t hipGraphExec_t;
#define hipSuccess cudaSuccess
#define hipErrorNoDevice cudaErrorNoDevice
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipSetDevice cudaSetDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipDriverGetVersion cudaDriverGetVersion
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(p, n, f) cudaHostAlloc((p), (n), (f))
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostFree cudaFreeHost
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDisableTiming cudaEventDisableTiming
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyToSymbol cudaMemcpyToSymbol
#define hipMemcpy2DAsync cudaMemcpy2DAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemGetInfo cudaMemGetInfo
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipStreamCreate cudaStreamCreate
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphDestroy cudaGraphDestroy
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttribute cudaFuncAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipLaunchKernelGGL(k, g, b, shm, st, ...) k<<<(g), (b), (shm), (st)>>>(__VA_ARGS__)
#else
#error "compile the GPU backend with hipcc / clang -x hip (AMD) or nvcc -x cu (NVIDIA)"
#endif

#include <stdint.h>

/* Lanes per warp that every kernel is written for. */
#define GPU_WARP 32

/* Refuse wave64 device code: GCN/CDNA (gfx9) runs 64-lane wavefronts only, and RDNA can be forced
 * to them with -mwavefrontsize64.  (__AMDGCN_WAVEFRONT_SIZE is deprecated in newer clang; the
 * __GFX9__ family macro covers that case.) */
#if defined(GPU_AMD) && defined(__HIP_DEVICE_COMPILE__)
#if defined(__GFX9__)
#error "wave64 target (GCN/CDNA gfx9): the ds4tui kernels assume 32-lane warps; build for RDNA (gfx10/11/12)"
#endif
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#if __AMDGCN_WAVEFRONT_SIZE__ != 32
#error "wave64 device code: the ds4tui kernels assume 32-lane warps (drop -mwavefrontsize64)"
#endif
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#if __AMDGCN_WAVEFRONT_SIZE != 32
#error "wave64 device code: the ds4tui kernels assume 32-lane warps (drop -mwavefrontsize64)"
#endif
#endif
#endif

/* The warp shuffles and __byte_perm.  On AMD they are HIP's own device functions: a shuffle is a
 * ds_bpermute to a lane index that HIP computes from the lane id, the source lane or mask and the
 * width (below); __byte_perm picks bytes of the 8-byte pair (y:x) by the low 3 bits of each
 * selector nibble.  On NVIDIA they are CUDA's intrinsics, unless the library is built with
 * DS4_GPU_ROCM_FORMULAS (build_native.py: DS4TUI_GPU_ROCM_FORMULAS=1): then the H200 runs the same
 * lane and byte arithmetic as a ROCm build, with CUDA's shuffle only as the lane permute, so that
 * the GPU tests there execute the AMD branch logic.  The formulas, as ROCm states them:
 *   shfl(v, src, w):      lane = src + (self & ~(w - 1))
 *   shfl_xor(v, mask, w): lane = self ^ mask, or self when that is at or past the end of self's
 *                         w-lane group ((self + w) & ~(w - 1))
 *   bpermute(addr, v):    v of lane (addr / 4) modulo the wave size
 *   byte_perm(x, y, s):   byte i of the result = byte ((s >> 4i) & 7) of y:x (x the low word) */
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
__device__ __forceinline__ int gpu_lane_id_(void) {
    int l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}
/* ds_bpermute_b32 on a 32-lane wave: the byte address selects lane (addr >> 2) mod 32. */
__device__ __forceinline__ int gpu_bpermute_(int addr, int v) {
    return __shfl_sync(0xffffffffu, v, (addr >> 2) & (GPU_WARP - 1), GPU_WARP);
}
__device__ __forceinline__ int gpu_shfl_int_(int v, int src) {
    const int self = gpu_lane_id_();
    return gpu_bpermute_((src + (self & ~(GPU_WARP - 1))) << 2, v);
}
__device__ __forceinline__ int gpu_shfl_xor_int_(int v, int mask) {
    const int self = gpu_lane_id_();
    int lane = self ^ mask;
    if (lane >= ((self + GPU_WARP) & ~(GPU_WARP - 1))) lane = self;
    return gpu_bpermute_(lane << 2, v);
}
#endif

/* Butterfly exchange within a 32-lane warp (all lanes participate). */
__device__ __forceinline__ float gpu_shfl_xor(float v, int mask) {
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
    return __int_as_float(gpu_shfl_xor_int_(__float_as_int(v), mask));
#elif defined(GPU_NVIDIA)
    return __shfl_xor_sync(0xffffffffu, v, mask, GPU_WARP);
#else
    return __shfl_xor(v, mask, GPU_WARP); /* maskless form: no 32/64-bit mask type question */
#endif
}

/* Lane `src`'s v (all lanes participate). */
__device__ __forceinline__ float gpu_shfl(float v, int src) {
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
    return __int_as_float(gpu_shfl_int_(__float_as_int(v), src));
#elif defined(GPU_NVIDIA)
    return __shfl_sync(0xffffffffu, v, src, GPU_WARP);
#else
    return __shfl(v, src, GPU_WARP);
#endif
}

__device__ __forceinline__ int gpu_shfl_xor_int(int v, int mask) {
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
    return gpu_shfl_xor_int_(v, mask);
#elif defined(GPU_NVIDIA)
    return __shfl_xor_sync(0xffffffffu, v, mask, GPU_WARP);
#else
    return __shfl_xor(v, mask, GPU_WARP);
#endif
}

/* Lane `src`'s v (all lanes participate), integers. */
__device__ __forceinline__ int gpu_shfl_int(int v, int src) {
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
    return gpu_shfl_int_(v, src);
#elif defined(GPU_NVIDIA)
    return __shfl_sync(0xffffffffu, v, src, GPU_WARP);
#else
    return __shfl(v, src, GPU_WARP);
#endif
}

/* Bit l set when lane l's pred is non-zero (all lanes participate; 32 lanes, so the AMD ballot's
 * upper word is zero). */
__device__ __forceinline__ uint32_t gpu_ballot(int pred) {
#if defined(GPU_NVIDIA)
    return __ballot_sync(0xffffffffu, pred);
#else
    return (uint32_t)__ballot(pred);
#endif
}

/* Set bits of a 32-bit word. */
__device__ __forceinline__ int gpu_popc(uint32_t m) { return __popc(m); }

/* Bytes of the pair (y:x) picked by the selector nibbles of s (CUDA's default mode; HIP's). */
__device__ __forceinline__ uint32_t gpu_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)
    const uint64_t pair = (uint64_t)y << 32 | x;
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) r |= (uint32_t)((pair >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#else
    return __byte_perm(x, y, s);
#endif
}

/* Order the memory operations of a warp's lanes (lane results written for other lanes to read). */
__device__ __forceinline__ void gpu_syncwarp(void) {
#if defined(GPU_NVIDIA)
    __syncwarp();
#else
    __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront");
    __builtin_amdgcn_wave_barrier();
#endif
}

/* Sum over the 32 lanes of a warp, the same butterfly order on every target; every lane gets it. */
__device__ __forceinline__ float gpu_warp_sum(float v) {
    for (int m = GPU_WARP / 2; m > 0; m >>= 1) v += gpu_shfl_xor(v, m);
    return v;
}

/* c + dot(a, b) over four signed 8-bit lanes (dp4a / v_dot4). */
__device__ __forceinline__ int gpu_dp4a(int a, int b, int c) {
#if defined(GPU_NVIDIA)
    return __dp4a(a, b, c);
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) ||           \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1152__) || defined(__gfx1153__) ||             \
    defined(__gfx1200__) || defined(__gfx1201__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false); /* v_dot4_i32_iu8, both signed */
#elif defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__)
    return __builtin_amdgcn_sdot4(a, b, c, false); /* v_dot4_i32_i8 */
#else
    const signed char *x = (const signed char *)&a, *y = (const signed char *)&b;
    return c + x[0] * y[0] + x[1] * y[1] + x[2] * y[2] + x[3] * y[3];
#endif
}

#endif /* DS4_HIP_COMPAT_H */
