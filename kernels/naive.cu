// naive.cu: standard attention, FlashAttention paper Algorithm 0, as three kernels that materialize S and P in
// global memory exactly as the `naive` schedule counts them:
//   (1) naive_qk_kernel:      S = scale * Q K^T            read Q, K; write S (B, H, N, N_kv) in the input dtype
//                             (causal: entries above the bottom-right-aligned diagonal are written as -inf)
//   (2) naive_softmax_kernel: P = softmax(S) row by row    read S once, write P (B, H, N, N_kv) in the input dtype;
//                             fp32 arithmetic; the row is held in shared memory between its passes; a row that is
//                             all -inf gets P = 0 (and lse = -inf when lse is asked for)
//   (3) naive_pv_kernel:      O = P V                      read P once, V once per 64 rows; write O (B, N, H, d)
// Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); query head h reads kv head h / (H / H_kv).
// The GEMMs are plain shared-memory-tiled fp32 FMA kernels (correctness first, not speed); their tile sizes are the
// compile-time constants below and are mirrored in iosim/gpu/build.py (NAIVE_TILES) for the simulator.
//
// Versions:
//   v1  tiled FMA GEMMs (64x64 output tile, k-step 16, 256 threads, 4x4 outputs per thread), one block per row
//       for the softmax. Measured: see docs/kernels.md.
//   v1.1 the two GEMMs' inner product factored into tile_fma (no change in code generation: ptxas reports the same
//       registers, 80/31/40 on sm_90, no spills); GPU tests and compute-sanitizer re-run clean (docs/benchmarks.md run 6).
//   v1.2 naive_pv_kernel: one block computes a 64-row x full-head-dim tile of O (grid (1, ceil(N/64), B*H)), so P
//       is read from global memory exactly once and V once per 64-row block, as the `naive` schedule counts kernel 3
//       ("one Br x d tile of O per thread block"). Before, O was tiled 64 x 64, so at d > 64 the ceil(d/64) blocks of
//       one row block each re-read the same P rows (measured on an H200: `global` read 11.1% off the simulator's
//       count). Each k-step stages the V rows for all head dims in shared memory, sB[chunk][16][68] (up to 4 chunks
//       of 64 columns, d <= 256), and each thread accumulates acc[chunk][4][4] in registers. ptxas, sm_90: 128
//       registers (__launch_bounds__(256, 2)), 21,760 B static shared memory, no spills (v1.1: 40 registers, 8,704 B).
#include "common.cuh"

namespace iosim {

constexpr int kNaiveBM = 64;        // output rows per block (query rows)
constexpr int kNaiveBN = 64;        // output columns per tile (keys for QK^T; one chunk of head dims for PV)
constexpr int kNaiveBK = 16;        // reduction step (head dims for QK^T, keys for PV)
constexpr int kNaiveThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kSoftmaxThreads = 256;

// acc += A_tileᵀ B_tile for this thread's 4 x 4 outputs (rows ty + 16i, columns tx + 16j) over one k-step;
// both tiles are k-major in shared memory. Shared by the two GEMMs (S = Q Kᵀ and O = P V).
__device__ __forceinline__ void tile_fma(float (&acc)[4][4], const float (&sA)[kNaiveBK][kNaiveBM + 4],
                                         const float (&sB)[kNaiveBK][kNaiveBN + 4], int tx, int ty) {
#pragma unroll
    for (int kk = 0; kk < kNaiveBK; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) acc[i][jj] = fmaf(sA[kk][ty + 16 * i], sB[kk][tx + 16 * jj], acc[i][jj]);
}

// (1) S[b, h, i, j] = scale * sum_k Q[b, i, h, k] K[b, j, hk, k]; grid (ceil(N_kv/64), ceil(N/64), B*H)
template <typename T, bool Causal>
__global__ void __launch_bounds__(kNaiveThreads)
    naive_qk_kernel(const T* __restrict__ q, const T* __restrict__ k, T* __restrict__ s, int seq_len, int kv_len,
                    int heads, int kv_heads, int head_dim, float scale) {
    __shared__ float sA[kNaiveBK][kNaiveBM + 4];  // Q tile, k-major
    __shared__ float sB[kNaiveBK][kNaiveBN + 4];  // K tile, k-major
    const int bh = blockIdx.z, b = bh / heads, h = bh % heads, hk = h / (heads / kv_heads);
    const int m0 = blockIdx.y * kNaiveBM, n0 = blockIdx.x * kNaiveBN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
    const T* qg = q + (long long)b * seq_len * q_stride + (long long)h * head_dim;
    const T* kg = k + (long long)b * kv_len * kv_stride + (long long)hk * head_dim;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < head_dim; k0 += kNaiveBK) {
        for (int idx = threadIdx.x; idx < kNaiveBM * kNaiveBK; idx += kNaiveThreads) {
            const int r = idx / kNaiveBK, kk = idx % kNaiveBK;
            const bool okk = k0 + kk < head_dim;
            sA[kk][r] = (m0 + r < seq_len && okk) ? to_float(qg[(m0 + r) * q_stride + k0 + kk]) : 0.f;
            sB[kk][r] = (n0 + r < kv_len && okk) ? to_float(kg[(n0 + r) * kv_stride + k0 + kk]) : 0.f;
        }
        __syncthreads();
        tile_fma(acc, sA, sB, tx, ty);
        __syncthreads();
    }
    T* sg = s + (long long)bh * seq_len * kv_len;
    const int offset = kv_len - seq_len;  // causal, bottom-right aligned: row i sees key j iff j <= i + offset
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = m0 + ty + 16 * i;
        if (row >= seq_len) continue;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int col = n0 + tx + 16 * jj;
            if (col >= kv_len) continue;
            const bool masked = Causal && col > row + offset;
            sg[(long long)row * kv_len + col] = from_float<T>(masked ? -INFINITY : scale * acc[i][jj]);
        }
    }
}

__device__ __forceinline__ float block_reduce(float x, bool is_max, float* red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // `red` may still be read from the previous reduction
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < kSoftmaxThreads / 32; ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
    return x;
}

// (2) P[row, :] = softmax(S[row, :]); one block per row of the B*H*N rows; dynamic shared memory holds the row
// (kv_len elements of T), so S is read from global memory once. lse (may be null): natural-log logsumexp.
template <typename T>
__global__ void __launch_bounds__(kSoftmaxThreads)
    naive_softmax_kernel(const T* __restrict__ s, T* __restrict__ p, float* __restrict__ lse, int kv_len) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* row_s = reinterpret_cast<T*>(smem_raw);
    __shared__ float red[kSoftmaxThreads / 32];
    const long long row = blockIdx.x;
    const T* sg = s + row * kv_len;
    T* pg = p + row * kv_len;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) {
        const T x = sg[j];
        row_s[j] = x;
        mx = fmaxf(mx, to_float(x));
    }
    mx = block_reduce(mx, true, red);
    const float m_safe = (mx == -INFINITY) ? 0.f : mx;  // an all -inf row: every exp is 0, no NaN
    float sum = 0.f;
    for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads) sum += expf(to_float(row_s[j]) - m_safe);
    sum = block_reduce(sum, false, red);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int j = threadIdx.x; j < kv_len; j += kSoftmaxThreads)
        pg[j] = from_float<T>(expf(to_float(row_s[j]) - m_safe) * inv);
    if (lse != nullptr && threadIdx.x == 0) lse[row] = sum > 0.f ? m_safe + logf(sum) : -INFINITY;
}

// (3) O[b, i, h, n] = sum_j P[b, h, i, j] V[b, j, hk, n]; grid (1, ceil(N/64), B*H).
// One block owns 64 query rows and ALL head dims of them, so each element of P is loaded from global memory by
// exactly one block, exactly once (and V once per block). Per k-step of 16 keys the block stages
//   sA = P[m0 : m0+64, k0 : k0+16]      and      sB[c] = V[k0 : k0+16, 64c : 64c+64] for every chunk c < d/64,
// then runs tile_fma once per chunk into acc[c]. Chunks at or past head_dim are skipped (a block-uniform branch).
// __launch_bounds__(256, 2): two blocks per SM, so ptxas keeps to 128 registers (acc alone is 64; no spills).
constexpr int kNaivePvChunks = 4;  // column chunks of kNaiveBN: head_dim <= 256

template <typename T>
__global__ void __launch_bounds__(kNaiveThreads, 2)
    naive_pv_kernel(const T* __restrict__ p, const T* __restrict__ v, T* __restrict__ o, int seq_len, int kv_len,
                    int heads, int kv_heads, int head_dim) {
    __shared__ float sA[kNaiveBK][kNaiveBM + 4];                  // P tile (64 rows x 16 keys), key-major
    __shared__ float sB[kNaivePvChunks][kNaiveBK][kNaiveBN + 4];  // V tile (16 keys x all head dims), key-major
    const int bh = blockIdx.z, b = bh / heads, h = bh % heads, hk = h / (heads / kv_heads);
    const int m0 = blockIdx.y * kNaiveBM;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long o_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
    const T* pg = p + (long long)bh * seq_len * kv_len;
    const T* vg = v + (long long)b * kv_len * kv_stride + (long long)hk * head_dim;
    float acc[kNaivePvChunks][4][4] = {};  // every loop over chunks is unrolled, so acc stays in registers
    for (int k0 = 0; k0 < kv_len; k0 += kNaiveBK) {
        const T* pk = pg + (long long)m0 * kv_len + k0;  // P[m0, k0]
        const T* vk = vg + (long long)k0 * kv_stride;    // V[k0, 0]
#pragma unroll
        for (int idx = threadIdx.x; idx < kNaiveBM * kNaiveBK; idx += kNaiveThreads) {
            const int r = idx / kNaiveBK, kk = idx % kNaiveBK;  // P: row m0 + r, key k0 + kk
            sA[kk][r] = (m0 + r < seq_len && k0 + kk < kv_len) ? to_float(pk[(long long)r * kv_len + kk]) : 0.f;
        }
#pragma unroll
        for (int c = 0; c < kNaivePvChunks; ++c) {
            const int n0 = c * kNaiveBN;
            if (n0 >= head_dim) break;
#pragma unroll
            for (int idx = threadIdx.x; idx < kNaiveBK * kNaiveBN; idx += kNaiveThreads) {
                const int kk = idx / kNaiveBN, n = idx % kNaiveBN;  // V: key k0 + kk, dim n0 + n
                sB[c][kk][n] = (k0 + kk < kv_len && n0 + n < head_dim) ? to_float(vk[kk * kv_stride + n0 + n]) : 0.f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < kNaivePvChunks; ++c)
            if (c * kNaiveBN < head_dim) tile_fma(acc[c], sA, sB[c], tx, ty);
        __syncthreads();
    }
    T* og = o + (long long)b * seq_len * o_stride + (long long)h * head_dim;
#pragma unroll
    for (int c = 0; c < kNaivePvChunks; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = m0 + ty + 16 * i;
            if (row >= seq_len) continue;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int n = c * kNaiveBN + tx + 16 * jj;
                if (n < head_dim) og[row * o_stride + n] = from_float<T>(acc[c][i][jj]);
            }
        }
    }
}

}  // namespace iosim
