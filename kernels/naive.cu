// naive.cu: standard attention, FlashAttention paper Algorithm 0, as three kernels that materialize S and P in
// global memory exactly as the `naive` schedule counts them (tiles Br = kNaiveBM, Bc = kNaiveBN):
//   (1) naive_qk_kernel:      S = scale * Q K^T            read Q_i, K_j per 128 x 128 tile of S; write S (B, H, N, pitch)
//                             in the input dtype (causal: entries above the bottom-right-aligned diagonal are -inf)
//   (2) naive_softmax_kernel: P = softmax(S) row by row    read S once, write P (B, H, N, pitch) in the input dtype;
//                             fp32 arithmetic; a row that is all -inf gets P = 0 (and lse = -inf when lse is asked for)
//   (3) naive_pv_kernel:      O = P V                      read P once, V once per 128 query rows; write O (B, N, H, d)
// Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); query head h reads kv head h / (H / H_kv). A row of S and P is N_kv
// keys stored at a pitch of N_kv rounded up to 8 elements (row_pitch: 16 bytes), so every row is 16-byte aligned and
// all three kernels move S and P by 16-byte accesses at any N_kv; the pad columns are written (S: 0 or -inf, P: 0)
// and read like the others (iosim/schedules/naive.py counts them).
// Both GEMMs run on tensor cores (mma.sync m16n8k16, fp32 accumulators; operands through cp.async and ldmatrix, as in
// flash_fwd.cu). The tile sizes below are mirrored in iosim/launch/forward.py (NAIVE_TILES, naive_*_smem_bytes).
//
// Versions:
//   v1  tiled FMA GEMMs (64x64 output tile, k-step 16, 256 threads, 4x4 outputs per thread), one block per row
//       for the softmax. Measured: see docs/kernels.md.
//   v1.1 the two GEMMs' inner product factored into tile_fma (no change in code generation).
//   v1.2 naive_pv_kernel: one block computes a 64-row x full-head-dim tile of O, so P is read once (docs/kernels.md).
//   v2  tensor cores (issue 17 item 4: standard attention at >= 0.8x torch's matmul-softmax-matmul). 8 warps per
//       block, 4 (rows) x 2 (columns), each warp 32 rows of the block's output. Tiles 128 x 128 for S and 128 x d for
//       O (v1: 64): at 64 x 64 the Q and K tiles are 4 B of L2 reads per byte of S written at d = 128, ~19 TB/s at
//       the H200's 4.8 TB/s DRAM rate, about 3x what L2 gives; 128 x 128 halves it, and halves V's re-reads in (3).
//       Head dim is a template parameter of (1) and (3). The softmax holds a row in registers (16-byte loads, 32 to
//       256 threads per row, several rows per block) where the row is a multiple of 8 keys and at most 16,384 long;
//       otherwise one row per block in shared memory, as v1. Causal: S tiles wholly above the diagonal and P tiles
//       wholly right of it are loaded (the schedule counts them) but not multiplied.
//   v2.1 S and P rows at a pitch of 16 bytes (row_pitch): where N_kv was not a multiple of 8 the three kernels fell
//       back to 2-byte accesses and the softmax to one row per block, 2.7x slower at N = 777 (docs/kernels.md).
#include "common.cuh"

namespace iosim {

constexpr int kNaiveBM = 128;       // Br: query rows per block in (1) and (3)
constexpr int kNaiveBN = 128;       // Bc: keys per block of S in (1)
constexpr int kNaiveBK = 64;        // keys per cp.async stage in (3)
constexpr int kNaiveThreads = 256;  // 8 warps: 4 along the rows (32 each) x 2 along the columns
constexpr int kSoftmaxThreads = 256;
constexpr int kSoftmaxChunks = 8;  // 16-byte chunks of a row per thread in the register path: rows <= 8*8*256 keys
// blocks per SM the softmax is built for: a thread holding at most 4 chunks fits 64 registers, so 4 blocks (32 warps)
// keep twice the loads in flight of 2; 8 chunks need 2 (iosim/launch/forward.py naive_softmax_chunks picks the instantiation)
__host__ __device__ constexpr int naive_softmax_min_blocks(int chunks) { return chunks <= 4 ? 4 : 2; }

// depth of naive_pv's cp.async ring (P and V tiles); mirrored by iosim/launch/forward.py naive_pv_stages()
__host__ __device__ constexpr int naive_pv_stages(int D) { return D >= 256 ? 2 : 3; }

// elements of a row of S and P in global memory: N_kv rounded up to 16 bytes (mirrored by
// iosim/schedules/naive.py row_pitch)
template <typename T>
__host__ __device__ constexpr int row_pitch(int kv_len) {
    static_assert(sizeof(T) == 2, "fp16 or bf16");
    return (kv_len + 7) & ~7;
}

namespace naive_detail {

// element offset of 16-byte chunk c (8 elements) of row r in a swizzled tile of D elements per row (flash_fwd.cu's):
// chunk c of row r lives at c ^ (r & 7), so the 8 rows of an ldmatrix phase hit 8 different 16-byte bank groups
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
    constexpr int C = D / 8;
    static_assert(C == 4 || C % 8 == 0, "row of 32 or a multiple of 64 elements");
    if constexpr (C >= 8) {
        return r * D + ((c ^ (r & 7)) << 3);
    } else {  // 64-byte rows: two rows share a 128-byte line, swizzle by the line index
        return r * D + ((c ^ ((r >> 1) & 3)) << 3);
    }
}

// cp.async chunks [C0, C1) of each of ROWS rows (row stride `gstride` elements) into a swizzled tile; rows >= nrows and
// chunks starting at or past ncols elements are zero-filled (their source is clamped to the tile origin, never read).
template <int ROWS, int D, int C0, int C1, typename T>
__device__ __forceinline__ void load_async(T* s, const T* g, long long gstride, int nrows, int ncols, int tid) {
    constexpr int W = C1 - C0, TOTAL = ROWS * W;
#pragma unroll
    for (int it = 0; it < (TOTAL + kNaiveThreads - 1) / kNaiveThreads; ++it) {
        const int idx = it * kNaiveThreads + tid;
        if (TOTAL % kNaiveThreads == 0 || idx < TOTAL) {
            const int r = idx / W, c = C0 + idx % W;
            const bool ok = r < nrows && c * 8 < ncols;
            const T* src = g + (ok ? r * gstride + c * 8 : 0);
            cp_async_16(smem_u32(s + swz<D>(r, c)), src, ok ? 16 : 0);
        }
    }
}

// acc[mt][nt] += A[row ra + 16 mt + .., k] * B[row rb + 8 nt + .., k] over k16 steps [KS0, KS1): both tiles hold rows
// of D elements contiguous in k (swizzled); B is the mma "col" operand read without a transpose (S = Q K^T).
template <int D, int MT, int NT, int KS0, int KS1, typename T>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][NT][4], const T* sA, int ra, const T* sB, int rb, int lane) {
    const int a_row = lane & 15, a_chunk = lane >> 4;                              // A: rows 0-15, k chunk 0/1
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;  // B: n rows 0-15, k chunk 0/1
#pragma unroll
    for (int ks = KS0; ks < KS1; ++ks) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                        smem_u32(sA + swz<D>(ra + mt * 16 + a_row, ks * 2 + a_chunk)));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned b0, b1, b2, b3;  // (b0, b1): n-tile 2np; (b2, b3): n-tile 2np+1
            ldmatrix_x4(b0, b1, b2, b3, smem_u32(sB + swz<D>(rb + np * 16 + b_row, ks * 2 + b_chunk)));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816<T>(acc[mt][2 * np], a[mt], b0, b1);
                mma_16816<T>(acc[mt][2 * np + 1], a[mt], b2, b3);
            }
        }
    }
}

// two fp32 values from one 32-bit word of two fp16/bf16 (low half first)
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned u);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

template <typename T> __device__ __forceinline__ float max8(const uint4& x, float m) {
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = unpack2<T>(w[i]);
        m = fmaxf(m, fmaxf(f.x, f.y));
    }
    return m;
}

// the 8 values of x as exp2(x * log2e - m_scaled), into e; returns their sum
template <typename T> __device__ __forceinline__ float exp8(const uint4& x, float m_scaled, float (&e)[8]) {
    constexpr float kLog2e = 1.4426950408889634f;
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = unpack2<T>(w[i]);
        e[2 * i] = exp2_approx(fmaf(f.x, kLog2e, -m_scaled));
        e[2 * i + 1] = exp2_approx(fmaf(f.y, kLog2e, -m_scaled));
        sum += e[2 * i] + e[2 * i + 1];
    }
    return sum;
}

template <typename T> __device__ __forceinline__ uint4 pack8(const float (&e)[8], float scale) {
    uint4 y;
    y.x = pack2<T>(e[0] * scale, e[1] * scale);
    y.y = pack2<T>(e[2] * scale, e[3] * scale);
    y.z = pack2<T>(e[4] * scale, e[5] * scale);
    y.w = pack2<T>(e[6] * scale, e[7] * scale);
    return y;
}

// chunk x with its elements from `valid` on set to -inf (the pad columns of a row's last chunk), so the row's max,
// exp2 and sum ignore them and its P there is 0. Selects, no branch: called after a thread's loads are all issued.
template <typename T> __device__ __forceinline__ uint4 mask_tail(uint4 x, int valid) {
    constexpr unsigned kNegInf = is_same<T, __half>::value ? 0xFC00u : 0xFF80u;
    unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned lo = 2 * i >= valid ? kNegInf : (w[i] & 0xFFFFu);
        const unsigned hi = 2 * i + 1 >= valid ? kNegInf : (w[i] >> 16);
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// max (IsMax) or sum over the row_threads threads of one row: aligned groups of whole warps, row_threads a power of
// two >= 32. Warp shuffles, then the row's warps through `red` (one slot per warp, used by one call per kernel).
// Every thread of the block calls it: it holds a barrier when row_threads > 32.
template <bool IsMax>
__device__ __forceinline__ float row_reduce(float x, int row_threads, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = IsMax ? fmaxf(x, y) : x + y;
    }
    if (row_threads > 32) {
        const int warp = threadIdx.x >> 5, nw = row_threads >> 5, w0 = warp & ~(nw - 1);
        if ((threadIdx.x & 31) == 0) red[warp] = x;
        __syncthreads();
        x = red[w0];
        for (int w = 1; w < nw; ++w) x = IsMax ? fmaxf(x, red[w0 + w]) : x + red[w0 + w];
    }
    return x;
}

// acc = 0: the mma accumulators of a warp's MT x NT fragments
template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

}  // namespace naive_detail

// (1) S[b, h, i, j] = scale * sum_k Q[b, i, h, k] K[b, j, hk, k]; grid (ceil(N_kv/128), ceil(N/128), B*H).
// One block: Q_i (128 x D) and K_j (128 x D) into shared memory by cp.async in two groups (the first and second half
// of the head dims, so the first half's mma run while the second lands), S_ij = Q_i K_j^T on tensor cores (warp
// (wm, wn) owns rows 32 wm .. +32 and columns 64 wn .. +64), then S_ij * scale, masked, rounded to T, staged in shared
// memory over Q_i and K_j, and written with 16-byte stores (rows at row_pitch: the last tile's pad columns too).
// Dynamic shared memory: max((128 + 128) * D, 128 * 128) elements of T (iosim/launch/forward.py naive_qk_smem_bytes).
template <int D, typename T, bool Causal>
__global__ void __launch_bounds__(kNaiveThreads, 2)
    naive_qk_kernel(const T* __restrict__ q, const T* __restrict__ k, T* __restrict__ s, int seq_len, int kv_len,
                    int heads, int kv_heads, float scale) {
    using namespace naive_detail;
    constexpr int BM = kNaiveBM, BN = kNaiveBN;
    constexpr int MT = BM / 4 / 16;  // m16 tiles per warp (32 rows)
    constexpr int NT = BN / 2 / 8;   // n8 tiles per warp (64 columns)
    constexpr int KD = D / 16;       // k16 steps over the head dims
    constexpr int C = D / 8;         // 16-byte chunks per row of Q and K
    static_assert(D % 32 == 0 && D <= 256, "head dim 32, 64, 128 or 256");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // BM x D
    T* sK = sQ + BM * D;                     // BN x D
    T* sS = reinterpret_cast<T*>(smem_raw);  // BM x BN, once the mma are done (over sQ and sK)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int wm = warp >> 1, wn = warp & 1;
    const int bh = blockIdx.z, b = bh / heads, h = bh % heads, hk = h / (heads / kv_heads);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const long long q_stride = (long long)heads * D, kv_stride = (long long)kv_heads * D;
    const T* qg = q + ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
    const T* kg = k + ((long long)b * kv_len + n0) * kv_stride + (long long)hk * D;
    const int rows = min(BM, seq_len - m0), cols = min(BN, kv_len - n0);
    const int offset = kv_len - seq_len;  // causal, bottom-right aligned: row i sees key j iff j <= i + offset
    // causal: every key of the tile lies right of every row's diagonal, S_ij is -inf throughout; Q_i and K_j are still
    // loaded (the schedule counts them) but not multiplied
    const bool masked_tile = Causal && n0 > m0 + BM - 1 + offset;

    load_async<BM, D, 0, C / 2>(sQ, qg, q_stride, rows, D, tid);
    load_async<BN, D, 0, C / 2>(sK, kg, kv_stride, cols, D, tid);
    cp_async_commit();
    load_async<BM, D, C / 2, C>(sQ, qg, q_stride, rows, D, tid);
    load_async<BN, D, C / 2, C>(sK, kg, kv_stride, cols, D, tid);
    cp_async_commit();

    float acc[MT][NT][4];
    zero(acc);

    cp_async_wait<1>();  // the first half of the head dims has landed
    __syncthreads();
    if (!masked_tile) mma_abt<D, MT, NT, 0, KD / 2>(acc, sQ, wm * 32, sK, wn * 64, lane);
    cp_async_wait<0>();
    __syncthreads();
    if (!masked_tile) mma_abt<D, MT, NT, KD / 2, KD>(acc, sQ, wm * 32, sK, wn * 64, lane);
    __syncthreads();  // every warp is done reading sQ and sK: sS overwrites them

    // scale, mask, round to T, stage: fragment element e of (mt, nt) is row g + 8 (e >> 1), column 2 t4 + (e & 1)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = wm * 32 + mt * 16 + g + 8 * hr, c = wn * 64 + nt * 8 + 2 * t4;
                float v0 = acc[mt][nt][2 * hr] * scale, v1 = acc[mt][nt][2 * hr + 1] * scale;
                if (Causal) {
                    const int last = m0 + r + offset - n0;  // the row's last visible key, tile-local
                    if (c > last) v0 = -INFINITY;
                    if (c + 1 > last) v1 = -INFINITY;
                }
                *reinterpret_cast<unsigned*>(sS + swz<BN>(r, c >> 3) + (c & 7)) = pack2<T>(v0, v1);
            }
    __syncthreads();

    // a row chunk of 8 columns past kv_len is wholly pad (not stored); one that straddles kv_len stores its pad
    // columns (K's zero-filled rows: S = 0, or -inf under the causal mask), which the softmax masks
    const int pitch = row_pitch<T>(kv_len);
    T* sg = s + ((long long)bh * seq_len + m0) * pitch + n0;  // S[b, h, m0, n0]
    constexpr int SC = BN / 8;
#pragma unroll
    for (int it = 0; it < BM * SC / kNaiveThreads; ++it) {
        const int idx = it * kNaiveThreads + tid, r = idx / SC, c = idx % SC;
        if (r < rows && c * 8 < cols)
            *reinterpret_cast<uint4*>(sg + (long long)r * pitch + c * 8) =
                *reinterpret_cast<const uint4*>(sS + swz<BN>(r, c));
    }
}

// (2) P[row, :] = softmax(S[row, :]) for the B*H*N rows; lse (may be null): natural-log logsumexp per row.
// Rows at row_pitch(kv_len): ceil(kv_len / 8) 16-byte chunks, the last one's pad columns masked to -inf (mask_tail).
// row_threads > 0 (iosim/launch/forward.py naive_softmax_row_threads: a row of at most 8 * kSoftmaxChunks *
// row_threads keys): each row is held in registers by row_threads threads (a power of two, 32 to 256;
// kSoftmaxThreads / row_threads rows per block), one 16-byte chunk of the row per thread and step, so S is read by
// one pass of 16-byte loads and P written by one pass of 16-byte stores; grid ceil(rows * row_threads / 256).
// Chunks (1, 2, 4 or 8, at most kSoftmaxChunks): the register path's chunks per thread, the smallest power of two
// that holds the row (naive_softmax_chunks), so a short row takes fewer registers and more blocks fit on an SM.
// row_threads == 0: one row per block, the row held in dynamic shared memory (pitch elements of T) between the max,
// the sum and the write; grid = rows. Both: fp32 max, exp2 and sum; an all -inf row gets P = 0 and lse = -inf.
template <typename T, int Chunks>
__global__ void __launch_bounds__(kSoftmaxThreads, naive_softmax_min_blocks(Chunks))
    naive_softmax_kernel(const T* __restrict__ s, T* __restrict__ p, float* __restrict__ lse, int kv_len,
                         long long rows, int row_threads) {
    using namespace naive_detail;
    static_assert(Chunks >= 1 && Chunks <= kSoftmaxChunks, "1 to kSoftmaxChunks chunks per thread");
    constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.69314718055994531f;
    __shared__ float red_max[kSoftmaxThreads / 32], red_sum[kSoftmaxThreads / 32];
    const int tid = threadIdx.x;
    const int pitch = row_pitch<T>(kv_len), nch = pitch >> 3;  // 16-byte chunks per row
    const int tail = kv_len - (nch - 1) * 8;                   // real keys in the last chunk, 1 to 8
    float mx = -INFINITY, sum = 0.f, m_scaled;
    long long row;
    bool writer;  // the thread that writes the row's lse

    if (row_threads > 0) {
        const int lt = tid & (row_threads - 1);
        row = (long long)blockIdx.x * (kSoftmaxThreads / row_threads) + tid / row_threads;
        const bool live = row < rows;  // the last block may hold rows past the end: they only join the barriers
        writer = live && lt == 0;
        const uint4* sg = reinterpret_cast<const uint4*>(s + (live ? row : 0) * pitch);
        uint4* pg = reinterpret_cast<uint4*>(p + (live ? row : 0) * pitch);
        uint4 x[Chunks];
#pragma unroll
        for (int c = 0; c < Chunks; ++c) {
            const int j = lt + c * row_threads;
            if (live && j < nch) x[c] = sg[j];  // every load in flight before any is used
        }
#pragma unroll
        for (int c = 0; c < Chunks; ++c)
            if (lt + c * row_threads == nch - 1) x[c] = mask_tail<T>(x[c], tail);  // the row's last chunk
#pragma unroll
        for (int c = 0; c < Chunks; ++c)
            if (live && lt + c * row_threads < nch) mx = max8<T>(x[c], mx);
        mx = row_reduce<true>(mx, row_threads, red_max);
        m_scaled = (mx == -INFINITY) ? 0.f : mx * kLog2e;  // an all -inf row: every exp2 is 0, no NaN
        float e[Chunks][8];
#pragma unroll
        for (int c = 0; c < Chunks; ++c)
            if (live && lt + c * row_threads < nch) sum += exp8<T>(x[c], m_scaled, e[c]);
        sum = row_reduce<false>(sum, row_threads, red_sum);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
        for (int c = 0; c < Chunks; ++c) {
            const int j = lt + c * row_threads;
            if (live && j < nch) pg[j] = pack8<T>(e[c], inv);
        }
    } else {
        extern __shared__ __align__(128) unsigned char smem_raw[];
        uint4* row_s4 = reinterpret_cast<uint4*>(smem_raw);
        row = blockIdx.x;
        writer = tid == 0;
        const uint4* sg = reinterpret_cast<const uint4*>(s + row * pitch);
        uint4* pg = reinterpret_cast<uint4*>(p + row * pitch);
        // each thread reads back only what it wrote itself, so row_s4 needs no barrier of its own
        for (int j = tid; j < nch; j += kSoftmaxThreads) {
            const uint4 x = j == nch - 1 ? mask_tail<T>(sg[j], tail) : sg[j];
            row_s4[j] = x;
            mx = max8<T>(x, mx);
        }
        mx = row_reduce<true>(mx, kSoftmaxThreads, red_max);
        m_scaled = (mx == -INFINITY) ? 0.f : mx * kLog2e;
        float e[8];
        for (int j = tid; j < nch; j += kSoftmaxThreads) sum += exp8<T>(row_s4[j], m_scaled, e);
        sum = row_reduce<false>(sum, kSoftmaxThreads, red_sum);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int j = tid; j < nch; j += kSoftmaxThreads) {
            exp8<T>(row_s4[j], m_scaled, e);
            pg[j] = pack8<T>(e, inv);
        }
    }
    if (lse != nullptr && writer) lse[row] = sum > 0.f ? (m_scaled + log2f(sum)) * kLn2 : -INFINITY;
}

// (3) O[b, i, h, :] = sum_j P[b, h, i, j] V[b, j, hk, :]; grid (1, ceil(N/128), B*H).
// One block owns 128 query rows and ALL D head dims of them, so each element of P is loaded from global memory by
// exactly one block, exactly once (and V once per block). Keys go in steps of kNaiveBK through a ring of Stages
// cp.async buffers (P tile 128 x 64, V tile 64 x D; tiles j+1 .. j+Stages-1 in flight while tile j is used, one
// barrier per tile, as flash_fwd.cu's K/V ring). Warp (wm, wn) owns rows 32 wm .. +32 and head dims D/2 wn .. +D/2;
// V is read as the k-major B operand by ldmatrix.trans. P's rows are at row_pitch: the last tile's straddling chunk
// loads its pad columns (P = 0 there, and V's rows past kv_len are zero-filled).
// causal (0/1): P is 0 right of a row's diagonal, so tiles past the block's last visible key are loaded (the schedule
// counts them) but not multiplied. Dynamic shared memory: Stages * (128 * 64 + 64 * D) elements of T.
template <int D, typename T>
__global__ void __launch_bounds__(kNaiveThreads, D >= 256 ? 1 : 2)
    naive_pv_kernel(const T* __restrict__ p, const T* __restrict__ v, T* __restrict__ o, int seq_len, int kv_len,
                    int heads, int kv_heads, int causal) {
    using namespace naive_detail;
    constexpr int BM = kNaiveBM, BK = kNaiveBK, Stages = naive_pv_stages(D);
    constexpr int MT = BM / 4 / 16;  // m16 tiles per warp (32 rows)
    constexpr int WN = D / 2;        // head dims per warp
    constexpr int NT = WN / 8;       // n8 tiles per warp
    static_assert(D % 32 == 0 && D <= 256 && NT % 2 == 0, "head dim 32, 64, 128 or 256");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sP = reinterpret_cast<T*>(smem_raw);  // Stages x BM x BK
    T* sV = sP + Stages * BM * BK;           // Stages x BK x D

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int bh = blockIdx.z, b = bh / heads, h = bh % heads, hk = h / (heads / kv_heads);
    const int m0 = blockIdx.y * BM;
    const long long o_stride = (long long)heads * D, kv_stride = (long long)kv_heads * D;
    const int pitch = row_pitch<T>(kv_len);
    const T* pg = p + ((long long)bh * seq_len + m0) * pitch;  // P[b, h, m0, 0]
    const T* vg = v + (long long)b * kv_len * kv_stride + (long long)hk * D;
    const int rows = min(BM, seq_len - m0);
    const int n_blocks = (kv_len + BK - 1) / BK;
    const int last_key = causal ? m0 + rows - 1 + kv_len - seq_len : kv_len - 1;  // the block's last visible key

    // tile j of P (rows x 64 keys) and of V (64 keys x D) into ring slot `slot`
    auto load_tile = [&](int j, int slot) {
        T* dP = sP + slot * BM * BK;
        const T* srcP = pg + j * BK;
        const int keys = kv_len - j * BK;
        load_async<BM, BK, 0, BK / 8>(dP, srcP, pitch, rows, keys, tid);
        load_async<BK, D, 0, D / 8>(sV + slot * BK * D, vg + (long long)j * BK * kv_stride, kv_stride, keys, D, tid);
    };

    // ring prologue: tiles 0 .. Stages-2, one cp.async group each (maybe empty)
#pragma unroll
    for (int st = 0; st < Stages - 1; ++st) {
        if (st < n_blocks) load_tile(st, st);
        cp_async_commit();
    }

    float acc[MT][NT][4];
    zero(acc);

    const int a_row = lane & 15, a_chunk = lane >> 4;                              // A (P): rows 0-15, k chunk
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;  // B (V, trans): k rows, n chunk
    int stage = 0, fill = Stages - 1;
    for (int j = 0; j < n_blocks; ++j) {
        cp_async_wait<Stages - 2>();  // tile j has landed (this thread's copies)
        __syncthreads();  // ... every thread's; and every warp is done with tile j-1, whose slot `fill` now takes
        const int jn = j + Stages - 1;
        if (jn < n_blocks) load_tile(jn, fill);
        cp_async_commit();  // one group per iteration, so the wait count above stays exact
        const T* sPs = sP + stage * BM * BK;
        const T* sVs = sV + stage * BK * D;
        stage = (stage + 1 == Stages) ? 0 : stage + 1;
        fill = (fill + 1 == Stages) ? 0 : fill + 1;
        if (j * BK > last_key) continue;  // causal: P_ij = 0 (block-uniform)
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                            smem_u32(sPs + swz<BK>(wm * 32 + mt * 16 + a_row, kk * 2 + a_chunk)));
#pragma unroll
            for (int dp = 0; dp < NT / 2; ++dp) {
                unsigned b0, b1, b2, b3;  // (b0, b1): n-tile 2dp; (b2, b3): n-tile 2dp+1
                ldmatrix_x4_trans(b0, b1, b2, b3,
                                  smem_u32(sVs + swz<D>(kk * 16 + v_row, wn * (WN / 8) + dp * 2 + v_chunk)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<T>(acc[mt][2 * dp], a[mt], b0, b1);
                    mma_16816<T>(acc[mt][2 * dp + 1], a[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy may still be in flight into shared memory when the block exits

    T* og = o + ((long long)b * seq_len + m0) * o_stride + (long long)h * D;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = wm * 32 + mt * 16 + g + 8 * hr;
            if (r >= rows) continue;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                *reinterpret_cast<unsigned*>(og + r * o_stride + wn * WN + nt * 8 + 2 * t4) =
                    pack2<T>(acc[mt][nt][2 * hr], acc[mt][nt][2 * hr + 1]);
        }
}

}  // namespace iosim
