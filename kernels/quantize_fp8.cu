// quantize_fp8.cu: block quantization of fp16/bf16 tensors to fp8 e4m3 for the fp8 forward (flash3_fwd.cu, T = e4m3),
// as FlashAttention-3 section 3.3 describes it:
//   block quantization   one fp32 scale per block of `block` rows of one (batch, head): scale = amax / 448 (448 =
//                        e4m3's largest value; a block of zeros gets scale 1), values = e4m3(x / scale), rounded to
//                        nearest even and saturated (cvt.rn.satfinite);
//   incoherent processing (optional, for Q and K) x <- (x * s) H / sqrt(d) along d before quantizing: s a random +-1
//                        vector (`signs`, the same for Q and K), H the Walsh-Hadamard matrix (Sylvester order). The
//                        rotation is orthogonal, so Q K^T is unchanged, and it spreads an outlier over all of d.
//   V^T (Transpose)      V is written as V^T (B, H, d, rows_pad), rows_pad = rows rounded up to 16, the keys of each
//                        group of 16 in the order the fp8 P V wgmma reads them (column p holds key
//                        4*((k/2)%4) + 2*(k/8) + k%2 = p's inverse below: see convert_p in flash3_fwd.cu).
//
// x (B, rows, H, D) contiguous. One thread block of 8 warps per (row block, head, batch): grid (ceil(rows / block), H,
// B). Lane l of a warp holds elements D/32 * l .. D/32 * (l + 1) - 1 of a row; the Walsh-Hadamard butterflies run in
// registers below a stride of D/32, by shuffles above. Two passes over the block: the amax (after the rotation), then
// the quantization (the second read of x is served by L1/L2).
// Modes: amax_out != null: write each block's amax there, nothing else (per-tensor scaling takes their max on the
// host); fixed_scale != null: every block of head h uses fixed_scale[h] (per-tensor: one value for every head; an fp8
// KV cache: one per kv head, iosim.gpu.quantize_kv_fp8); else each block its own scale.
#include "common.cuh"
#include "hopper.cuh"  // e4m3 packing (cvt.rn.satfinite.e4m3x2, sm_89+)

namespace iosim {

constexpr int kQuantThreads = 256;
constexpr float kE4m3Max = 448.f;

// position of key k (0..15 within its group of 16) in V^T's column order: the fp8 A fragment of P holds, at k
// position 4t + e, key (e / 2) * 8 + 2t + e % 2 (flash3_fwd.cu convert_p)
__device__ __forceinline__ int fp8_key_position(int k) { return 4 * ((k >> 1) & 3) + 2 * (k >> 3) + (k & 1); }

template <typename T, int D>
__device__ __forceinline__ void load_row(const T* __restrict__ src, int lane, float (&v)[D / 32]) {
    constexpr int E = D / 32;
#pragma unroll
    for (int i = 0; i < E; i += 2) {
        const unsigned w = *reinterpret_cast<const unsigned*>(src + lane * E + i);
        unpack2<T>(w, v[i], v[i + 1]);
    }
}

// (v * signs) H / sqrt(D) over the warp's row: Walsh-Hadamard butterflies (a, b) -> (a + b, a - b)
template <int D>
__device__ __forceinline__ void rotate(float (&v)[D / 32], const float* __restrict__ signs, int lane) {
    constexpr int E = D / 32;
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] *= __ldg(signs + lane * E + i);
#pragma unroll
    for (int h = 1; h < E; h *= 2)
#pragma unroll
        for (int i = 0; i < E; ++i)
            if ((i & h) == 0) {
                const float a = v[i], b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2)  // stride E * m: partner lane ^ m
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const float other = __shfl_xor_sync(0xffffffffu, v[i], m);
            v[i] = (lane & m) ? other - v[i] : v[i] + other;
        }
    const float norm = rsqrtf((float)D);
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] *= norm;
}

template <typename T, int D, bool Transpose>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_fp8_kernel(const T* __restrict__ x, unsigned char* __restrict__ out, float* __restrict__ scales,
                        const float* __restrict__ signs, const float* __restrict__ fixed_scale,
                        float* __restrict__ amax_out, int rows, int heads, int block, int rows_pad) {
    constexpr int E = D / 32;
    static_assert(D % 64 == 0 && D <= 256, "head_dim 64, 128 or 256");
    extern __shared__ unsigned char vt_tile[];  // Transpose: D x block bytes, V^T of this block
    __shared__ float warp_max[kQuantThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, nb = gridDim.x;
    const int r0 = blk * block, r1 = min(r0 + block, rows);
    auto row_ptr = [&](int r) { return x + (((long long)b * rows + r) * heads + h) * D; };
    auto values = [&](int r, float (&v)[E]) {
        load_row<T, D>(row_ptr(r), lane, v);
        if (signs != nullptr) rotate<D>(v, signs, lane);
    };

    float scale;
    if (fixed_scale != nullptr && amax_out == nullptr) {
        scale = __ldg(fixed_scale + h);
    } else {
        float amax = 0.f;
        for (int r = r0 + warp; r < r1; r += kQuantThreads / 32) {
            float v[E];
            values(r, v);
#pragma unroll
            for (int i = 0; i < E; ++i) amax = fmaxf(amax, fabsf(v[i]));
        }
#pragma unroll
        for (int m = 16; m > 0; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        if (lane == 0) warp_max[warp] = amax;
        __syncthreads();
        amax = warp_max[0];
#pragma unroll
        for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
        if (amax_out != nullptr) {
            if (threadIdx.x == 0) amax_out[((long long)b * heads + h) * nb + blk] = amax;
            return;
        }
        scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    }
    if (threadIdx.x == 0) scales[((long long)b * heads + h) * nb + blk] = scale;
    const float inv = 1.f / scale;

    const int r_end = Transpose ? min(r0 + block, rows_pad) : r1;  // V^T: rows up to rows_pad are written (zeros)
    for (int r = r0 + warp; r < r_end; r += kQuantThreads / 32) {
        float v[E];
        if (r < rows) {
            values(r, v);
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] = 0.f;
        }
        unsigned q[E / 4 > 0 ? E / 4 : 1];
        if constexpr (E >= 4) {
#pragma unroll
            for (int i = 0; i < E; i += 4) q[i / 4] = pack4_e4m3(v[i] * inv, v[i + 1] * inv, v[i + 2] * inv, v[i + 3] * inv);
        } else {
            q[0] = pack4_e4m3(v[0] * inv, v[1] * inv, 0.f, 0.f);
        }
        if constexpr (Transpose) {
            const int local = r - r0, pos = (local & ~15) + fp8_key_position(local & 15);
#pragma unroll
            for (int i = 0; i < E; ++i) vt_tile[(lane * E + i) * block + pos] = (q[i / 4] >> (8 * (i % 4))) & 0xffu;
        } else {
            unsigned char* dst = out + (((long long)b * rows + r) * heads + h) * D + lane * E;
            if constexpr (E == 2) {
                *reinterpret_cast<unsigned short*>(dst) = (unsigned short)(q[0] & 0xffffu);
            } else {
#pragma unroll
                for (int i = 0; i < E / 4; ++i) reinterpret_cast<unsigned*>(dst)[i] = q[i];
            }
        }
    }
    if constexpr (Transpose) {  // the block's V^T rows: D rows of `width` keys, 16 B at a time
        __syncthreads();
        const int width = min(block, rows_pad - r0), chunks = width / 16;
        for (int i = threadIdx.x; i < D * chunks; i += kQuantThreads) {
            const int c = i / chunks, k = (i % chunks) * 16;
            *reinterpret_cast<uint4*>(out + (((long long)b * heads + h) * D + c) * rows_pad + r0 + k) =
                *reinterpret_cast<const uint4*>(vt_tile + c * block + k);
        }
    }
}

}  // namespace iosim
