// common.cuh: small device helpers shared by flash_fwd.cu and naive.cu.
//
// Everything here is a thin wrapper over one PTX instruction (sm_80+), named after it:
//   cp.async (16-byte global -> shared copies with zero fill), ldmatrix (8x8 b16 tiles from shared memory into
//   the mma fragment layout), mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), ex2.approx.
// Compiled both by NVRTC (through CuPy, at run time) and by nvcc (iosim.gpu.compile_check), so it includes only
// the CUDA toolkit's fp16/bf16 headers and nothing from the host standard library.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef INFINITY  // NVRTC has no <math.h>; nvcc gets it from there
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace iosim {

template <typename A, typename B> struct is_same { static constexpr bool value = false; };
template <typename A> struct is_same<A, A> { static constexpr bool value = true; };
template <bool B, typename X, typename Y> struct pick { using type = X; };  // B ? X : Y
template <typename X, typename Y> struct pick<false, X, Y> { using type = Y; };

// fp8 e4m3 as a one-byte storage type (flash3_fwd.cu's fp8 inputs, flash_decode.cu's fp8 KV cache)
struct e4m3 {
    unsigned char bits;
};

// four e4m3 bytes of w (lowest first) as two fp16x2 words (lo: bytes 0, 1; hi: bytes 2, 3), exactly (every e4m3
// value is an fp16 value), each value divided by kE4m3HalfUnit: sm_89+ converts with cvt.rn.f16x2.e4m3x2 (unit 1);
// older GPUs move e4m3's sign, exponent and mantissa bits to fp16's places with integer instructions (exponent bias
// 7 -> 15: the value drops by 2^8, e4m3 subnormals land on fp16 subnormals; unit 256). Callers fold the unit into
// their scales. (e4m3's NaN, 0x7f/0xff, is never written by the quantizer.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr float kE4m3HalfUnit = 1.f;
__device__ __forceinline__ void e4m3x4_to_half2x2(unsigned w, unsigned& lo, unsigned& hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w));
}
__device__ __forceinline__ unsigned e4m3x2_to_half2(unsigned short w) {  // two e4m3 (lower byte first), the same way
    unsigned h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(w));
    return h;
}
#else
constexpr float kE4m3HalfUnit = 256.f;
__device__ __forceinline__ void e4m3x4_to_half2x2(unsigned w, unsigned& lo, unsigned& hi) {
    const unsigned a = __byte_perm(w, 0u, 0x1404u);  // byte 0 -> byte 1, byte 1 -> byte 3, zeros elsewhere
    const unsigned b = __byte_perm(w, 0u, 0x3424u);  // byte 2 -> byte 1, byte 3 -> byte 3
    lo = (a & 0x80008000u) | ((a >> 1) & 0x3f803f80u);
    hi = (b & 0x80008000u) | ((b >> 1) & 0x3f803f80u);
}
__device__ __forceinline__ unsigned e4m3x2_to_half2(unsigned short w) {
    unsigned lo, hi;
    e4m3x4_to_half2x2(w, lo, hi);
    return lo;
}
#endif

// ---------------------------------------------------------------------------------------------------------------
// dtype helpers: pack two fp32 values into one 32-bit register of two fp16/bf16 (low half = first value)
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

template <typename T> __device__ __forceinline__ void unpack2(unsigned v, float& lo, float& hi);  // pack2's inverse
template <> __device__ __forceinline__ void unpack2<__half>(unsigned v, float& lo, float& hi) {
    const float2 f = __half22float2(*reinterpret_cast<__half2*>(&v));
    lo = f.x;
    hi = f.y;
}
template <> __device__ __forceinline__ void unpack2<__nv_bfloat16>(unsigned v, float& lo, float& hi) {
    lo = __uint_as_float(v << 16);  // bf16 is the top half of an fp32: exact, one instruction each
    hi = __uint_as_float(v & 0xffff0000u);
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---------------------------------------------------------------------------------------------------------------
// shared-memory address of a generic pointer (what cp.async and ldmatrix take)
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; bytes past `src_bytes` (0 or 16) are zero-filled, so a predicated-off row
// becomes zeros in shared memory (its source address must still be a valid address; callers clamp it).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4-byte async copy global -> shared (cp.async.ca: the only form below 16 bytes); zero-filled when src_bytes = 0
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix: four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it.
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
// same, each 8x8 matrix transposed on the way (used for V, stored key-major, read as the k-major B operand)
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                                  unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// D = A (16x16, row) * B (16x8, col) + D, fp32 accumulators; T selects the f16 or bf16 instruction.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (is_same<T, __half>::value) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// *p += a, *(p + 1) += b in global memory, done by the L2 (no value returned); p 8-byte aligned. Hopper has a
// two-element reduction instruction; earlier GPUs issue two.
__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// Programmatic dependent launch (sm_90; no-ops before it, and where the host launched the dependent plainly):
// allow_dependent_launch lets the grid launched after this one as its programmatic dependent start once every block
// here has called it or exited; wait_prerequisite_grids blocks a dependent's threads until the grids it depends on
// have completed and their memory operations are visible. Nothing before the wait may read what they write.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; ex2.approx(-inf) = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace iosim

#ifdef IOSIM_BLOCK_TRACE
// Block timeline (compiled only with -DIOSIM_BLOCK_TRACE; iosim.gpu.attention(block_trace=...) sets it): thread 0
// of every thread block writes {start ns, end ns, SM id, 0} (%globaltimer, %smid) to iosim_block_trace[4 * linear
// block id]. The L2 model's drift input (docs/validation.md); one store pair per block, off the hot loop.
__device__ unsigned long long* iosim_block_trace;

namespace iosim {
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long* block_trace_record() {  // this block's 4 slots, or null
    if (threadIdx.x != 0 || iosim_block_trace == nullptr) return nullptr;
    return iosim_block_trace + 4 * (blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
// RAII: start and SM are stored at once (no register held across the kernel); the end when the body returns,
// whichever return it takes.
struct BlockTrace {
    __device__ BlockTrace() {
        if (unsigned long long* rec = block_trace_record()) {
            unsigned smid;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
            rec[0] = global_timer_ns();
            rec[2] = smid;
            rec[3] = 0;
        }
    }
    __device__ ~BlockTrace() {
        if (unsigned long long* rec = block_trace_record()) rec[1] = global_timer_ns();
    }
};
}  // namespace iosim
#define IOSIM_TRACE_BLOCK() ::iosim::BlockTrace iosim_block_trace_guard_
#else
#define IOSIM_TRACE_BLOCK() ((void)0)
#endif
