// hopper.cuh: the Hopper (sm_90a) primitives the FlashAttention-3-design kernels share (flash3_fwd.cu,
// flash3_bwd.cu): a tensor map passed by value, mbarriers, TMA loads, named barriers, wgmma fences and waits, and the
// 128B-swizzle shared-memory descriptor (PTX ISA 8.0).
#pragma once

namespace iosim {

// A CUtensorMap (cuda.h) without including cuda.h: 128 opaque bytes, passed by value as a __grid_constant__.
struct alignas(64) TmaMap {
    unsigned long long opaque[16];
};

// ---------------------------------------------------------------------------------------------------------------
// mbarrier, TMA, named barriers, wgmma fences (PTX ISA 8.0, sm_90)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {  // arrive + expect `bytes`
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {  // until phase `parity` completed
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// one box of a 4-d tensor map (coordinates innermost first) into shared memory, completing on `bar`
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keep the compiler from moving reads or writes of accumulator registers across a wgmma issue or wait
template <int R> __device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R> __device__ __forceinline__ void fence_regs(unsigned (&r)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// wgmma shared-memory descriptor, 128-byte swizzle: start address, leading byte offset, stride byte offset (>> 4)
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo_bytes, unsigned sbo_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo_bytes >> 4) << 16) |
           ((unsigned long long)(sbo_bytes >> 4) << 32) | (1ull << 62);
}
// the same for a `Swizzle`-byte swizzle (128 or 64: the layout type in bits 62-63 is 1 or 2), rows of Swizzle bytes
template <int Swizzle>
__device__ __forceinline__ unsigned long long smem_desc_sw(unsigned addr) {
    static_assert(Swizzle == 128 || Swizzle == 64, "128B or 64B swizzle");
    constexpr unsigned long long layout = Swizzle == 128 ? 1ull : 2ull;
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
           ((unsigned long long)((8 * Swizzle) >> 4) << 32) | (layout << 62);
}

// ---------------------------------------------------------------------------------------------------------------
// fp8 e4m3 (the fp8 instantiations of flash3_fwd.cu; the type itself is common.cuh's): four fp32 values rounded to
// e4m3 (cvt.rn.satfinite: nearest even, saturating at +-448) packed into one register, the first in the lowest byte
__device__ __forceinline__ unsigned pack4_e4m3(float a0, float a1, float a2, float a3) {
    unsigned short lo, hi;  // cvt ... d, a, b puts a in the upper byte of d, b in the lower
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(a1), "f"(a0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(a3), "f"(a2));
    return (unsigned)lo | ((unsigned)hi << 16);
}

}  // namespace iosim
