// flash3_fwd.cu: FlashAttention-3-style forward (Shah et al. 2024) for Hopper, sm_90a: TMA, mbarriers, wgmma,
// warp specialization with register reallocation, and ping-pong between two consumer warpgroups.
//
//   O = softmax(scale * Q K^T) V, per (batch, head); Q (B, N, H, d), K and V (B, N_kv, H_kv, d), O like Q,
//   lse (B, H, N) fp32 = natural-log logsumexp of each row's scaled scores (-inf for a row that sees no key).
//
// One thread block per SM (persistent), taking Q tiles of Br = 128 rows of one (batch, head) in turn; 3 warpgroups:
//   warpgroup 0, the producer (setmaxnreg 40): one thread issues every TMA load: Q_i once, then K_j and V_j
//                into a ring of Stages buffers each, each load completing on its "full" mbarrier; it waits on
//                the stage's "empty" mbarrier (released by the consumers) before reusing a buffer.
//   warpgroups 1, 2, the consumers (setmaxnreg 232): each owns 64 rows of Q_i (wgmma's M) and, per K/V tile:
//     Alg. line 8:  S = Q_i K_j^T                 wgmma m64 n=Bc k16, A and B from shared memory (K-major)
//     Alg. line 9:  m_new = max(m, rowmax S); P = exp2(S*scale*log2e - m_new*scale*log2e); l = l*corr + rowsum P
//     Alg. line 10: O = O * corr + P V_j          wgmma m64 n=d k16, A = P from registers, B = V (N-major)
//   Alg. line 12-13: O = O / l, lse = m*scale + ln(l), written once.
// Overlap (FA3 section 3.1-3.2): inside a warpgroup, the wgmma of S_{j+1} = Q K_{j+1}^T and of O += P_j V_j are
// issued together and the softmax of S_{j+1} runs while P_j V_j is still on the tensor cores; between the two
// warpgroups, two named barriers pass a turn back and forth (ping-pong), so one warpgroup issues its GEMMs while
// the other does its softmax.
// Shared memory (terms in iosim/launch/forward.py flash3_smem_terms): Q (Br x d) + K, V (Stages x Bc x d each), stored
// as d/64 column panels of rows x 128 B in TMA's 128-byte swizzle, which is wgmma's 128B-swizzle layout.
// Masking: keys >= kv_len (the TMA box past the tensor's end reads zeros) and, when causal, keys j > i + (kv_len - N)
// (bottom-right aligned) get -inf; K/V tiles entirely above the diagonal are never loaded. Local (a sliding window):
// keys outside i + off - left .. i + off + right get -inf, tiles wholly outside every row's window are never loaded.
// Grouped-query / multi-query: query head h reads kv head h / (H / H_kv).
//
// Versions (llm.c style; the log with the floor before and the measurement after each is in docs/kernels.md):
//   v1  first version: Br=128 (2 consumer warpgroups x 64 rows), Bc=128 (64 at d=256), 2 stages, ping-pong and
//       intra-warpgroup overlap, O stored straight from registers (4-byte stores), grid (Tr, H, B).
//       Measured (H100, bf16, N=4096): d=128 647 TFLOP/s (0.96x cuDNN), causal 565 (0.98x); d=64 440 (0.91x).
//   v2  persistent grid (one block per SM, tiles in flash2's order, causal last-first within a head): the next
//       tile's Q and first K/V load while this tile's last P V and O stores run. Measured (H100, A/B with v1):
//       d=64 +6-9% non-causal, d=128 -1..+1%. (v3, partial sums in the softmax, was slower and is not kept.)
//   v4  snake order of the persistent grid's rounds (causal blocks' work evens out). Measured (H100): causal
//       N=1024 +30%, N=4096 +8%, N=16384 +3% (the snake cannot fix G = 132 blocks vs Tr = 128 tiles a head).
//   v5  causal: a greedy tile schedule computed on the host (each tile to the block that frees first).
//       Measured (H100): d=128 N=16384 causal 0.74x -> 1.14x cuDNN; d=256 causal N >= 8192 +46-83%.
//   v5.1 registers 40 (producer) / 232 (consumers) instead of 24 / 240: v5's producer spilled 4 bytes at d=64 causal
//       (its schedule walk needs more than 24 registers); 128 x 40 + 256 x 232 = 64,512.
//   fp8 (T = e4m3, issue 27): k32 wgmma on e4m3 Q, K and V^T (kernels/quantize_fp8.cu writes V^T with its keys in
//       the order of P's register fragment), block scales folded into the softmax scale and O's rescale, P in
//       [0, 256], O in bf16. Measured (H100): d=128 829-921 TFLOP/s, d=256 905-986, 0.78-0.97x cuDNN's fp8.
//   fp8 v2  the softmax's row max and row sum in 4 independent chains (kF3Fp8Chains): ncu (H100, d=128, N=8192) showed
//       the tensor pipe 46% and MUFU 50% busy, 0.59 eligible warps a scheduler, 28% of stalls on fixed-latency
//       dependencies; one chain is 96 dependent FADDs a row pair per tile at Bc=192. Measured (H100, same call as v1):
//       d=128 876-885 / 953-962 / 988-992 TFLOP/s at N=4K/8K/16K (+5-7%), d=64 +10%, d=256 +-1%, causal d=128
//       equal at N=4K, -1.5 to -2% at N=16K.
//   Local (issue 28): a sliding window (left, right; FlashAttention's window_size, 16-bit inputs): each Q tile
//       visits K/V tiles kv_first .. kv_blocks - 1, masking the tiles its rows straddle. Measured (H100, B=2,
//       N=8192, causal windows 256 / 1024 / 4096): d=64 163 / 318 / 412 TFLOP/s (1.12-1.15x FlexAttention),
//       d=128 230 / 461 / 602 (1.49-1.62x).
//   Varlen (issue 28): packed sequences (q (total_q, H, d), k, v (total_k, H_kv, d), cu_seqlens; 16-bit inputs,
//       causal, windowed or neither). The tensor maps see one batch of total rows, so a tile's boxes start at its
//       sequence's first row and a box that runs past the sequence reads the next one's rows: its keys are masked
//       (col >= n_k) and its query rows are never stored. Tiles come from a host schedule of the working tiles
//       (iosim/launch/flash3_schedule.py varlen_schedule), tile t = m + Tr * (h + H * b) with Tr of the longest.
#include "common.cuh"
#include "hopper.cuh"  // before the wgmma wrappers: they name its e4m3
#include "flash3_wgmma.cuh"

namespace iosim {

#ifndef IOSIM_F3_STAGES
#define IOSIM_F3_STAGES 2
#endif
constexpr int kF3Stages = IOSIM_F3_STAGES;  // iosim/launch/forward.py FLASH3_STAGES
// fp8 softmax: independent max and row-sum chains per row. One chain is Bc / 2 dependent FADDs (and Bc / 4 FMNMX) a
// row pair per tile, on the critical path of a softmax the tensor cores wait for at fp8's rate; measured (H100, A/B in
// one call): 2 and 4 chains +5-7% at d = 128 and +6-10% at d = 64 (4), 8 slower than 4 (docs/kernels.md, fp8 v2)
#ifndef IOSIM_F3_FP8_CHAINS
#define IOSIM_F3_FP8_CHAINS 4
#endif
constexpr int kF3Fp8Chains = IOSIM_F3_FP8_CHAINS;
constexpr int kF3Threads = 384;  // FLASH3_THREADS: producer warpgroup + 2 consumer warpgroups
constexpr int kF3Panel = 64;   // FLASH3_SWIZZLE_ELEMS: elements per 128-byte row of a swizzled panel

// which K/V tiles Q tile m_block visits: 0 .. n_blocks-1 (causal: the ones left of the diagonal; Local: those left
// of the last row's window end, from kv_first below)
template <int Br, int Bc, bool Causal, bool Local>
__device__ __forceinline__ int kv_blocks(int m_block, int seq_len, int kv_len, int right) {
    int n_blocks = (kv_len + Bc - 1) / Bc;  // Tc
    if (Causal || Local) {
        // largest key any row sees (Local: right keys past the diagonal; causal: none)
        const int last_key = min((m_block + 1) * Br, seq_len) - 1 + (kv_len - seq_len) + (Local ? right : 0);
        n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / Bc + 1);
    }
    return n_blocks;
}
// the first K/V tile Q tile m_block visits: 0, or (Local) the tile of the smallest key its first row sees
template <int Br, int Bc, bool Local>
__device__ __forceinline__ int kv_first(int m_block, int seq_len, int kv_len, int left) {
    return Local ? max(0, m_block * Br + (kv_len - seq_len) - left) / Bc : 0;
}

// the output type: the input type, except fp8 inputs, whose O is bf16 (as FlashAttention-3's fp8 forward)
template <typename T> struct F3Out { using type = T; };
template <> struct F3Out<e4m3> { using type = __nv_bfloat16; };

// fp8 (T = e4m3): P = exp2(s - m + kF3PShift) lies in [0, 256], so P's small values stay in e4m3's normal range
// (a factor of 256 that cancels in O / l; FlashAttention-3's Max_offset)
constexpr float kF3PShift = 8.f;

// The sequence a tile belongs to: its first query and key rows in q and k (0 for the dense batch), the batch
// coordinate of the TMA boxes (the dense batch's b; 0 for packed sequences, whose tensors are one batch of
// total rows), and its lengths.
struct F3Seq {
    int q0, k0, b, n_q, n_k;
};

template <int D, int Bc, typename T, bool Causal, bool Local = false, bool Varlen = false>
__global__ void __launch_bounds__(kF3Threads, 1)
    flash3_fwd_kernel(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                      const __grid_constant__ TmaMap tm_v, typename F3Out<T>::type* __restrict__ o,
                      float* __restrict__ lse, const int* __restrict__ schedule,
                      const float* __restrict__ q_scale, const float* __restrict__ k_scale,
                      const float* __restrict__ v_scale, int batch,
                      int seq_len, int kv_len, int heads, int kv_heads, float scale_log2, int window_left,
                      int window_right, const int* __restrict__ cu_seqlens_q, const int* __restrict__ cu_seqlens_k,
                      int total_q) {
    using OT = typename F3Out<T>::type;
    constexpr bool kFp8 = is_same<T, e4m3>::value;
    static_assert(!(Causal && Local), "a causal window is Local with right = 0");
    static_assert(!(kFp8 && (Local || Varlen)), "windows and packed sequences are 16-bit kernels'");
    constexpr int E = kFp8 ? 1 : 2;          // bytes per input element
    constexpr int Br = 128;                 // 2 consumer warpgroups x 64 rows
    // Q and K: d/panel column panels of rows x kRowBytes, swizzled (128 B rows; 64 B where a row of d is 64 B)
    constexpr int kRowBytes = D * E < 128 ? D * E : 128;
    constexpr int kPanelElems = kRowBytes / E;
    constexpr int kPanels = D * E / kRowBytes;
    constexpr int kStepsPerPanel = kRowBytes / 32;  // k steps of Q K^T a panel row holds (32 B: k16, or fp8 k32)
    // fp8: V^T (d rows x Bc keys): Bc / kVRowBytes key panels of d x kVRowBytes; bf16: V as K
    constexpr int kVRowBytes = kFp8 ? (Bc % 128 == 0 ? 128 : 64) : kRowBytes;
    constexpr int kQBytes = Br * D * E, kKVBytes = Bc * D * E;
    constexpr int SR = Bc / 2;               // fp32 registers of S per thread (64 x Bc over 128 threads)
    constexpr int OR = D / 2;                // fp32 registers of O per thread
    constexpr int KP = Bc / (kFp8 ? 32 : 16);  // k steps of P V (A fragments of P)
    static_assert(D * E % kRowBytes == 0 && Bc % (kFp8 ? 64 : 16) == 0 && Bc <= 256, "tile shape");

    extern __shared__ unsigned char smem_raw[];
    // the swizzle pattern repeats every 1024 B: align the base (flash3_smem_terms reserves the slack)
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base;                         // kPanels x (Br x kRowBytes)
    const unsigned sK = sQ + kQBytes;                 // Stages x kPanels x (Bc x kRowBytes)
    const unsigned sV = sK + kF3Stages * kKVBytes;    // Stages x kPanels x (Bc x kRowBytes); fp8: V^T panels
    const unsigned bars = sV + kF3Stages * kKVBytes;  // 8-byte mbarriers
    const unsigned q_full = bars, q_empty = bars + 8;
    auto k_full = [&](int s) { return bars + 8 * (2 + s); };
    auto k_empty = [&](int s) { return bars + 8 * (2 + kF3Stages + s); };
    auto v_full = [&](int s) { return bars + 8 * (2 + 2 * kF3Stages + s); };
    auto v_empty = [&](int s) { return bars + 8 * (2 + 3 * kF3Stages + s); };

    const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
    // Varlen: sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (keys likewise), seq_len the
    // longest sequence's queries (the tile numbering's Tr), lse (H, total_q); tiles past a sequence's end are skipped
    const int Tr = (seq_len + Br - 1) / Br;
    const int n_tiles = Tr * heads * batch;
    const long long q_stride = (long long)heads * D;  // elements between consecutive query rows
    auto seq_of = [&](int b) -> F3Seq {
        if constexpr (Varlen) {
            const int q0 = __ldg(cu_seqlens_q + b), k0 = __ldg(cu_seqlens_k + b);
            return {q0, k0, 0, __ldg(cu_seqlens_q + b + 1) - q0, __ldg(cu_seqlens_k + b + 1) - k0};
        } else {
            return {0, 0, b, seq_len, kv_len};
        }
    };
    // the current tile's sequence, as the mask reads it: keys, causal offset (row i sees key j iff j <= i + offset)
    // and the window's bounds (Local: row i sees keys i + offset - left .. i + offset + right, each bound at most the
    // sequence: no overflow)
    int n_k = kv_len, offset = kv_len - seq_len, left = 0, right = 0;
    auto enter = [&](const F3Seq& sq) {
        n_k = sq.n_k;
        offset = sq.n_k - sq.n_q;
        left = Local ? min(window_left, sq.n_k) : 0;
        right = Local ? min(window_right, sq.n_q) : 0;
    };
    // Persistent grid: tiles t = m + Tr * (h + H * b) in the order of flash2's grid (Q tiles of one (batch, head)
    // fastest, so co-resident blocks share K/V in L2); causal Q tiles last-first within a head (longest first).
    // Round r gives block x tile r * gridDim.x + x, in reverse on odd rounds (a snake): causal tiles shrink along
    // the list, so a heavy tile in one round is paired with a light one in the next and the blocks' sums of work
    // even out (a plain stride left some blocks with 3x the work of others at N = 16384, v2).
    // Causal calls may instead bring a schedule computed on the host (iosim/launch/flash3_schedule.py: greedy,
    // each tile to the block that frees first; CSR: gridDim.x + 1 offsets, then the tiles).
    // tile_at(i): this block's i-th tile; -1 past its last, -2 for a snake slot past the end of the list.
    auto tile_at = [&](int i) -> int {
        if (schedule != nullptr) {
            const int a = __ldg(schedule + blockIdx.x), e = __ldg(schedule + blockIdx.x + 1);
            return a + i < e ? __ldg(schedule + gridDim.x + 1 + a + i) : -1;
        }
        if (i * (int)gridDim.x >= n_tiles) return -1;
        const int x = (i & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
        const int t = i * (int)gridDim.x + x;
        return t < n_tiles ? t : -2;
    };
    auto tile_coords = [&](int t, int& m_block, int& h, int& b) {
        const int x = t % Tr;
        m_block = (Causal && !Varlen) ? Tr - 1 - x : x;  // packed sequences: the host's list gives the order
        h = (t / Tr) % heads;
        b = t / (Tr * heads);
    };

    if (tid == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, 8);  // one arrive per consumer warp
        for (int s = 0; s < kF3Stages; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), 8);
            mbar_init(v_empty(s), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ------------------------------------------------------------------------------------ producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int it = 0, tile_no = 0;  // K/V tiles and Q tiles loaded so far (ring slot and phase follow from them)
            for (int i = 0;; ++i) {
                const int t = tile_at(i);
                if (t == -1) break;
                if (t < 0) continue;
                int m_block, h, b;
                tile_coords(t, m_block, h, b);
                const F3Seq sq = seq_of(b);
                if (Varlen && m_block * Br >= sq.n_q) continue;  // past this sequence's last tile
                enter(sq);
                const int n_first = kv_first<Br, Bc, Local>(m_block, sq.n_q, sq.n_k, left);
                const int n_end = kv_blocks<Br, Bc, Causal, Local>(m_block, sq.n_q, sq.n_k, right);
                if (n_end <= n_first) continue;  // the consumers write zeros without loading anything
                const int hk = h / (heads / kv_heads);
                // Alg. line 4: Q_i, one box per 64-column panel, once the consumers are done with the last Q
                mbar_wait(q_empty, (tile_no & 1) ^ 1);
                mbar_expect_tx(q_full, kQBytes);
#pragma unroll
                for (int p = 0; p < kPanels; ++p)
                    tma_load_4d(sQ + p * Br * kRowBytes, &tm_q, q_full, p * kPanelElems, h, sq.q0 + m_block * Br,
                                sq.b);
                ++tile_no;
                // Alg. line 6: K_j, V_j through the ring
                for (int j = n_first; j < n_end; ++j, ++it) {
                    const int s = it % kF3Stages;
                    const unsigned ph = (it / kF3Stages) & 1;
                    mbar_wait(k_empty(s), ph ^ 1);  // the consumers are done with the tile Stages ago in this slot
                    mbar_expect_tx(k_full(s), kKVBytes);
#pragma unroll
                    for (int p = 0; p < kPanels; ++p)
                        tma_load_4d(sK + s * kKVBytes + p * Bc * kRowBytes, &tm_k, k_full(s), p * kPanelElems, hk,
                                    sq.k0 + j * Bc, sq.b);
                    mbar_wait(v_empty(s), ph ^ 1);
                    mbar_expect_tx(v_full(s), kKVBytes);
                    if constexpr (kFp8) {  // V^T (B, H_kv, d, N_kv padded): boxes of kVRowBytes keys x d
#pragma unroll
                        for (int p = 0; p < Bc / kVRowBytes; ++p)
                            tma_load_4d(sV + s * kKVBytes + p * D * kVRowBytes, &tm_v, v_full(s),
                                        j * Bc + p * kVRowBytes, 0, hk, b);
                    } else {
#pragma unroll
                        for (int p = 0; p < kPanels; ++p)
                            tma_load_4d(sV + s * kKVBytes + p * Bc * kRowBytes, &tm_v, v_full(s), p * kF3Panel, hk,
                                        sq.k0 + j * Bc, sq.b);
                    }
                }
            }
        }
        return;
    }

    // ---------------------------------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1;                 // consumer warpgroup 0 or 1: rows cw*64 .. cw*64+63 of the tile
    const int wtid = tid - 128 * wg;       // thread in the warpgroup
    const int warp = wtid >> 5;            // warp in the warpgroup: rows warp*16 .. +15
    const int g = lane >> 2, t4 = lane & 3;  // accumulator coordinates: row group, thread in group
    const int my_bar = 1 + cw, other_bar = 2 - cw;  // ping-pong: named barrier of my turn, of the other's turn

    // Ping-pong: every GEMM turn is named_sync(mine) ... named_arrive(other's); warpgroup 1 hands warpgroup 0 the
    // first turn here, and warpgroup 0 takes back the last hand-over after its last tile, so the counts balance.
    if (cw == 1) named_arrive(1, 256);

    float acc_o[OR];
    float acc_s[SR];
    unsigned p_frag[KP][4];
    float m_i[2], l_i[2];  // running max (raw score units) and this thread's partial row sum, rows +0 and +8

    // descriptors: Q rows cw*64.. of panel p, k16 step within the panel at +32 B; K the same; V N-major:
    // LBO = the next 64 columns of d (the next panel, Bc x 128 B away), SBO = the next 8 keys (1024 B)
    // fp8: k32 steps are 32 B too; V^T is K-major like K (rows of keys), kk steps of 32 keys
    auto q_desc = [&](int ks) {
        return smem_desc_sw<kRowBytes>(sQ + (ks / kStepsPerPanel) * Br * kRowBytes + cw * 64 * kRowBytes +
                                       (ks % kStepsPerPanel) * 32);
    };
    auto k_desc = [&](int s, int ks) {
        return smem_desc_sw<kRowBytes>(sK + s * kKVBytes + (ks / kStepsPerPanel) * Bc * kRowBytes +
                                       (ks % kStepsPerPanel) * 32);
    };
    auto v_desc = [&](int s, int kk) {
        if constexpr (kFp8)
            return smem_desc_sw<kVRowBytes>(sV + s * kKVBytes + (kk / (kVRowBytes / 32)) * D * kVRowBytes +
                                            (kk % (kVRowBytes / 32)) * 32);
        else
            return smem_desc(sV + s * kKVBytes + kk * 16 * kRowBytes, Bc * kRowBytes, 1024);
    };

    auto issue_qk = [&](int s) {  // Alg. line 8: S = Q_i K_j^T
        fence_regs(acc_s);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D * E / 32; ++ks) wgmma_ss<Bc, T>(acc_s, q_desc(ks), k_desc(s, ks), ks > 0);
        wgmma_commit();
    };
    auto issue_pv = [&](int s) {  // Alg. line 10: O += P V_j
        fence_regs(acc_o);
        fence_regs(p_frag);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) wgmma_rs<D, T>(acc_o, p_frag[kk], v_desc(s, kk), 1);
        wgmma_commit();
    };
    // mask and online softmax of S (in place: S becomes unnormalized P in fp32); returns the O correction factors.
    // fp8: the tile's scale sl = scale_log2 * q_scale * k_scale_j changes with j, so m is kept scaled (log2 units)
    auto softmax = [&](int j, int m0, int row0, float sl, float (&corr)[2]) {
        const int n0 = j * Bc, r0 = m0 + cw * 64;  // this warpgroup's rows: r0 .. r0 + 63
        const bool need_mask = (n0 + Bc > n_k) || (Causal && n0 + Bc - 1 > r0 + offset) ||
                               (Local && (n0 + Bc - 1 > r0 + offset + right || n0 < r0 + 63 + offset - left));
        if (need_mask) {
#pragma unroll
            for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row0 + ((e >> 1) << 3);
                    const int col = n0 + nt * 8 + 2 * t4 + (e & 1);
                    if (col >= n_k || (Causal && col > row + offset) ||
                        (Local && (col > row + offset + right || col < row + offset - left)))
                        acc_s[nt * 4 + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // hr = 0: row g, hr = 1: row g + 8
            if constexpr (kFp8) {
                constexpr int C = kF3Fp8Chains;
                float mxc[C];
#pragma unroll
                for (int c = 0; c < C; ++c) mxc[c] = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < Bc / 8; ++nt)
                    mxc[nt % C] = fmaxf(mxc[nt % C], fmaxf(acc_s[nt * 4 + 2 * hr], acc_s[nt * 4 + 2 * hr + 1]));
#pragma unroll
                for (int c = 1; c < C; ++c) mxc[0] = fmaxf(mxc[0], mxc[c]);
                float mx = mxc[0];
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_i[hr], mx * sl);  // sl > 0: the max of the scaled scores
                const float m_safe = (m_new == -INFINITY) ? 0.f : m_new;
                corr[hr] = exp2_approx(m_i[hr] - m_safe);
                m_i[hr] = m_new;
                const float bias = kF3PShift - m_safe;
                float rsc[C];
#pragma unroll
                for (int c = 0; c < C; ++c) rsc[c] = 0.f;
#pragma unroll
                for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
                    for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
                        const float p = exp2_approx(fmaf(acc_s[nt * 4 + e], sl, bias));
                        acc_s[nt * 4 + e] = p;
                        rsc[nt % C] += p;
                    }
#pragma unroll
                for (int c = 1; c < C; ++c) rsc[0] += rsc[c];
                const float rs = rsc[0];
                l_i[hr] = l_i[hr] * corr[hr] + rs;
            } else {
            float mx = m_i[hr];
#pragma unroll
            for (int nt = 0; nt < Bc / 8; ++nt) mx = fmaxf(mx, fmaxf(acc_s[nt * 4 + 2 * hr], acc_s[nt * 4 + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // a row with no visible key so far keeps max -inf: subtract 0 instead, so exp2(-inf - 0) = 0, no NaN
            const float m_scaled = (mx == -INFINITY) ? 0.f : mx * scale_log2;
            corr[hr] = exp2_approx(m_i[hr] * scale_log2 - m_scaled);
            m_i[hr] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
                for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
                    const float p = exp2_approx(fmaf(acc_s[nt * 4 + e], scale_log2, -m_scaled));
                    acc_s[nt * 4 + e] = p;
                    rs += p;
                }
            l_i[hr] = l_i[hr] * corr[hr] + rs;
            }
        }
    };
    auto rescale_o = [&](const float (&corr)[2]) {
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
            acc_o[nd * 4 + 0] *= corr[0];
            acc_o[nd * 4 + 1] *= corr[0];
            acc_o[nd * 4 + 2] *= corr[1];
            acc_o[nd * 4 + 3] *= corr[1];
        }
    };
    auto convert_p = [&]() {  // P (fp32 accumulator layout) -> wgmma A fragments in the input dtype
        if constexpr (kFp8) {
            // A fragment kk (keys 32kk..32kk+31): register r holds 4 e4m3 at row g (+8 for r = 1, 3), k positions
            // 4*t4 + {0..3} (+16 for r = 2, 3). This thread's accumulator holds keys 8i + 2*t4 + {0, 1}; so k position
            // 4*t4 + e carries key (e / 2) * 8 + 2*t4 + e % 2 of its 16-key group, and V^T's keys are stored in that
            // order (iosim.gpu.fp8: within each group of 16, column p holds key fp8_key_of(p)): no shuffles.
#pragma unroll
            for (int kk = 0; kk < KP; ++kk) {
                const float* a = acc_s + 16 * kk;  // n8 groups 4kk .. 4kk+3, 4 registers each
                p_frag[kk][0] = pack4_e4m3(a[0], a[1], a[4], a[5]);
                p_frag[kk][1] = pack4_e4m3(a[2], a[3], a[6], a[7]);
                p_frag[kk][2] = pack4_e4m3(a[8], a[9], a[12], a[13]);
                p_frag[kk][3] = pack4_e4m3(a[10], a[11], a[14], a[15]);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KP; ++kk) {
                p_frag[kk][0] = pack2<T>(acc_s[(2 * kk) * 4 + 0], acc_s[(2 * kk) * 4 + 1]);
                p_frag[kk][1] = pack2<T>(acc_s[(2 * kk) * 4 + 2], acc_s[(2 * kk) * 4 + 3]);
                p_frag[kk][2] = pack2<T>(acc_s[(2 * kk + 1) * 4 + 0], acc_s[(2 * kk + 1) * 4 + 1]);
                p_frag[kk][3] = pack2<T>(acc_s[(2 * kk + 1) * 4 + 2], acc_s[(2 * kk + 1) * 4 + 3]);
            }
        }
    };

    int it = 0, tile_no = 0;  // the producer's counters, kept in step
    for (int i = 0;; ++i) {
        const int t = tile_at(i);
        if (t == -1) break;
        if (t < 0) continue;
        int m_block, h, b;
        tile_coords(t, m_block, h, b);
        const F3Seq sq = seq_of(b);
        if (Varlen && m_block * Br >= sq.n_q) continue;  // past this sequence's last tile
        enter(sq);
        const int m0 = m_block * Br;
        const int n_first = kv_first<Br, Bc, Local>(m_block, sq.n_q, sq.n_k, left);
        const int n_blocks = kv_blocks<Br, Bc, Causal, Local>(m_block, sq.n_q, sq.n_k, right) - n_first;
        const int row0 = m0 + cw * 64 + warp * 16 + g;  // this thread's rows in the sequence: row0 and row0 + 8
        // lse (B, H, N), or (H, total_q) for packed sequences; O's rows of this sequence and head
        float* lseg = Varlen ? lse + (long long)h * total_q + sq.q0 : lse + ((long long)b * heads + h) * seq_len;
        OT* og = o + ((long long)sq.q0 + (long long)sq.b * seq_len) * q_stride + (long long)h * D;
        if (n_blocks <= 0) {  // no row of this tile sees any key: O = 0, lse = -inf
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int row = row0 + 8 * hr;
                if (row < sq.n_q) {
                    if (t4 == 0) lseg[row] = -INFINITY;
#pragma unroll
                    for (int nd = 0; nd < D / 8; ++nd)
                        *reinterpret_cast<unsigned*>(og + (long long)row * q_stride + nd * 8 + 2 * t4) = 0u;
                }
            }
            continue;
        }

        // fp8: the block scales of this Q tile and of K/V tile j (kv head hk); O is kept in units of V's scale of the
        // last tile added to it (sv), so a new tile's scale is a factor on the rescale O gets anyway
        const int hk = h / (heads / kv_heads), Tc = (kv_len + Bc - 1) / Bc;
        const float* ksg = k_scale + ((long long)b * kv_heads + hk) * Tc;
        const float* vsg = v_scale + ((long long)b * kv_heads + hk) * Tc;
        // (tile j+1's scales are loaded during tile j: a load issued after the loop's barriers would stall softmax)
        const float sq_log2 = kFp8 ? scale_log2 * __ldg(q_scale + ((long long)b * heads + h) * Tr + m_block) : 0.f;
        float sk_next = kFp8 ? __ldg(ksg) : 0.f, sv_next = kFp8 ? __ldg(vsg) : 1.f;
        float sv = sv_next;
        auto sl_of = [&](int j) {  // this tile's log2 scale; prefetches the next tile's K and V scales
            if constexpr (kFp8) {
                const float sl = sq_log2 * sk_next;
                sv_next = j > 0 ? __ldg(vsg + j) : sv_next;
                sk_next = j + 1 < n_blocks ? __ldg(ksg + j + 1) : 0.f;
                return sl;
            } else {
                return scale_log2;
            }
        };
#pragma unroll
        for (int i = 0; i < OR; ++i) acc_o[i] = 0.f;
        m_i[0] = m_i[1] = -INFINITY;
        l_i[0] = l_i[1] = 0.f;
        mbar_wait(q_full, tile_no & 1);
        ++tile_no;

        // tile 0: S_0, softmax (O is still zero: no rescale)
        {
            float corr[2];
            const int s = it % kF3Stages;
            mbar_wait(k_full(s), (it / kF3Stages) & 1);
            named_sync(my_bar, 256);
            issue_qk(s);
            named_arrive(other_bar, 256);
            wgmma_wait<0>();
            fence_regs(acc_s);
            if (lane == 0) {
                mbar_arrive(k_empty(s));
                if (n_blocks == 1) mbar_arrive(q_empty);  // the last S of this tile: Q_i may be overwritten
            }
            softmax(n_first, m0, row0, sl_of(0), corr);
            convert_p();
        }
        // tiles 1 .. n-1: issue S_j and O += P_{j-1} V_{j-1} together; softmax of S_j overlaps P_{j-1} V_{j-1}
        for (int j = 1; j < n_blocks; ++j) {
            const int s = (it + 1) % kF3Stages, sp = it % kF3Stages;
            const unsigned ph = ((it + 1) / kF3Stages) & 1, php = (it / kF3Stages) & 1;
            float corr[2];
            mbar_wait(k_full(s), ph);
            named_sync(my_bar, 256);
            issue_qk(s);
            mbar_wait(v_full(sp), php);
            issue_pv(sp);
            named_arrive(other_bar, 256);
            wgmma_wait<1>();  // S_j is done (P_{j-1} V_{j-1} may still run)
            fence_regs(acc_s);
            if (lane == 0) {
                mbar_arrive(k_empty(s));
                if (j == n_blocks - 1) mbar_arrive(q_empty);
            }
            softmax(n_first + j, m0, row0, sl_of(j), corr);
            wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and P's registers are free
            fence_regs(acc_o);
            fence_regs(p_frag);
            if (lane == 0) mbar_arrive(v_empty(sp));
            if constexpr (kFp8) {
                const float r = __fdividef(sv, sv_next);  // O from V's tile j-1 scale to tile j's
                corr[0] *= r;
                corr[1] *= r;
                sv = sv_next;
            }
            rescale_o(corr);
            convert_p();
            ++it;
        }
        // last P V
        {
            const int sp = it % kF3Stages;
            mbar_wait(v_full(sp), (it / kF3Stages) & 1);
            named_sync(my_bar, 256);
            issue_pv(sp);
            named_arrive(other_bar, 256);
            wgmma_wait<0>();
            fence_regs(acc_o);
            if (lane == 0) mbar_arrive(v_empty(sp));
            ++it;
        }

        // Alg. line 12-13: O = O / l, lse = m*scale + ln(l); rows that saw no key: O = 0, lse = -inf. Stored
        // straight from registers while the producer already loads the next tile's Q and K/V.
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            float l = l_i[hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.f ? sv / l : 0.f;
            const int row = row0 + 8 * hr;
            if (row < sq.n_q) {
                // fp8: m is scaled already and l carries P's factor 2^kF3PShift
                const float lse2 = kFp8 ? m_i[hr] + __log2f(l) - kF3PShift : m_i[hr] * scale_log2 + __log2f(l);
                if (t4 == 0) lseg[row] = l > 0.f ? lse2 * 0.69314718055994531f : -INFINITY;
                OT* orow = og + (long long)row * q_stride;
#pragma unroll
                for (int nd = 0; nd < D / 8; ++nd)
                    *reinterpret_cast<unsigned*>(orow + nd * 8 + 2 * t4) =
                        pack2<OT>(acc_o[nd * 4 + 2 * hr] * inv, acc_o[nd * 4 + 2 * hr + 1] * inv);
            }
        }
    }
    if (cw == 0) named_sync(1, 256);  // the hand-over warpgroup 1 made after its last turn
}

}  // namespace iosim
