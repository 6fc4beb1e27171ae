// tile.cuh: swizzled shared-memory tiles of the FlashAttention kernels (flash_fwd.cu, flash_bwd.cu).
//
// A tile holds ROWS rows of W elements (fp16/bf16); 16-byte chunks of each row are XOR-swizzled (chunk c of row r
// lives at c ^ (r & 7)), so the 8 row addresses of every ldmatrix phase and every cp.async store phase fall on 8
// different 16-byte bank groups.
#pragma once

#include "common.cuh"

namespace iosim {

// element offset of 16-byte chunk c (8 elements) of row r in a swizzled tile with D elements per row
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
    constexpr int C = D / 8;  // chunks per row
    static_assert(C == 4 || C % 8 == 0, "head dim must be 32 or a multiple of 64");
    if constexpr (C >= 8) {
        return r * D + ((c ^ (r & 7)) << 3);
    } else {  // 64-byte rows: two rows share a 128-byte line, swizzle by the line index
        return r * D + ((c ^ ((r >> 1) & 3)) << 3);
    }
}

// cp.async a ROWS x D tile (row stride `gstride` elements in global memory) into swizzled shared memory;
// rows >= nvalid are zero-filled (their source is clamped to row 0, never read).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* s, const T* g, long long gstride, int nvalid, int tid) {
    constexpr int C = D / 8;
    constexpr int TOTAL = ROWS * C;
#pragma unroll
    for (int it = 0; it < (TOTAL + THREADS - 1) / THREADS; ++it) {
        const int idx = it * THREADS + tid;
        if (TOTAL % THREADS == 0 || idx < TOTAL) {
            const int r = idx / C, c = idx % C;
            const bool ok = r < nvalid;
            const T* src = g + (ok ? r : 0) * gstride + c * 8;
            cp_async_16(smem_u32(s + swz<D>(r, c)), src, ok ? 16 : 0);
        }
    }
}

// acc[mi][ni] += A (16 MI rows from am0) x B (8 NI columns from bn0), summed over KS k16 steps from ak0 / bk0, one
// warp, mma.sync m16n8k16 with operands read from swizzled shared-memory tiles by ldmatrix:
//   A stored [m][k] (WA elements a row), or [k][m] when ATrans (read with ldmatrix.trans);
//   B stored [n][k] (WB elements a row; S = Q K^T reads K so), or [k][n] when BKMajor (P V reads V so: .trans).
template <int MI, int NI, int KS, bool ATrans, bool BKMajor, int WA, int WB, typename T>
__device__ __forceinline__ void warp_mma(float (&acc)[MI][NI][4], const T* sA, int am0, int ak0, const T* sB, int bn0,
                                         int bk0, int lane) {
    static_assert(NI % 2 == 0, "B fragments are loaded two n8 tiles at a time");
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        unsigned a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            if constexpr (ATrans) {  // matrix i = lane / 8: k rows 8 (i / 2) .., m chunk i % 2
                const int r = ak0 + ks * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int c = (am0 + mi * 16) / 8 + ((lane >> 3) & 1);
                ldmatrix_x4_trans(a[mi][0], a[mi][1], a[mi][2], a[mi][3], smem_u32(sA + swz<WA>(r, c)));
            } else {  // matrix i: m rows 8 (i % 2) .., k chunk i / 2
                const int r = am0 + mi * 16 + (lane & 15);
                const int c = (ak0 + ks * 16) / 8 + (lane >> 4);
                ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], smem_u32(sA + swz<WA>(r, c)));
            }
        }
#pragma unroll
        for (int np = 0; np < NI / 2; ++np) {
            unsigned b0, b1, b2, b3;  // (b0, b1): n8 tile 2 np; (b2, b3): n8 tile 2 np + 1
            if constexpr (BKMajor) {
                const int r = bk0 + ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                const int c = (bn0 + np * 16) / 8 + (lane >> 4);
                ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sB + swz<WB>(r, c)));
            } else {
                const int r = bn0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int c = (bk0 + ks * 16) / 8 + ((lane >> 3) & 1);
                ldmatrix_x4(b0, b1, b2, b3, smem_u32(sB + swz<WB>(r, c)));
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                mma_16816<T>(acc[mi][2 * np], a[mi], b0, b1);
                mma_16816<T>(acc[mi][2 * np + 1], a[mi], b2, b3);
            }
        }
    }
}

// warp_mma with the ldmatrix addresses computed once per call instead of once per ldmatrix (same arguments, same
// result). Each operand is a stream of 16-byte chunks that advances two chunks (16 elements) per step j along the
// swizzled dimension, and 16 rows (an immediate: r & 7 unchanged) along the other:
//   A [m][k]: j = k step, rows mi;  A [k][m] (ATrans): j = mi, rows k step;
//   B [n][k]: j = k step, rows np;  B [k][n] (BKMajor): j = np, rows k step.
// Chunk(j) = cb + 2j where cb, the lane's chunk at step 0, has no bit in common with 2j (the warp's start in the
// swizzled dimension, ak0 / am0 / bk0 / bn0, is a multiple of the 16 J elements it spans, as in every caller), so
// the swizzled chunk is (cb ^ s) ^ (2j mod CS) + (2j - 2j mod CS): the step-0 byte address XORed with one of at most
// four patterns (bits 4-6 of the address, inside its 128-byte line, 64-byte at 32-element rows) plus an immediate.
// Needs tiles that start 128-byte aligned in shared memory (every flash tile does: extern __align__(128)).
// Shared-memory reads and mma order are warp_mma's; a k step's fragments are loaded before the previous step's
// mma (flash::gemm's order), so ldmatrix latency hides behind tensor work without relying on the scheduler.
template <int W, int J>
struct SwzStream {
    static constexpr int C = W / 8, CS = C >= 8 ? 8 : C, P = J < CS / 2 ? J : CS / 2;
    static_assert(C == 4 || C % 8 == 0, "row width must be 32 or a multiple of 64 elements");
    unsigned base[P];
    __device__ __forceinline__ explicit SwzStream(unsigned addr0) {
#pragma unroll
        for (int p = 0; p < P; ++p) base[p] = addr0 ^ (unsigned)(32 * p);
    }
    // byte address at step j plus `rows` rows (a multiple of 16); j and rows are compile-time after unrolling
    __device__ __forceinline__ unsigned at(int j, int rows) const {
        return base[j % P] + (unsigned)((2 * j / CS) * CS * 16 + rows * W * 2);
    }
};

template <int MI, int NI, int KS, bool ATrans, bool BKMajor, int WA, int WB, typename T>
__device__ __forceinline__ void warp_mma_pf(float (&acc)[MI][NI][4], const T* sA, int am0, int ak0, const T* sB,
                                            int bn0, int bk0, int lane) {
    static_assert(NI % 2 == 0, "B fragments are loaded two n8 tiles at a time");
    constexpr int NP = NI / 2;
    // lane's step-0 address of each stream (see warp_mma for the ldmatrix matrix order)
    const SwzStream<WA, ATrans ? MI : KS> sa(
        ATrans ? smem_u32(sA + swz<WA>(ak0 + (lane & 7) + ((lane >> 4) << 3), am0 / 8 + ((lane >> 3) & 1)))
               : smem_u32(sA + swz<WA>(am0 + (lane & 15), ak0 / 8 + (lane >> 4))));
    const SwzStream<WB, BKMajor ? NP : KS> sb(
        BKMajor ? smem_u32(sB + swz<WB>(bk0 + (lane & 7) + (((lane >> 3) & 1) << 3), bn0 / 8 + (lane >> 4)))
                : smem_u32(sB + swz<WB>(bn0 + (lane & 7) + ((lane >> 4) << 3), bk0 / 8 + ((lane >> 3) & 1))));
    unsigned a[2][MI][4], b[2][NP][4];  // fragments of k steps ks (buffer ks & 1) and ks + 1
    auto load = [&](int ks, int buf) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            if constexpr (ATrans)
                ldmatrix_x4_trans(a[buf][mi][0], a[buf][mi][1], a[buf][mi][2], a[buf][mi][3], sa.at(mi, ks * 16));
            else
                ldmatrix_x4(a[buf][mi][0], a[buf][mi][1], a[buf][mi][2], a[buf][mi][3], sa.at(ks, mi * 16));
        }
#pragma unroll
        for (int np = 0; np < NP; ++np) {
            if constexpr (BKMajor)
                ldmatrix_x4_trans(b[buf][np][0], b[buf][np][1], b[buf][np][2], b[buf][np][3], sb.at(np, ks * 16));
            else
                ldmatrix_x4(b[buf][np][0], b[buf][np][1], b[buf][np][2], b[buf][np][3], sb.at(ks, np * 16));
        }
    };
    load(0, 0);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        if (ks + 1 < KS) load(ks + 1, (ks + 1) & 1);
        const int cur = ks & 1;
#pragma unroll
        for (int np = 0; np < NP; ++np)
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                mma_16816<T>(acc[mi][2 * np], a[cur][mi], b[cur][np][0], b[cur][np][1]);
                mma_16816<T>(acc[mi][2 * np + 1], a[cur][mi], b[cur][np][2], b[cur][np][3]);
            }
    }
}

template <int MI, int NI>
__device__ __forceinline__ void zero(float (&acc)[MI][NI][4]) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
}

}  // namespace iosim
