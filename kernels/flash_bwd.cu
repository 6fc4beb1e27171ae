// flash_bwd.cu: FlashAttention-2 backward (Dao 2023, Algorithm 2) on tensor cores, mma.sync m16n8k16.
//
//   Given Q, K, V (layouts as in flash_fwd.cu), O, dO (like Q) and the forward's lse (B, H, N) fp32, compute
//   dQ, dK, dV of L with dO = dL/dO, for O = softmax(scale Q K^T) V. Grouped-query heads: dK, dV of a kv head are
//   summed over its query heads inside one thread block (no expanded copies, no reduction kernel).
//
// Kernels, in launch order (iosim/schedules/flash2_bwd.py counts them, with gqa="grouped"):
//   flash_bwd_preprocess_kernel  Alg. line 4: Delta = rowsum(dO o O) (B, H, N) fp32; clears the fp32 dQ accumulator
//   flash_bwd_kernel             Alg. lines 5-18: one thread block per K/V block j of one (batch, kv head):
//       load K_j, V_j once (line 6); for each query head of the group and each Q block i that sees a key of j:
//         load Q_i, dO_i, L_i, Delta_i (line 9; cp.async, the next block's in flight while this one is used)
//         S^T = K_j Q_i^T,  P^T = exp(scale S^T - L_i)                  (lines 10-11, recomputed, masked, in the
//                                                                       input dtype from here on, as dV's operand)
//         dP^T = V_j dO_i^T, dS^T = scale P^T o (dP^T - Delta_i)        (lines 13-14; dS^T kept times scale,
//                                                                       which dK and dQ both take, at no cost)
//         dV_j += P^T dO_i,  dK_j += dS^T Q_i                           (lines 12, 16; fp32 registers)
//         dQacc_i += dS_ij K_j                                          (line 15: fp32 reductions in L2, red.add)
//       dK_j, dV_j written once (line 18)
//   flash_bwd_convert_dq_kernel  dQ = dQacc in the problem dtype
// Deterministic mode (no atomics, so bit-identical runs): flash_bwd_kernel without line 15, then
//   flash_bwd_dq_kernel          one thread block per Q block i (the forward's loop order): recomputes S, P, dP, dS
//                                 for every K/V block it sees and writes dQ_i once; two GEMMs more per tile pair.
//
// Warps (8 in flash_bwd_kernel, BwdLayout): each GEMM's output tile is split over the warps in warp tiles of 32 rows
// (S^T, dP^T: Bc x Br; dK, dV: Bc x d; dQ: Br x d). S^T and dP^T are computed key-major so P^T and dS^T go to shared
// memory as the A operands of dV and dK; dQ's A operand is dS^T read back transposed (ldmatrix.trans). Tiles per
// head dim: iosim/launch/backward.py FLASH_BWD_TILES (128 x 128 at d <= 64, 64 x 128 at d = 128, 64 x 64 at d = 256).
// Shared memory (term by term in iosim/launch/backward.py, flash_bwd_smem_terms): K_j, V_j (Bc x d); Q_i, dO_i (Br x d, two
// buffers each); P^T, dS^T (Bc x Br); L_i, Delta_i (Br fp32, two buffers each).
// Masking as the forward: keys >= kv_len, query rows >= seq_len and, when causal, key j > i + (kv_len - seq_len)
// (bottom-right aligned) get P = 0; Q blocks with no row seeing a key of block j are never loaded.
//
// Versions (device, bf16; full tables in docs/benchmarks.md):
//   v1  first version: 8 warps, Br = 64, Bc = 128 (d = 32, 64) or 64 (d = 128, 256), Q/dO double-buffered, two
//       barriers per Q block, dQ by red.global.add.v2.f32 from the mma fragments, dK/dV stored from fragments.
//       Measured (H100, N = 8192, B*N = 16384, 2048 / d heads): 0.73-0.77x torch SDPA's FA2 backward at d = 64,
//       0.60-0.63x at d = 128: warp tiles of 16 rows load 1.3-1.8 B fragments per mma (ldmatrix-bound), and
//       Bc = 64 at d = 128 (v1 spilled at 128) reloads Q_i, dO_i and adds dQ twice as often as FA2's Bc = 128.
//   v2  warp tiles of 32 rows (two m16 tiles per B fragment: 2-2.7 mma per ldmatrix), P^T packed to the input dtype
//       in registers right after the exp (32 registers freed), so d = 128 runs Bc = 128. Measured (H100 and H200,
//       N = 2048-16384): 0.84-0.87x torch's FA2 backward at d = 128, 0.77-0.83x at d = 64.
//   v3  Br = 128 where the accumulators fit (d <= 64: 255 registers, no spill), half the iterations per block.
//       Measured (H100, N = 8192): d = 64 0.85-0.88x (was 0.78-0.81x), d = 32 0.83-0.87x (was 0.77-0.83x).
//   v4  fewer instructions, same tiles, same global and shared-memory traffic: ldmatrix addresses computed once per
//       GEMM (tile.cuh warp_mma_pf: XOR patterns + immediates; v3 spent 3-4 instructions per ldmatrix), no division
//       in the loop, dS^T stored times scale (no dQ multiplies). Nsight Compute (H100, bf16, B = 4, N = 4096, main
//       kernel): d = 128 1.58e9 -> 1.16e9 instructions, 5.19 -> 4.80-4.85 ms (FA2's 4.39-4.44 ms); d = 64
//       1.74e9 -> 1.46e9 instructions but 5.64 -> 5.64-5.68 ms (FA2 4.76 ms: ours stalls more per instruction on
//       mio_throttle, long_scoreboard and barrier). bench_backward.py (H100, N = 2048-16384): d = 128 0.90-0.93x
//       non-causal, 0.88-0.91x causal (was 0.83-0.87x); d = 64 0.82-0.87x non-causal, 0.89-0.90x causal (unchanged).
//   v5  at d <= 64 the mask in a pass of its own after the exp loop (flash3_bwd.cu v4's change). Measured (H100, A/B
//       in one call against torch's FA2 in the same processes): d = 64 +2-3% (N = 8192: 249 -> 257 TFLOP/s); d = 128
//       +0-0.4% and a 4-byte spill, so d = 128 keeps v4's loop.
#include "common.cuh"
#include "tile.cuh"

namespace iosim {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBwdWarps = 8, kBwdThreads = 32 * kBwdWarps;

// warp layout of flash_bwd_kernel: each GEMM's output tile split over the 8 warps in warp tiles of 32 rows (two m16
// tiles share every B fragment; 16 rows cost 25% more ldmatrix traffic per mma at d = 128, the limit of v1)
template <int D, int Br, int Bc>
struct BwdLayout {
    static constexpr int WMs = Bc / 32, WNs = kBwdWarps / WMs;    // S^T, dP^T (Bc x Br): warps along keys, queries
    static constexpr int MS = 2, NS = Br / WNs / 8;               // m16 and n8 tiles per warp
    static constexpr int WMkv = Bc / 32, WNkv = kBwdWarps / WMkv;  // dK_j, dV_j (Bc x D)
    static constexpr int MKV = 2, NKV = D / WNkv / 8;
    static constexpr int WMq = (D >= 64) ? Br / 32 : Br / 16, WNq = kBwdWarps / WMq;  // dQ_i (Br x D)
    static constexpr int MQ = Br / WMq / 16, NQ = D / WNq / 8;
    static_assert((Br == 64 || Br == 128) && (Bc == 64 || Bc == 128) && D % 32 == 0, "tile shape: Br, Bc = 64 or 128");
    static_assert(WMs * WNs == kBwdWarps && WMkv * WNkv == kBwdWarps && WMq * WNq == kBwdWarps, "warp grid");
    static_assert(NS % 2 == 0 && NKV % 2 == 0 && NQ % 2 == 0, "B fragments come two n8 tiles at a time");
};

// Alg. line 4: Delta[b, h, i] = sum_d dO[b, i, h, :] * O[b, i, h, :] in fp32; dQacc = 0 (when given).
// D / 8 threads per row (rows = B * N * H in memory order), 16 bytes of O and of dO each.
template <int D, typename T>
__global__ void __launch_bounds__(256)
    flash_bwd_preprocess_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta,
                                float* __restrict__ dq_accum, int seq_len, int heads, long long rows) {
    constexpr int C = D / 8;
    static_assert(C <= 32 && (C & (C - 1)) == 0, "a row's threads sit in one warp");
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long r = idx / C;
    const int c = (int)(idx % C);
    float s = 0.f;
    if (r < rows) {
        const uint4 a = *reinterpret_cast<const uint4*>(o + r * D + c * 8);
        const uint4 b = *reinterpret_cast<const uint4*>(dout + r * D + c * 8);
        const T* pa = reinterpret_cast<const T*>(&a);
        const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(to_float(pa[e]), to_float(pb[e]), s);
        if (dq_accum != nullptr) {
            float4* z = reinterpret_cast<float4*>(dq_accum + r * D + c * 8);
            z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
            z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int off = C / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (r < rows && c == 0) {
        const long long h = r % heads, bi = r / heads;  // bi = b * N + i
        delta[(bi / seq_len * heads + h) * seq_len + bi % seq_len] = s;
    }
}

// dQ = dQacc in the problem dtype: 8 elements per thread (the scale came with dS^T, in every reduction).
template <typename T>
__global__ void __launch_bounds__(256)
    flash_bwd_convert_dq_kernel(const float* __restrict__ dq_accum, T* __restrict__ dq, long long chunks) {
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    const float4 x = reinterpret_cast<const float4*>(dq_accum)[2 * c];
    const float4 y = reinterpret_cast<const float4*>(dq_accum)[2 * c + 1];
    reinterpret_cast<uint4*>(dq)[c] = make_uint4(pack2<T>(x.x, x.y), pack2<T>(x.z, x.w), pack2<T>(y.x, y.y),
                                                 pack2<T>(y.z, y.w));
}

// the first Q block that holds a row seeing key n0 (causal, bottom-right: row r sees key n0 iff r >= n0 - offset)
__device__ __forceinline__ int first_q_block(int n0, int offset, int Br, bool causal) {
    const int x = n0 - offset;
    return (causal && x > 0) ? x / Br : 0;
}

template <int D, int Br, int Bc, typename T, bool Causal>
__global__ void __launch_bounds__(kBwdThreads, 1)
    flash_bwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     float* __restrict__ dq_accum, T* __restrict__ dk, T* __restrict__ dv, int seq_len, int kv_len,
                     int heads, int kv_heads, float scale, float scale_log2) {
    using L = BwdLayout<D, Br, Bc>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>(smem_raw);  // Bc x D
    T* sV = sK + Bc * D;                     // Bc x D
    T* sQ = sV + Bc * D;                     // 2 x Br x D
    T* sdO = sQ + 2 * Br * D;                // 2 x Br x D
    T* sP = sdO + 2 * Br * D;                // P^T: Bc x Br
    T* sdS = sP + Bc * Br;                   // dS^T: Bc x Br
    float* sL = reinterpret_cast<float*>(sdS + Bc * Br);  // 2 x Br
    float* sDelta = sL + 2 * Br;                          // 2 x Br

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int sm = warp % L::WMs, sn = warp / L::WMs;     // S^T, dP^T: this warp's 32 keys, Br / WNs queries
    const int kvm = warp % L::WMkv, kvn = warp / L::WMkv;  // dK_j, dV_j: 32 keys, D / WNkv columns
    const int qm = warp % L::WMq, qn = warp / L::WMq;      // dQ_i: 16 MQ rows, D / WNq columns
    const int n0 = blockIdx.x * Bc, hk = blockIdx.y, b = blockIdx.z;
    const int group = heads / kv_heads;
    const int offset = kv_len - seq_len;
    const long long q_stride = (long long)heads * D, kv_stride = (long long)kv_heads * D;
    const int i_min = first_q_block(n0, offset, Br, Causal);
    const int n_i = max(0, (seq_len + Br - 1) / Br - i_min);  // Q blocks per query head
    const int n_iter = group * n_i;

    // Alg. line 6: K_j, V_j into SRAM (group 0)
    const long long kv_off = ((long long)b * kv_len + n0) * kv_stride + (long long)hk * D;
    load_tile_async<Bc, D, kBwdThreads>(sK, k + kv_off, kv_stride, kv_len - n0, tid);
    load_tile_async<Bc, D, kBwdThreads>(sV, v + kv_off, kv_stride, kv_len - n0, tid);
    cp_async_commit();

    // Alg. line 9 for iteration `it` (query head h, Q block i) into buffer `buf`: one cp.async group
    auto load_q_block = [&](int h, int m0, int buf) {
        const long long q_off = ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
        load_tile_async<Br, D, kBwdThreads>(sQ + buf * Br * D, q + q_off, q_stride, seq_len - m0, tid);
        load_tile_async<Br, D, kBwdThreads>(sdO + buf * Br * D, dout + q_off, q_stride, seq_len - m0, tid);
        if (tid < Br) {  // L_i and Delta_i: rows past seq_len read as 0 (never used: those rows are masked)
            const long long s_off = ((long long)b * heads + h) * seq_len + m0;
            const bool ok = m0 + tid < seq_len;
            cp_async_4(smem_u32(sL + buf * Br + tid), lse + s_off + (ok ? tid : 0), ok ? 4 : 0);
            cp_async_4(smem_u32(sDelta + buf * Br + tid), delta + s_off + (ok ? tid : 0), ok ? 4 : 0);
        }
        cp_async_commit();
    };
    // the current iteration's query head and first row, and the next one's (counters: no division in the loop)
    int h = hk * group, m0 = i_min * Br;
    int h_next = h + (n_i == 1), m0_next = n_i == 1 ? m0 : m0 + Br;
    if (n_iter > 0) load_q_block(h, m0, 0);

    float acc_dk[L::MKV][L::NKV][4], acc_dv[L::MKV][L::NKV][4];  // Alg. line 7
    zero(acc_dk);
    zero(acc_dv);

    for (int it = 0; it < n_iter; ++it) {
        const int buf = it & 1;
        cp_async_wait<0>();  // this Q block (and, the first time, K_j and V_j) has landed
        __syncthreads();     // ... for every warp, and every warp is done with the previous block's buffers
        if (it + 1 < n_iter) load_q_block(h_next, m0_next, buf ^ 1);
        const T* sQb = sQ + buf * Br * D;
        const T* sdOb = sdO + buf * Br * D;
        const float* sLb = sL + buf * Br;
        const float* sDb = sDelta + buf * Br;

        // Alg. lines 10-11, key-major: S^T = K_j Q_i^T (this warp: 32 keys x Br / WNs queries), then
        // P^T = exp2(S^T scale log2e - L log2e), rounded to the input dtype at once: kept packed in registers (half
        // the registers of fp32, so d = 128 at Bc = 128 fits) and stored to shared memory as dV's A operand
        constexpr int kCols = Br / L::WNs;
        const bool need_mask = (n0 + Bc > kv_len) || (m0 + Br > seq_len) || (Causal && n0 + Bc - 1 > m0 + offset);
        unsigned p_pk[L::MS][L::NS][2];
        {
            float acc_s[L::MS][L::NS][4];
            zero(acc_s);
            warp_mma_pf<L::MS, L::NS, D / 16, false, false, D, D>(acc_s, sK, sm * 32, 0, sQb, sn * kCols, 0, lane);
            // v5: at d <= 64 the exp first, then the mask in a pass of its own, taken by the iterations that need it
            // (+2-3% at d = 64, H100 A/B; at d = 128 it measured +0-0.4% and spills 4 bytes, so d = 128 keeps the
            // mask inside the exp loop)
            constexpr bool kMaskPass = D <= 64;
            if constexpr (kMaskPass) {
#pragma unroll
                for (int nt = 0; nt < L::NS; ++nt) {
                    const int col = sn * kCols + nt * 8 + 2 * t4;
                    const float l2[2] = {sLb[col] * kLog2e, sLb[col + 1] * kLog2e};
#pragma unroll
                    for (int mi = 0; mi < L::MS; ++mi)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc_s[mi][nt][e] = exp2_approx(fmaf(acc_s[mi][nt][e], scale_log2, -l2[e & 1]));
                }
                if (need_mask) {
#pragma unroll
                    for (int nt = 0; nt < L::NS; ++nt)
#pragma unroll
                        for (int mi = 0; mi < L::MS; ++mi)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int kj = n0 + sm * 32 + mi * 16 + g + ((e >> 1) << 3);
                                const int qi = m0 + sn * kCols + nt * 8 + 2 * t4 + (e & 1);
                                if (kj >= kv_len || qi >= seq_len || (Causal && kj > qi + offset)) acc_s[mi][nt][e] = 0.f;
                            }
                }
            }
#pragma unroll
            for (int nt = 0; nt < L::NS; ++nt) {
                const int col = sn * kCols + nt * 8 + 2 * t4;  // this thread's two query columns: col, col + 1
                const float l2[2] = {sLb[col] * kLog2e, sLb[col + 1] * kLog2e};  // unused (removed) at kMaskPass
#pragma unroll
                for (int mi = 0; mi < L::MS; ++mi) {
                    if constexpr (!kMaskPass) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float p = exp2_approx(fmaf(acc_s[mi][nt][e], scale_log2, -l2[e & 1]));
                            if (need_mask) {
                                const int kj = n0 + sm * 32 + mi * 16 + g + ((e >> 1) << 3), qi = m0 + col + (e & 1);
                                if (kj >= kv_len || qi >= seq_len || (Causal && kj > qi + offset)) p = 0.f;
                            }
                            acc_s[mi][nt][e] = p;
                        }
                    }
                    p_pk[mi][nt][0] = pack2<T>(acc_s[mi][nt][0], acc_s[mi][nt][1]);
                    p_pk[mi][nt][1] = pack2<T>(acc_s[mi][nt][2], acc_s[mi][nt][3]);
                    const int r = sm * 32 + mi * 16 + g, c = (sn * kCols + nt * 8) / 8;
                    *reinterpret_cast<unsigned*>(sP + swz<Br>(r, c) + 2 * t4) = p_pk[mi][nt][0];
                    *reinterpret_cast<unsigned*>(sP + swz<Br>(r + 8, c) + 2 * t4) = p_pk[mi][nt][1];
                }
            }
        }

        // Alg. lines 13-14: dP^T = V_j dO_i^T, dS^T = scale P^T o (dP^T - Delta) (the softmax scale that dK and dQ
        // both carry, folded into the subtraction: fmaf(dP, scale, -scale Delta)), to shared memory (dK's and dQ's A
        // operand)
        {
            float acc_dp[L::MS][L::NS][4];
            zero(acc_dp);
            warp_mma_pf<L::MS, L::NS, D / 16, false, false, D, D>(acc_dp, sV, sm * 32, 0, sdOb, sn * kCols, 0, lane);
#pragma unroll
            for (int nt = 0; nt < L::NS; ++nt) {
                const int col = sn * kCols + nt * 8 + 2 * t4;
                const float dl[2] = {sDb[col] * scale, sDb[col + 1] * scale};
#pragma unroll
                for (int mi = 0; mi < L::MS; ++mi) {
                    float p[4];
                    unpack2<T>(p_pk[mi][nt][0], p[0], p[1]);
                    unpack2<T>(p_pk[mi][nt][1], p[2], p[3]);
                    const int r = sm * 32 + mi * 16 + g, c = (sn * kCols + nt * 8) / 8;
                    *reinterpret_cast<unsigned*>(sdS + swz<Br>(r, c) + 2 * t4) =
                        pack2<T>(p[0] * fmaf(acc_dp[mi][nt][0], scale, -dl[0]),
                                 p[1] * fmaf(acc_dp[mi][nt][1], scale, -dl[1]));
                    *reinterpret_cast<unsigned*>(sdS + swz<Br>(r + 8, c) + 2 * t4) =
                        pack2<T>(p[2] * fmaf(acc_dp[mi][nt][2], scale, -dl[0]),
                                 p[3] * fmaf(acc_dp[mi][nt][3], scale, -dl[1]));
                }
            }
        }
        __syncthreads();  // P^T and dS^T complete

        // Alg. lines 12, 16: dV_j += P^T dO_i, dK_j += dS^T Q_i (this warp: 32 keys x D / WNkv)
        constexpr int kDCols = D / L::WNkv;
        warp_mma_pf<L::MKV, L::NKV, Br / 16, false, true, Br, D>(acc_dv, sP, kvm * 32, 0, sdOb, kvn * kDCols, 0, lane);
        warp_mma_pf<L::MKV, L::NKV, Br / 16, false, true, Br, D>(acc_dk, sdS, kvm * 32, 0, sQb, kvn * kDCols, 0, lane);

        // Alg. line 15: dQacc_i += dS K_j (dS carries the scale), dS read back transposed (this warp: 16 MQ rows x
        // D / WNq)
        if (dq_accum != nullptr) {
            float acc_dq[L::MQ][L::NQ][4];
            zero(acc_dq);
            constexpr int kQCols = D / L::WNq;
            warp_mma_pf<L::MQ, L::NQ, Bc / 16, true, true, Br, D>(acc_dq, sdS, qm * 16 * L::MQ, 0, sK, qn * kQCols, 0,
                                                                 lane);
            float* dqg = dq_accum + ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
#pragma unroll
            for (int mi = 0; mi < L::MQ; ++mi)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int row = qm * 16 * L::MQ + mi * 16 + g + 8 * hr;
                    if (m0 + row < seq_len) {
#pragma unroll
                        for (int nt = 0; nt < L::NQ; ++nt)
                            red_add_f32x2(dqg + row * q_stride + qn * kQCols + nt * 8 + 2 * t4,
                                          acc_dq[mi][nt][2 * hr], acc_dq[mi][nt][2 * hr + 1]);
                    }
                }
        }
        h = h_next;
        m0 = m0_next;
        m0_next += Br;
        if (m0_next >= (i_min + n_i) * Br) {
            m0_next = i_min * Br;
            ++h_next;
        }
    }
    cp_async_wait<0>();  // no copy may still be in flight into shared memory when the block exits

    // Alg. line 18: dK_j = dS^T Q (dS carries the scale), dV_j, written once in the problem dtype
    T* dkg = dk + kv_off;
    T* dvg = dv + kv_off;
#pragma unroll
    for (int mi = 0; mi < L::MKV; ++mi)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int row = kvm * 32 + mi * 16 + g + 8 * hr;
            if (n0 + row < kv_len) {
#pragma unroll
                for (int nt = 0; nt < L::NKV; ++nt) {
                    const long long off = row * kv_stride + kvn * (D / L::WNkv) + nt * 8 + 2 * t4;
                    *reinterpret_cast<unsigned*>(dkg + off) =
                        pack2<T>(acc_dk[mi][nt][2 * hr], acc_dk[mi][nt][2 * hr + 1]);
                    *reinterpret_cast<unsigned*>(dvg + off) =
                        pack2<T>(acc_dv[mi][nt][2 * hr], acc_dv[mi][nt][2 * hr + 1]);
                }
            }
        }
}

// Deterministic dQ (no atomics): one thread block per Q block i of one (batch, query head), 4 warps of 16 rows,
// the forward's loop over K/V blocks (double-buffered): S = Q_i K_j^T, P, dP = dO_i V_j^T, dS = P o (dP - Delta),
// dQ_i += dS K_j with dS taken from the accumulators as the A operand; dQ_i = scale dQ_i written once.
template <int D, int Br, int Bc, typename T, bool Causal>
__global__ void __launch_bounds__(128)
    flash_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                        T* __restrict__ dq, int seq_len, int kv_len, int heads, int kv_heads, float scale,
                        float scale_log2) {
    constexpr int kThreads = 128, NT = Bc / 8, ND = D / 8;
    static_assert(Br == 64 && Bc % 16 == 0, "4 warps of 16 query rows");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // Br x D
    T* sdO = sQ + Br * D;                    // Br x D
    T* sK = sdO + Br * D;                    // 2 x Bc x D
    T* sV = sK + 2 * Bc * D;                 // 2 x Bc x D

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int m_block = Causal ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;  // heaviest causal blocks first
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (heads / kv_heads);
    const int m0 = m_block * Br, offset = kv_len - seq_len;
    const long long q_stride = (long long)heads * D, kv_stride = (long long)kv_heads * D;
    const long long q_off = ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
    const T* kg = k + (long long)b * kv_len * kv_stride + (long long)hk * D;
    const T* vg = v + (long long)b * kv_len * kv_stride + (long long)hk * D;
    int n_blocks = (kv_len + Bc - 1) / Bc;
    if (Causal) {
        const int last_key = min(m0 + Br, seq_len) - 1 + offset;
        n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / Bc + 1);
    }

    load_tile_async<Br, D, kThreads>(sQ, q + q_off, q_stride, seq_len - m0, tid);
    load_tile_async<Br, D, kThreads>(sdO, dout + q_off, q_stride, seq_len - m0, tid);
    if (n_blocks > 0) {
        load_tile_async<Bc, D, kThreads>(sK, kg, kv_stride, kv_len, tid);
        load_tile_async<Bc, D, kThreads>(sV, vg, kv_stride, kv_len, tid);
    }
    cp_async_commit();
    float l2[2], dl[2];  // this thread's two rows: L log2e and Delta, read once per row (lane 4g) and shared
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = m0 + warp * 16 + g + 8 * hr;
        const long long s = ((long long)b * heads + h) * seq_len + row;
        const bool reads = t4 == 0 && row < seq_len;
        l2[hr] = __shfl_sync(0xffffffffu, reads ? lse[s] * kLog2e : 0.f, lane & ~3);
        dl[hr] = __shfl_sync(0xffffffffu, reads ? delta[s] : 0.f, lane & ~3);
    }

    float acc_dq[1][ND][4];
    zero(acc_dq);
    for (int j = 0; j < n_blocks; ++j) {
        const int buf = j & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < n_blocks) {
            const long long off = (long long)(j + 1) * Bc * kv_stride;
            load_tile_async<Bc, D, kThreads>(sK + (buf ^ 1) * Bc * D, kg + off, kv_stride, kv_len - (j + 1) * Bc, tid);
            load_tile_async<Bc, D, kThreads>(sV + (buf ^ 1) * Bc * D, vg + off, kv_stride, kv_len - (j + 1) * Bc, tid);
        }
        cp_async_commit();
        const T* sKb = sK + buf * Bc * D;
        const T* sVb = sV + buf * Bc * D;
        float acc_s[1][NT][4], acc_dp[1][NT][4];
        zero(acc_s);
        zero(acc_dp);
        warp_mma<1, NT, D / 16, false, false, D, D>(acc_s, sQ, warp * 16, 0, sKb, 0, 0, lane);
        warp_mma<1, NT, D / 16, false, false, D, D>(acc_dp, sdO, warp * 16, 0, sVb, 0, 0, lane);
        const int n0 = j * Bc;
        const bool need_mask = (n0 + Bc > kv_len) || (Causal && n0 + Bc - 1 > m0 + offset);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hr = e >> 1, row = m0 + warp * 16 + g + 8 * hr, col = n0 + nt * 8 + 2 * t4 + (e & 1);
                float p = exp2_approx(fmaf(acc_s[0][nt][e], scale_log2, -l2[hr]));
                if (row >= seq_len || (need_mask && (col >= kv_len || (Causal && col > row + offset)))) p = 0.f;
                acc_dp[0][nt][e] = p * (acc_dp[0][nt][e] - dl[hr]);  // dS
            }
        // dQ_i += dS K_j: dS rounded to the input dtype as the A operand, K_j via ldmatrix.trans
        const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) {
            unsigned a[4] = {pack2<T>(acc_dp[0][2 * kk][0], acc_dp[0][2 * kk][1]),
                             pack2<T>(acc_dp[0][2 * kk][2], acc_dp[0][2 * kk][3]),
                             pack2<T>(acc_dp[0][2 * kk + 1][0], acc_dp[0][2 * kk + 1][1]),
                             pack2<T>(acc_dp[0][2 * kk + 1][2], acc_dp[0][2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sKb + swz<D>(kk * 16 + v_row, dp * 2 + v_chunk)));
                mma_16816<T>(acc_dq[0][2 * dp], a, b0, b1);
                mma_16816<T>(acc_dq[0][2 * dp + 1], a, b2, b3);
            }
        }
    }
    cp_async_wait<0>();

    T* dqg = dq + q_off;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = warp * 16 + g + 8 * hr;
        if (m0 + row < seq_len) {
#pragma unroll
            for (int nd = 0; nd < ND; ++nd)
                *reinterpret_cast<unsigned*>(dqg + row * q_stride + nd * 8 + 2 * t4) =
                    pack2<T>(acc_dq[0][nd][2 * hr] * scale, acc_dq[0][nd][2 * hr + 1] * scale);
        }
    }
}

}  // namespace iosim
