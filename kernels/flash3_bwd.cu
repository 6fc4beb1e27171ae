// flash3_bwd.cu: FlashAttention-2/3 backward in the FlashAttention-3 design (Shah et al. 2024) for Hopper, sm_90a:
// TMA loads, an mbarrier pipeline, wgmma, warp specialization with register reallocation, and dQ accumulated in
// fp32 in global memory by TMA bulk reduce-adds issued by a dedicated warp.
//
//   Given Q, dO, O (B, N, H, d), K, V (B, N_kv, H_kv, d), the forward's lse (B, H, N) fp32 natural log and
//   Delta = rowsum(dO o O) (flash_bwd.cu's preprocess kernel, which also clears the fp32 dQ accumulator), compute
//   dK, dV (like K, V) and add scale * dS K into dQacc (B, N, H, d) fp32 (flash_bwd.cu's convert kernel then
//   writes dQ in the input dtype). Grouped-query: dK, dV of a kv head summed over its query heads in registers.
//
// One thread block per (K/V block of Bc = 128 rows, kv head, batch), a 1-D grid (causal: longest blocks first);
// 3 warpgroups (384 threads):
//   warpgroup 0, producer (setmaxnreg 24):
//     warp 0: K_j, V_j once by TMA; then per visit (query head of the group x Q block i that sees a key of j) Q_i
//             and dO_i by TMA into a 2-stage ring, lse_i * log2e and Delta_i by plain loads (ragged rows and the
//             lse of a row that sees no key become +inf, so P = 0), all completing on the stage's "full" mbarrier.
//     warps 1-3: the dQ writers: per visit, wait for the consumers' dQ_i partial in shared memory and add each row
//             to dQacc with cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 (rows >= N skipped); warp w
//             takes rows w - 1, w + 2, .. (a warp issues its reduce-adds one lane at a time).
//   warpgroups 1, 2, consumers (setmaxnreg 240), each owning 64 of the Bc keys (wgmma's M), per visit:
//     S^T  = K_j Q_i^T                      wgmma m64 n=Br k16, A = K (shared, K-major), B = Q (shared, K-major)
//     dP^T = V_j dO_i^T                     likewise
//     P^T  = exp2(S^T scale log2e - lse_i log2e), masked; dS^T = P^T o (dP^T - Delta_i)
//     dV  += P^T dO_i,  dK += dS^T Q_i      wgmma m64 n=d k16, A from registers, B = dO, Q (shared, N-major)
//     dQ_i = dS_ij K_j                      dS^T through shared memory (both warpgroups' keys), wgmma m64 n=d/2
//                                           k16 with A = dS (MN-major) and B = K (N-major); warpgroup w computes
//                                           columns w*d/2 ..; times scale into the fp32 dQ staging buffer.
//   dK (times scale), dV written once from registers at the end.
// Deterministic mode (dq_accum == nullptr): no dQ GEMM, no reduce-adds; flash_bwd.cu's Q-outer
// flash_bwd_dq_kernel writes dQ afterwards (no order-dependent additions, bit-identical runs).
// Masking as the forward: keys >= kv_len, query rows >= seq_len and, when causal, key j > i + (kv_len - seq_len)
// (bottom-right aligned) get P = 0; Q blocks with no row seeing a key of block j are never loaded.
// Shared memory (iosim/launch/backward.py flash3_bwd_smem_terms): K, V (Bc x d), Q, dO (2 stages x Br x d), in d/64 panels
// of rows x 128 B, 128B swizzle (TMA's = wgmma's); dS^T (2 x Bc x Br, same swizzle); dQ staging (Br x (d + 8)
// fp32, rows padded 32 B against bank conflicts); lse, Delta (2 x Br fp32 each); mbarriers.
//
// Versions (llm.c style; floor, prediction and measurement in docs/kernels.md):
//   v1  first version: Br = 64, Bc = 128 (2 consumer warpgroups x 64 keys) at d = 64 and 128; no ping-pong, no
//       overlap of the exp with the GEMMs; dQ staging single-buffered, dS^T double-buffered; grid (Tc, H_kv, B).
//       d = 256 is refused (dK + dV accumulators alone are 2 x 64 x 256 fp32 = 256 registers a consumer thread).
//       Measured (H100, bf16, N = 4096 / 8192, same run as torch): d = 128 444 / 467 TFLOP/s (0.80x / 0.86x cuDNN's
//       backward, 1.46x / 1.51x torch's FA2), causal 369 / 411 (0.79x / 0.78x cuDNN); d = 64 256 / 264 (0.57x /
//       0.63x cuDNN, 0.91x FA2). Br = 128 at d = 64 was 5-6% faster but spills 8-56 B: not shipped.
//   v2  every consumer thread arrives on the stage's empty mbarrier (racecheck's 147520 WAR hazards on the lse ring
//       -> 0); d = 64: Br = 128 (FA3's tile), dQ_i split by rows between the warpgroups (m64n64), FA3's GEMM order
//       (dV; dQ; dK, the dQ epilogue under dK), 0 spills; d = 128 keeps v1's order (measured faster there); causal:
//       1-D grid, longest K/V blocks first in L2-sized sections of kv heads (FA3's LPT). Measured (H100, bf16,
//       N = 4096 / 8192, same run as torch): d = 128 442.0 / 453.8 TFLOP/s (0.80x / 0.90x cuDNN, 1.46x / 1.47x FA2),
//       causal 388.8 / 432.4 (0.83x / 0.83x); d = 64 266.5 / 273.6 (0.60x / 0.64x cuDNN, 0.95x FA2), causal
//       231.6 / 250.6 (0.61x / 0.61x).
//   v3  three dQ writer warps (warps 1-3 of the producer warpgroup; 2 and 3 were idle) instead of one: ncu showed the
//       consumers waiting for the writer to have read the previous dQ partial (named barrier 3) in 40% of all warp
//       samples at d = 64 and 15% at d = 128; the writer issues its Br bulk reduce-adds one lane at a time.
//       Measured (H100, bf16, N = 4096 / 8192, same run as torch): d = 128 524.7 / 519.3 TFLOP/s (0.94x / 0.89x
//       cuDNN, 1.79x / 1.74x FA2), causal 460.2 / 520.9 (0.98x / 0.99x); d = 64 453.8 / 455.6 (1.00x / 1.03x cuDNN,
//       1.62x / 1.58x FA2), causal 297.4 / 328.8 (0.79x / 0.78x). Against v2 in the same call: +13-21% at d = 128,
//       +27-75% at d = 64 (docs/kernels.md, v3).
//   v4  the causal mask in a pass of its own, run by the visits that need it (the diagonal, keys past kv_len): in
//       the exp loop its index arithmetic cost every visit at d = 64. Measured (H100, bf16, N = 4096 / 8192, same
//       call as v3): causal d = 64 397-401 / 444-452 TFLOP/s (+34-37%, 1.05-1.07x cuDNN); the rest +0-1%.
#include "common.cuh"
#include "flash3_wgmma.cuh"
#include "flash3_bwd_wgmma.cuh"
#include "hopper.cuh"

namespace iosim {

constexpr int kF3bThreads = 384;  // iosim/launch/backward.py FLASH3_BWD_THREADS
constexpr int kF3bPanel = 64;     // elements per 128-byte row of a swizzled panel
constexpr int kF3bBc = 128;       // FLASH3_BWD_TILES (iosim/launch/backward.py): 2 consumer warpgroups x 64 keys
constexpr int kF3bDqPad = 8;      // fp32 padding of a dQ staging row (32 B)
// dQ writer warps of the producer warpgroup (warps 1 .. kF3bWriters); v2 had 1 (IOSIM_F3B_WRITERS=1 builds it again:
// a measurement switch; 2 was measured between, docs/kernels.md v3)
#ifndef IOSIM_F3B_WRITERS
#define IOSIM_F3B_WRITERS 3
#endif
constexpr int kF3bWriters = IOSIM_F3B_WRITERS;
static_assert(kF3bWriters >= 1 && kF3bWriters <= 3, "warps 1 to 3 of the producer warpgroup");
constexpr float kF3bLog2e = 1.4426950408889634f;

namespace f3b {
using namespace iosim;  // the shared Hopper primitives (hopper.cuh) as f3b::
// add `bytes` fp32 of shared memory at src into global memory at dst (TMA bulk reduction, completes on bulk_group)
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// generic-proxy writes to shared memory made visible to the async proxy (wgmma operands, bulk copies)
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// accumulator (rows of M x 16 columns, fp32) -> wgmma A fragment in the input dtype (flash3_fwd.cu convert_p)
template <typename T, int KP>
__device__ __forceinline__ void to_frags(const float* acc, unsigned (&f)[KP][4]) {
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) {
        f[kk][0] = pack2<T>(acc[(2 * kk) * 4 + 0], acc[(2 * kk) * 4 + 1]);
        f[kk][1] = pack2<T>(acc[(2 * kk) * 4 + 2], acc[(2 * kk) * 4 + 3]);
        f[kk][2] = pack2<T>(acc[(2 * kk + 1) * 4 + 0], acc[(2 * kk + 1) * 4 + 1]);
        f[kk][3] = pack2<T>(acc[(2 * kk + 1) * 4 + 2], acc[(2 * kk + 1) * 4 + 3]);
    }
}
}  // namespace f3b

// the first Q block holding a row that sees key n0 (causal, bottom-right: row r sees key n0 iff r >= n0 - offset)
__device__ __forceinline__ int f3b_first_q_block(int n0, int offset, int Br, bool causal) {
    const int x = n0 - offset;
    return (causal && x > 0) ? x / Br : 0;
}

template <int D, int Br, typename T, bool Causal>
__global__ void __launch_bounds__(kF3bThreads, 1)
    flash3_bwd_kernel(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                      const __grid_constant__ TmaMap tm_v, const __grid_constant__ TmaMap tm_do,
                      const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq_accum,
                      T* __restrict__ dk, T* __restrict__ dv, int seq_len, int kv_len, int heads, int kv_heads,
                      float scale, float scale_log2) {
    using namespace f3b;
    constexpr int Bc = kF3bBc;
    constexpr int kRowBytes = kF3bPanel * 2;                     // 128
    constexpr int kKVBytes = Bc * D * 2, kQBytes = Br * D * 2;  // one K or V tile, one Q or dO tile
    constexpr int kDSBytes = Bc * Br * 2;
    constexpr int kDqRow = D + kF3bDqPad;                        // fp32 per dQ staging row
    constexpr int SR = Br / 2;                                   // fp32 registers of S^T (64 x Br) per thread
    constexpr int KR = D / 2;                                    // of dK or dV (64 x D)
    constexpr int KP = Br / 16;                                  // k16 steps of dV, dK (A fragments of P^T, dS^T)
    // dQ_i (Br x D) split between the consumer warpgroups: by rows (64 each) at Br = 128, else by columns
    constexpr bool kDqSplitRows = Br == 128;
    // GEMM order of a visit: FlashAttention-3's (dV; dQ; dK, the dQ epilogue under dK) at Br = 128; at Br = 64 v1's
    // (dV and dK together before the dS^T barrier, then dQ), measured faster there (docs/kernels.md, v2)
    constexpr bool kDqUnderDk = Br == 128;
    constexpr int NQ = kDqSplitRows ? D : D / 2;                 // dQ columns per consumer warpgroup (wgmma N)
    static_assert(D % kF3bPanel == 0 && (Br == 64 || Br == 128), "tile shape");

    extern __shared__ unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned sK = base, sV = sK + kKVBytes;
    const unsigned sQ = sV + kKVBytes;           // 2 stages
    const unsigned sdO = sQ + 2 * kQBytes;       // 2 stages
    const unsigned sdS = sdO + 2 * kQBytes;      // 2 buffers of dS^T (Bc rows x Br columns, Br/64 panels)
    const unsigned sdQ = sdS + 2 * kDSBytes;     // Br x kDqRow fp32
    const unsigned sL = sdQ + Br * kDqRow * 4;   // 2 stages x Br fp32: lse * log2e
    const unsigned sDl = sL + 2 * Br * 4;        // 2 stages x Br fp32: Delta
    const unsigned bars = sDl + 2 * Br * 4;
    const unsigned kv_full = bars;
    auto full = [&](int s) { return bars + 8 * (1 + s); };
    auto empty = [&](int s) { return bars + 8 * (3 + s); };
    float* sLp = reinterpret_cast<float*>(smem_raw + (sL - smem_u32(smem_raw)));
    float* sDlp = reinterpret_cast<float*>(smem_raw + (sDl - smem_u32(smem_raw)));
    float* sdQp = reinterpret_cast<float*>(smem_raw + (sdQ - smem_u32(smem_raw)));

    const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
    const int group = heads / kv_heads;
    const int Tc = (kv_len + Bc - 1) / Bc;
    int jb, hb;  // K/V block, kv head + kv_heads * batch of this thread block (1-D grid of Tc x kv_heads x batch)
    if (Causal) {
        // longest first (FlashAttention-3's LPT order): block j sees the most Q blocks at j = 0, so j is the slow
        // index; within sections of `sw` kv heads whose Q, dO and dQacc fit ~40 MB of L2, so the blocks running
        // together share their heads' rows in L2
        const long long head_bytes = (long long)group * seq_len * D * (2 * (int)sizeof(T) + 4);
        const long long fit = (40ll << 20) / (head_bytes > 0 ? head_bytes : 1);
        const int n_hb = (int)gridDim.x / Tc;  // kv_heads x batch
        int sw = 1;                            // a power of 2, or every head in one section
        if (fit >= n_hb) sw = n_hb;
        else
            while (2ll * sw <= fit) sw *= 2;
        const int idx = blockIdx.x, section = idx / (sw * Tc), within = idx % (sw * Tc);
        const int width = (section + 1) * sw <= n_hb ? sw : n_hb - section * sw;  // the last section may be narrower
        jb = within / width;
        hb = section * sw + within % width;
    } else {
        jb = blockIdx.x % Tc;  // consecutive blocks: one head's K/V blocks (its Q, dO, dQacc rows shared in L2)
        hb = blockIdx.x / Tc;
    }
    const int n0 = jb * Bc, hk = hb % kv_heads, b = hb / kv_heads;
    const int offset = kv_len - seq_len;
    const int Tr = (seq_len + Br - 1) / Br;
    const int m_begin = f3b_first_q_block(n0, offset, Br, Causal);
    const int per_head = m_begin < Tr ? Tr - m_begin : 0;
    const int n_visits = group * per_head;  // visit v: query head hk*group + v / per_head, Q block m_begin + v % per_head
    const bool with_dq = dq_accum != nullptr;

    if (tid == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < 2; ++s) {
            mbar_init(full(s), 1 + 32);  // the TMA issue (arrive + expect_tx) and the 32 lanes' lse/Delta stores
            mbar_init(empty(s), 256);    // every consumer thread arrives after its own reads of the stage
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_async_smem();
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        const int warp = tid >> 5;
        if (warp == 0) {  // ------------------------------------------------------------------- loads
            if (lane == 0) {
                mbar_expect_tx(kv_full, 2 * kKVBytes);
#pragma unroll
                for (int p = 0; p < D / kF3bPanel; ++p) {
                    tma_load_4d(sK + p * Bc * kRowBytes, &tm_k, kv_full, p * kF3bPanel, hk, n0, b);
                    tma_load_4d(sV + p * Bc * kRowBytes, &tm_v, kv_full, p * kF3bPanel, hk, n0, b);
                }
            }
            for (int v = 0; v < n_visits; ++v) {
                const int s = v & 1;
                const int h = hk * group + v / per_head, m0 = (m_begin + v % per_head) * Br;
                mbar_wait(empty(s), ((v >> 1) & 1) ^ 1);
                if (lane == 0) {
                    mbar_expect_tx(full(s), 2 * kQBytes);
#pragma unroll
                    for (int p = 0; p < D / kF3bPanel; ++p) {
                        tma_load_4d(sQ + s * kQBytes + p * Br * kRowBytes, &tm_q, full(s), p * kF3bPanel, h, m0, b);
                        tma_load_4d(sdO + s * kQBytes + p * Br * kRowBytes, &tm_do, full(s), p * kF3bPanel, h, m0, b);
                    }
                }
                const long long row_base = ((long long)b * heads + h) * seq_len;
                for (int r = lane; r < Br; r += 32) {
                    const int row = m0 + r;
                    float l = INFINITY, dl = 0.f;
                    if (row < seq_len) {
                        l = __ldg(lse + row_base + row);
                        l = (l == -INFINITY) ? INFINITY : l * kF3bLog2e;  // a row that sees no key: P = 0
                        dl = __ldg(delta + row_base + row);
                    }
                    sLp[s * Br + r] = l;
                    sDlp[s * Br + r] = dl;
                }
                mbar_arrive(full(s));
            }
        } else if (warp >= 1 && warp <= kF3bWriters && with_dq) {  // ----------------------------- dQ writers
            // kF3bWriters warps, warp w rows w - 1, w - 1 + kF3bWriters, ..: a warp issues its bulk reduce-adds one
            // lane at a time (uniform operands), so more warps drain the partial sooner
            for (int v = 0; v < n_visits; ++v) {
                const int h = hk * group + v / per_head, m0 = (m_begin + v % per_head) * Br;
                named_sync(2, 256 + 32 * kF3bWriters);  // the consumers' dQ_i partial is in sdQ
#pragma unroll 1
                for (int r = (warp - 1) + kF3bWriters * lane; r < Br; r += 32 * kF3bWriters) {
                    const int row = m0 + r;
                    if (row < seq_len)
                        bulk_reduce_add_f32(dq_accum + (((long long)b * seq_len + row) * heads + h) * D,
                                            sdQ + r * kDqRow * 4, D * 4);
                }
                bulk_commit();
                bulk_wait_read();  // sdQ may be overwritten
                if (v + 1 < n_visits) named_arrive(3, 256 + 32 * kF3bWriters);
            }
            bulk_wait_all();
        }
        return;
    }

    // -------------------------------------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cw = wg - 1;            // keys cw*64 .. cw*64+63 of the block
    const int wtid = tid - 128 * wg;  // thread in the warpgroup
    const int warp = wtid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int key0 = n0 + cw * 64 + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

    // A = K or V rows cw*64.. (K-major); B = Q or dO (K-major, N = Br rows); step ks of 16 along d
    auto kv_desc_a = [&](unsigned t, int ks) {
        return smem_desc(t + (ks / 4) * Bc * kRowBytes + cw * 64 * kRowBytes + (ks % 4) * 32, 16, 1024);
    };
    auto q_desc_b = [&](unsigned t, int ks) { return smem_desc(t + (ks / 4) * Br * kRowBytes + (ks % 4) * 32, 16, 1024); };
    // B = Q or dO as N-major (K-dim = Br rows, N = d): LBO = next 64 columns (panel), SBO = next 8 rows
    auto q_desc_n = [&](unsigned t, int kk) { return smem_desc(t + kk * 16 * kRowBytes, Br * kRowBytes, 1024); };
    // dQ: A = dS (M = Br queries, MN-major: the stored dS^T's columns), step kk of 16 keys; B = K (N-major),
    // columns cw*d/2 ..
    auto ds_desc_t = [&](unsigned t, int mt, int kk) {
        return smem_desc(t + mt * Bc * kRowBytes + kk * 16 * kRowBytes, Bc * kRowBytes, 1024);
    };
    auto k_desc_n = [&](int kk) {
        const int c = kDqSplitRows ? 0 : cw * NQ;  // first column
        return smem_desc(sK + (c / kF3bPanel) * Bc * kRowBytes + (c % kF3bPanel) * 2 + kk * 16 * kRowBytes,
                         Bc * kRowBytes, 1024);
    };

    float acc_dk[KR], acc_dv[KR];
#pragma unroll
    for (int i = 0; i < KR; ++i) acc_dk[i] = acc_dv[i] = 0.f;
    mbar_wait(kv_full, 0);

    for (int v = 0; v < n_visits; ++v) {
        const int s = v & 1;
        const int m0 = (m_begin + v % per_head) * Br;
        mbar_wait(full(s), (v >> 1) & 1);
        float acc_s[SR], acc_dp[SR];
        fence_regs(acc_s);
        fence_regs(acc_dp);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<Br, T>(acc_s, kv_desc_a(sK, ks), q_desc_b(sQ + s * kQBytes, ks), ks > 0);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
            wgmma_ss<Br, T>(acc_dp, kv_desc_a(sV, ks), q_desc_b(sdO + s * kQBytes, ks), ks > 0);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(acc_s);
        // P^T = exp2(S^T scale log2e - lse log2e), masked
        const float* Ls = sLp + s * Br;
        const float* Ds = sDlp + s * Br;
#pragma unroll
        for (int nt = 0; nt < Br / 8; ++nt) {
            const float2 l2 = *reinterpret_cast<const float2*>(Ls + nt * 8 + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc_s[nt * 4 + e] = exp2_approx(fmaf(acc_s[nt * 4 + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
        }
        // the mask in a pass of its own, taken by the visits that need it only (the diagonal, the last keys): inside
        // the exp loop its index arithmetic cost every visit at d = 64 (docs/kernels.md, v4)
        if ((n0 + Bc > kv_len) || (Causal && n0 + Bc - 1 > m0 + offset)) {
#pragma unroll
            for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + 8 * (e >> 1), col = m0 + nt * 8 + 2 * t4 + (e & 1);
                    if (key >= kv_len || (Causal && key > col + offset)) acc_s[nt * 4 + e] = 0.f;
                }
        }
        wgmma_wait<0>();
        fence_regs(acc_dp);
        // dS^T = P^T o (dP^T - Delta)
#pragma unroll
        for (int nt = 0; nt < Br / 8; ++nt) {
            const float2 d2 = *reinterpret_cast<const float2*>(Ds + nt * 8 + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dp[nt * 4 + e] = acc_s[nt * 4 + e] * (acc_dp[nt * 4 + e] - ((e & 1) ? d2.y : d2.x));
        }
        unsigned p_frag[KP][4], ds_frag[KP][4];
        to_frags<T, KP>(acc_s, p_frag);
        to_frags<T, KP>(acc_dp, ds_frag);
        // kDqUnderDk (FlashAttention-3's order): dV += P^T dO; (dS^T to shared memory, both warpgroups synchronize)
        // dQ_i = dS K; dK += dS^T Q: dQ completes before dK, so the dQ epilogue (shared-memory stores) runs under the
        // dK GEMM. Else dV and dK are issued together before the dS^T barrier, then dQ.
        fence_regs(acc_dv);
        fence_regs(acc_dk);
        fence_regs(p_frag);
        fence_regs(ds_frag);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) wgmma_rs<D, T>(acc_dv, p_frag[kk], q_desc_n(sdO + s * kQBytes, kk), 1);
        if (!kDqUnderDk)
#pragma unroll
            for (int kk = 0; kk < KP; ++kk) wgmma_rs<D, T>(acc_dk, ds_frag[kk], q_desc_n(sQ + s * kQBytes, kk), 1);
        wgmma_commit();
        if (with_dq) {
            // dS^T to shared memory from its A fragments: row = key (within the block), column = query; 128B
            // swizzle of 16 B chunks. Fragment e of k16 step kk: row +8 if e is odd, columns 16 kk + 8 (e / 2).
            const unsigned ds_buf = sdS + (v & 1) * kDSBytes;
#pragma unroll
            for (int kk = 0; kk < KP; ++kk)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = cw * 64 + warp * 16 + g + 8 * (e & 1), nt = 2 * kk + (e >> 1);
                    const unsigned addr = ds_buf + (nt / 8) * Bc * kRowBytes + r * kRowBytes +
                                          (((nt % 8) ^ (r & 7)) << 4) + t4 * 4;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(ds_frag[kk][e]) : "memory");
                }
            fence_async_smem();
            named_sync(1, 256);  // both warpgroups' keys of dS^T are in place
            float acc_dq[NQ / 2];
            fence_regs(acc_dq);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Bc / 16; ++kk)
                wgmma_ss_tt<NQ, T>(acc_dq, ds_desc_t(ds_buf, kDqSplitRows ? cw : 0, kk), k_desc_n(kk), kk > 0);
            wgmma_commit();
            if (kDqUnderDk) {
#pragma unroll
                for (int kk = 0; kk < KP; ++kk) wgmma_rs<D, T>(acc_dk, ds_frag[kk], q_desc_n(sQ + s * kQBytes, kk), 1);
                wgmma_commit();
                wgmma_wait<1>();  // dV and dQ_i done; dK still running
            } else {
                wgmma_wait<0>();
            }
            fence_regs(acc_dq);
            if (v > 0) named_sync(3, 256 + 32 * kF3bWriters);  // the dQ writers have read the previous partial
            const int r0 = kDqSplitRows ? cw * 64 : 0, c0 = kDqSplitRows ? 0 : cw * NQ;
#pragma unroll
            for (int nd = 0; nd < NQ / 8; ++nd)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int r = r0 + warp * 16 + g + 8 * hr;
                    *reinterpret_cast<float2*>(sdQp + r * kDqRow + c0 + nd * 8 + 2 * t4) =
                        make_float2(acc_dq[nd * 4 + 2 * hr] * scale, acc_dq[nd * 4 + 2 * hr + 1] * scale);
                }
            fence_async_smem();
            named_arrive(2, 256 + 32 * kF3bWriters);
        } else if (kDqUnderDk) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KP; ++kk) wgmma_rs<D, T>(acc_dk, ds_frag[kk], q_desc_n(sQ + s * kQBytes, kk), 1);
            wgmma_commit();
        }
        wgmma_wait<0>();
        fence_regs(acc_dv);
        fence_regs(acc_dk);
        fence_regs(p_frag);
        fence_regs(ds_frag);
        // each thread releases the stage after its own reads of L_i, D_i (generic loads) and its wgmmas' reads of
        // Q_i, dO_i: an mbarrier arrive releases the arriving thread's prior accesses only
        mbar_arrive(empty(s));
    }

    // dK (times scale), dV, written once
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int key = key0 + 8 * hr;
        if (key < kv_len) {
            const long long off = (((long long)b * kv_len + key) * kv_heads + hk) * D;
#pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                *reinterpret_cast<unsigned*>(dk + off + nd * 8 + 2 * t4) =
                    pack2<T>(acc_dk[nd * 4 + 2 * hr] * scale, acc_dk[nd * 4 + 2 * hr + 1] * scale);
                *reinterpret_cast<unsigned*>(dv + off + nd * 8 + 2 * t4) =
                    pack2<T>(acc_dv[nd * 4 + 2 * hr], acc_dv[nd * 4 + 2 * hr + 1]);
            }
        }
    }
}

}  // namespace iosim
