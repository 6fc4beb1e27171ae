// naive.cu: standard attention, FlashAttention paper Algorithm 0, as three kernels that materialize S and P in
// global memory exactly as the `naive` schedule counts them:
//   (1) naive_qk_kernel:      S = scale * Q K^T            read Q, K; write S (B, H, N, N_kv) in the input dtype
//                             (causal: entries above the bottom-right-aligned diagonal are written as -inf)
//   (2) naive_softmax_kernel: P = softmax(S) row by row    read S once, write P (B, H, N, N_kv) in the input dtype;
//                             fp32 arithmetic; the row is held in shared memory between its passes; a row that is
//                             all -inf gets P = 0 (and lse = -inf when lse is asked for)
//   (3) naive_pv_kernel:      O = P V                      read P, V; write O (B, N, H, d)
// Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); query head h reads kv head h / (H / H_kv).
// The GEMMs are plain shared-memory-tiled fp32 FMA kernels (correctness first, not speed); their tile sizes are the
// compile-time constants below and are mirrored in iosim/gpu/build.py (NAIVE_TILES) for the simulator.
//
// Versions:
//   v1  tiled FMA GEMMs (64x64 output tile, k-step 16, 256 threads, 4x4 outputs per thread), one block per row
//       for the softmax. Measured: see docs/kernels.md.
//   v1.1 the two GEMMs' inner product factored into tile_fma (no change in code generation: ptxas reports the same
//       registers, 80/31/40 on sm_90, no spills); GPU tests and compute-sanitizer re-run clean (docs/benchmarks.md run 6).
#include "common.cuh"

namespace iosim {

constexpr int kNaiveBM = 64;        // output rows per block (query rows)
constexpr int kNaiveBN = 64;        // output columns per block (keys for QK^T, head dims for PV)
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

// (3) O[b, i, h, n] = sum_j P[b, h, i, j] V[b, j, hk, n]; grid (ceil(d/64), ceil(N/64), B*H)
template <typename T>
__global__ void __launch_bounds__(kNaiveThreads)
    naive_pv_kernel(const T* __restrict__ p, const T* __restrict__ v, T* __restrict__ o, int seq_len, int kv_len,
                    int heads, int kv_heads, int head_dim) {
    __shared__ float sA[kNaiveBK][kNaiveBM + 4];  // P tile, key-major
    __shared__ float sB[kNaiveBK][kNaiveBN + 4];  // V tile, key-major
    const int bh = blockIdx.z, b = bh / heads, h = bh % heads, hk = h / (heads / kv_heads);
    const int m0 = blockIdx.y * kNaiveBM, n0 = blockIdx.x * kNaiveBN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long o_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
    const T* pg = p + (long long)bh * seq_len * kv_len;
    const T* vg = v + (long long)b * kv_len * kv_stride + (long long)hk * head_dim;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < kv_len; k0 += kNaiveBK) {
        for (int idx = threadIdx.x; idx < kNaiveBM * kNaiveBK; idx += kNaiveThreads) {
            const int r = idx / kNaiveBK, kk = idx % kNaiveBK;  // P: row r, key kk
            sA[kk][r] = (m0 + r < seq_len && k0 + kk < kv_len) ? to_float(pg[(long long)(m0 + r) * kv_len + k0 + kk])
                                                                 : 0.f;
            const int kk2 = idx / kNaiveBN, n = idx % kNaiveBN;  // V: key kk2, dim n
            sB[kk2][n] = (k0 + kk2 < kv_len && n0 + n < head_dim) ? to_float(vg[(k0 + kk2) * kv_stride + n0 + n]) : 0.f;
        }
        __syncthreads();
        tile_fma(acc, sA, sB, tx, ty);
        __syncthreads();
    }
    T* og = o + (long long)b * seq_len * o_stride + (long long)h * head_dim;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = m0 + ty + 16 * i;
        if (row >= seq_len) continue;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int n = n0 + tx + 16 * jj;
            if (n < head_dim) og[row * o_stride + n] = from_float<T>(acc[i][jj]);
        }
    }
}

}  // namespace iosim
