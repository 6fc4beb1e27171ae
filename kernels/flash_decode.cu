// flash_decode.cu: Flash-Decoding (Dao, Haziza, Massa, Sizov 2023; FlashAttention-2 §3.2) on tensor cores, for a
// KV cache that is contiguous or paged.
//
//   For each sequence b: 1 <= L <= 16 new query tokens q (B, L, H, d) against the first n_b = seqlens_k[b] keys of
//   its cache; query token i is at position n_b - L + i and sees key j iff j <= n_b - L + i (bottom-right causal).
//   O (B, L, H, d) like q; lse (B, H, L) fp32, natural log (-inf, with O = 0, for a row that sees no key).
//   K and V: contiguous (B, N_max, H_kv, d), or paged (num_pages, page_size, H_kv, d) with block_table (B, max_pages)
//   int32: token t of sequence b is slot t % page_size of page block_table[b][t / page_size] (pages in any order).
//   An fp8 cache (KV = e4m3, q and O fp16/bf16): K = k_scale[kv head] * e4m3(k), V = v_scale[kv head] * e4m3(v), fp32
//   scales per kv head (iosim.gpu.quantize_kv_fp8).
//
// Schedule (kernel 1, flash_decode_kernel; grid = (row blocks, splits, B * H_kv), 4 warps):
//   grouped-query packing: the G = H / H_kv query heads of one kv head and the L tokens are the rows of one Q
//   tile (row r = i * G + g: token i, head g of the group), so K and V are read once per kv head, not once per
//   query head; rows run in stripes of 16 (mma.sync m16n8k16's M), MT stripes per block (1, or 2 where G * L > 16
//   and d <= 128); more rows take more row blocks (grid.x), launched side by side so their K/V reads meet in L2.
//   split-KV: split s covers keys [s * chunk, (s + 1) * chunk) of its sequence (chunk: a multiple of 16 chosen on
//   the host, iosim/launch/decode.py); a split past n_b exits at once.
//   inside a block the 4 warps split the keys, not the rows: warp w takes the 16-key tiles w, w + 4, w + 8, ... of
//   the split, each warp with its own ring of Stages cp.async buffers (16-byte copies, rows past n_b zero-filled),
//   its own running (m, l, O) and no block-wide barrier in the loop (cp.async.wait_group + __syncwarp per tile).
//   A 16-key tile never crosses a page: page sizes are multiples of 16 (checked on the host). The block table is
//   read 32 tiles at a time (a lane a tile), a batch ahead of its use, so its loads never stall a copy.
//   per tile: S = Q K^T (16 x 16 per stripe), online softmax in exp2 (FlashAttention-2 lines 8-10), O += P V with P
//   rounded to the input dtype; keys past n_b and above the causal diagonal get -inf (one comparison: j > limit).
//   fp8 cache: the ring holds the e4m3 bytes (half the bytes in flight per slot; 16-byte chunks swizzled by row like
//   the 16-bit tiles); once a tile has landed each warp reads K's mma fragments straight from it (two e4m3 a lane
//   and a conversion each: common.cuh e4m3x2_to_half2) and turns V into an fp16 tile of its own for ldmatrix.trans
//   (exact: every e4m3 value is an fp16 value), and the multiplies run in fp16 whatever q's dtype: a bf16 Q_i is
//   turned to fp16 once a block, each row times a power of two that puts its largest value in [2^14, 2^15) (exact
//   but for values 2^28 below the row's largest), the power folded back into that row's softmax scale. k_scale (and
//   the conversion's unit) is folded into the softmax scale, v_scale into the epilogue's 1 / l; P is rounded to fp16.
//   epilogue: the 4 warps' (m, l, O) meet in shared memory (over Q_i and the K/V ring) and merge by the log-sum-exp
//   rule; one split: O in the input dtype and lse; several: O_s / l_s in fp32 and lse_s, per split.
// Kernel 2, flash_decode_combine_kernel (only when splits > 1; one warp per output row (b, i, h)):
//   m = max_s lse_s; O = sum_s e^(lse_s - m) O_s / sum_s e^(lse_s - m); lse = m + ln sum_s e^(lse_s - m), in one
//   pass over the splits (m kept as a running maximum, the sums rescaled when it grows: the online softmax's rule).
//   On sm_90 the host launches it as a programmatic dependent of kernel 1 (iosim/gpu/driver.py): every block of
//   kernel 1 allows it at its start (griddepcontrol.launch_dependents), so its blocks start, read their lengths and
//   wait (griddepcontrol.wait: kernel 1 complete, its stores visible) on the SMs kernel 1's last blocks free,
//   instead of after kernel 1's end and a launch.
//
// Why mma.sync and not CUDA cores: per key the block does 4 * M * d FLOPs (M = G * L rows) for 4 * d bytes of K and V,
// M FLOP/B. At G * L >= 8 that is >= 24 TFLOP/s at 3 TB/s: a third of the H100's fp32 FMA issue rate before the
// bf16 -> fp32 conversions and shared-memory operand reads, while mma.sync (rows padded to 16) needs under 10% of its
// rate at any M <= 16. The floor and the bytes in flight: docs/kernels.md, "flash_decode.cu".
//
// Versions:
//   v1  16-bit caches (measurement: docs/kernels.md).
//   v2  the fp8 (e4m3) cache, converted to bf16 or fp16 tiles by integer instructions: 1.2-1.4x the bf16 cache's
//       speed, not 2x; instruction-issue bound (ncu: IPC 2.2, issue slots 53%, 471 more instructions a warp tile).
//   v3  fp16 multiplies for an fp8 cache (no bf16 conversion), cvt.rn.f16x2.e4m3x2 on sm_89+: H100 76-98% of DRAM
//       (contiguous), but ~2.9 TB/s on the H200 too: a warp's serial load-convert-multiply chain, 8 warps an SM.
//   v4  K's fragments straight from the e4m3 ring (no fp16 K tile), so a warp needs 4 KB less shared memory and an
//       SM holds 3 blocks of d = 128 (12 warps).
//   v5  each warp's (page, slot) cursor moves by an add a tile; v4 divided a tile's first key by the run-time page
//       size twice a tile (~160 of a loop's 647 SASS instructions were that address work).
//   v6  the block table read 32 tiles at a time, 32 to 64 tiles ahead (v5 read a tile's page one tile ahead: a
//       dependent L2 load in each warp's copy stream wherever pages hold 64 keys or fewer).
//   v7  this one: the combine a programmatic dependent launch on sm_90 (its start and length read overlap kernel
//       1's last blocks), and one pass over the splits (v6 read every lse_s twice: a pass for the maximum, then
//       the weights; the first pass was one more L2 round trip a row).
#include "common.cuh"
#include "tile.cuh"

namespace iosim {

constexpr int kDecodeWarps = 4;  // warps per block; they split the keys of a split
constexpr int kDecodeTile = 16;  // keys per warp tile (mma n16); page sizes are multiples of it
// depth of each warp's K/V ring; mirrored by iosim/launch_decode.py decode_stages() for the shared-memory budget
__host__ __device__ constexpr int decode_stages(int D) { return D >= 256 ? 2 : (D >= 128 ? 3 : 4); }
// bytes of one warp's ring slots (K tile then V tile per slot) and, for an fp8 cache, its 16-bit K and V tiles;
// mirrored by iosim/launch/decode.py decode_smem_terms()
template <int D, typename T, typename KV>
__host__ __device__ constexpr int decode_warp_bytes() {  // (an fp8 cache's V tile is fp16: 2 bytes, as T)
    return decode_stages(D) * 2 * kDecodeTile * D * (int)sizeof(KV) +
           (is_same<KV, T>::value ? 0 : kDecodeTile * D * (int)sizeof(T));
}
// byte offset of 16-byte chunk c of row r in an e4m3 tile of D bytes a row: the chunks of a row XOR-swizzled by the
// row (as swz<> does 16-bit tiles), so the 8 rows a K fragment load touches fall on 8 different bank groups
template <int D>
__device__ __forceinline__ int swz8(int r, int c) {
    return r * D + ((D >= 128 ? c ^ (r & 7) : c ^ ((r >> 1) & 3)) << 4);
}
// fp32 row stride of a warp's O in the merge area: 8 floats of padding, so the float2 stores of a quad's 8 rows
// fall on distinct banks two wavefronts at a time
__host__ __device__ constexpr int decode_merge_stride(int D) { return D + 8; }

template <int D, int MT, typename T, typename KV>
__global__ void __launch_bounds__(128)
    flash_decode_kernel(const T* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                        T* __restrict__ o, float* __restrict__ lse, float* __restrict__ o_part,
                        float* __restrict__ lse_part, const int* __restrict__ seqlens_k,
                        const int* __restrict__ block_table, const float* __restrict__ k_scale,
                        const float* __restrict__ v_scale, int q_len, int heads, int kv_heads, int page_size,
                        int table_stride, int chunk, int n_splits, float scale_log2) {
    constexpr int kThreads = 32 * kDecodeWarps;
    constexpr bool kFp8 = is_same<KV, e4m3>::value;  // else KV = T
    static_assert(kFp8 || is_same<KV, T>::value, "the cache holds q's dtype or e4m3");
    using TC = typename pick<kFp8, __half, T>::type;  // the multiplies' type
    constexpr bool kRescaleQ = kFp8 && !is_same<T, TC>::value;  // a bf16 Q_i turned to fp16, row by row
    constexpr int kRowBytes = kFp8 ? 128 : 0;  // kRescaleQ: each row's power of two (Br <= 32 floats); host's term
    constexpr int Br = 16 * MT;             // rows of Q per block
    constexpr int Stages = decode_stages(D);
    constexpr int C = D / 8;                // 16-byte chunks per row of q's dtype
    constexpr int CK = D * (int)sizeof(KV) / 16;  // 16-byte chunks per row of the cache
    constexpr int KD = D / 16;              // k16 steps of Q K^T
    constexpr int ND = D / 8;               // n8 tiles of O per stripe
    constexpr int kSlot = 2 * kDecodeTile * D;  // elements of one ring slot: K tile then V tile
    constexpr bool kQInRegs = (MT == 1 && D <= 128);
    constexpr int kMS = decode_merge_stride(D);
    static_assert(D % 64 == 0 && (MT == 1 || MT == 2), "head dim 64, 128 or 256; 1 or 2 row stripes");
    static_assert(kDecodeWarps * Br * (kMS + 2) * 4 <=
                      Br * D * (int)sizeof(T) + kDecodeWarps * decode_warp_bytes<D, T, KV>(),
                  "the merge area must fit over Q_i and the K/V ring");
    IOSIM_TRACE_BLOCK();
    allow_dependent_launch();  // the combine (a programmatic dependent on sm_90) may start on the SMs we free

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);                                  // Br x D
    float* sRowF = reinterpret_cast<float*>(sQ + Br * D);                    // kRescaleQ: Br row factors
    unsigned char* sRing = reinterpret_cast<unsigned char*>(sQ + Br * D) + kRowBytes;  // warps x decode_warp_bytes

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int rb = blockIdx.x, split = blockIdx.y;
    const int b = blockIdx.z / kv_heads, hk = blockIdx.z % kv_heads;
    const int group = heads / kv_heads;
    const int rows = group * q_len;          // M: packed rows of this kv head
    const int r0 = rb * Br;
    const int rows_here = min(Br, rows - r0);
    const int seqlen = seqlens_k[b];
    const int key_begin = split * chunk;
    const int key_end = min(seqlen, key_begin + chunk);

    // output row of packed row rr: (b, token rr / G, head hk * G + rr % G) of O (B, L, H, d)
    auto out_row = [&](int rr) { return ((long long)b * q_len + rr / group) * heads + hk * group + rr % group; };
    auto lse_index = [&](int rr) {
        return ((long long)b * heads + hk * group + rr % group) * q_len + rr / group;
    };

    if (key_begin >= key_end) {  // no key in this split: only a lone split (n_b = 0) has anything to write
        if (n_splits == 1) {
            for (int idx = tid; idx < rows_here * C; idx += kThreads) {
                *reinterpret_cast<uint4*>(o + out_row(r0 + idx / C) * D + (idx % C) * 8) = make_uint4(0, 0, 0, 0);
            }
            for (int r = tid; r < rows_here; r += kThreads) lse[lse_index(r0 + r)] = -INFINITY;
        }
        return;
    }

    // the cache's scales (fp8): K's and the conversion's unit into the softmax's base-2 scale, V's into the epilogue
    float v_factor = 1.f;
    if constexpr (kFp8) {
        scale_log2 *= __ldg(k_scale + hk) * kE4m3HalfUnit;
        v_factor = __ldg(v_scale + hk) * kE4m3HalfUnit;
    }

    // Q_i into shared memory, rows past M zero-filled (group 0 of every thread)
    for (int idx = tid; idx < Br * C; idx += kThreads) {
        const int r = idx / C, c = idx % C;
        const bool ok = r < rows_here;
        cp_async_16(smem_u32(sQ + swz<D>(r, c)), q + out_row(r0 + (ok ? r : 0)) * D + c * 8, ok ? 16 : 0);
    }
    cp_async_commit();

    // this warp's tiles: w, w + 4, ... of the split's ceil((key_end - key_begin) / 16)
    const int n_tiles = (key_end - key_begin + kDecodeTile - 1) / kDecodeTile;
    const int n_w = n_tiles > warp ? (n_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
    const long long kv_stride = (long long)kv_heads * D;  // elements between consecutive tokens of one kv head
    KV* ring = reinterpret_cast<KV*>(sRing + warp * decode_warp_bytes<D, T, KV>());
    TC* sV16 = reinterpret_cast<TC*>(ring + Stages * kSlot);  // fp8: this warp's fp16 V tile
    auto tile_token = [&](int i) { return key_begin + (warp + kDecodeWarps * i) * kDecodeTile; };
    // where the warp's tiles lie: the slot by a cursor moved a tile (64 keys) at a time by an add and a compare, no
    // division in the loop (a contiguous cache is one page of max_len: page_size); the physical page from the block
    // table read 32 tiles at a time, 32 to 64 tiles ahead of its copies: lane l holds the page of the warp's tile
    // 32 m + l for the batch m in use (pg_cur) and the next (pg_nxt), and a tile's page is a shuffle from them
    constexpr int kStep = kDecodeWarps * kDecodeTile;  // keys between a warp's tiles
    const int step_slots = kStep % page_size;
    const int* table_row = block_table != nullptr ? block_table + (long long)b * table_stride : nullptr;
    // this lane's tile of the batch to read next: its table entry and slot, moved a batch (32 tiles, 2048 keys) at a
    // time by an add and a compare
    constexpr int kBatchKeys = 32 * kStep;
    const int batch_entries = kBatchKeys / page_size, batch_slots = kBatchKeys % page_size;
    int lane_entry = tile_token(lane) / page_size, lane_slot = tile_token(lane) % page_size, lane_tile = lane;
    auto table_batch = [&]() -> int {  // the page of this lane's tile of the next batch (0 past the warp's tiles)
        const int page = lane_tile < n_w ? __ldg(table_row + lane_entry) : 0;
        lane_tile += 32;
        lane_entry += batch_entries;
        lane_slot += batch_slots;
        if (lane_slot >= page_size) {
            lane_slot -= page_size;
            ++lane_entry;
        }
        return page;
    };
    int pg_cur = 0, pg_nxt = 0;
    if (table_row != nullptr) {
        pg_cur = table_batch();
        pg_nxt = table_batch();
    }
    int look_slot = tile_token(0) % page_size, looked = 0;
    auto page_of = [&]() -> int2 {  // (physical page, slot) of the warp's next tile
        int2 at = make_int2(b, look_slot);
        if (table_row != nullptr) {
            at.x = __shfl_sync(0xffffffffu, pg_cur, looked & 31);
            if ((looked & 31) == 31) {  // batch used up: the next one in use, the one after it requested
                pg_cur = pg_nxt;
                pg_nxt = table_batch();
            }
        }
        ++looked;
        look_slot += step_slots;
        if (look_slot >= page_size) look_slot -= page_size;
        return at;
    };
    // K_j, V_j (16 x D each) of tile i into ring slot `slot`; rows at or past n_b are zero-filled, never read.
    // 16-bit cache: swizzled rows (ldmatrix reads the slot); fp8: rows of D bytes, chunks swizzled (swz8)
    auto load_tile = [&](int i, int2 at, int slot) {
        const int tok = tile_token(i);
        const long long row0 = ((long long)at.x * page_size + at.y) * kv_heads + hk;  // first token's row
        const KV* kg = k + row0 * D;
        const KV* vg = v + row0 * D;
        KV* sK = ring + slot * kSlot;
        KV* sV = sK + kDecodeTile * D;
        const int valid = seqlen - tok;
#pragma unroll
        for (int it = 0; it < kDecodeTile * CK / 32; ++it) {
            const int idx = it * 32 + lane;
            const int r = idx / CK, c = idx % CK;
            const bool ok = r < valid;
            const long long off = (ok ? r : 0) * kv_stride + c * (16 / (int)sizeof(KV));
            const int dst = kFp8 ? swz8<D>(r, c) : swz<D>(r, c);
            cp_async_16(smem_u32(sK + dst), kg + off, ok ? 16 : 0);
            cp_async_16(smem_u32(sV + dst), vg + off, ok ? 16 : 0);
        }
    };
    // fp8: the e4m3 V tile of ring slot `slot` as this warp's swizzled fp16 tile (values / kE4m3HalfUnit); 8 bytes a
    // lane a step, so the 8 lanes of a store phase write 8 chunks of one row (distinct banks)
    auto convert_v = [&](int slot) {
        const unsigned char* src = reinterpret_cast<const unsigned char*>(ring + slot * kSlot + kDecodeTile * D);
#pragma unroll
        for (int it = 0; it < kDecodeTile * C / 32; ++it) {
            const int idx = it * 32 + lane;
            const int r = idx / C, c = idx % C;  // 8-byte chunk c of row r: half (c & 1) of 16-byte chunk c / 2
            const uint2 w = *reinterpret_cast<const uint2*>(src + swz8<D>(r, c >> 1) + (c & 1) * 8);
            unsigned h[4];
            e4m3x4_to_half2x2(w.x, h[0], h[1]);
            e4m3x4_to_half2x2(w.y, h[2], h[3]);
            *reinterpret_cast<uint4*>(sV16 + swz<D>(r, c)) = make_uint4(h[0], h[1], h[2], h[3]);
        }
    };

    // prologue: tiles 0 .. Stages-2 (one group each, maybe empty); the page of the next one read ahead
    int2 next_at = page_of();  // tile 0's
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
        if (s < n_w) {
            const int2 at = next_at;
            next_at = page_of();  // tile s + 1's
            load_tile(s, at, s);
        }
        cp_async_commit();
    }
    cp_async_wait<Stages - 1>();  // this thread's part of Q has landed
    __syncthreads();              // and every thread's
    if constexpr (kRescaleQ) {  // bf16 Q_i -> fp16, row r times 2^k_r (its largest value in [2^14, 2^15))
        for (int r = warp; r < Br; r += kDecodeWarps) {
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (lane < C) x = *reinterpret_cast<const uint4*>(sQ + swz<D>(r, lane));
            float f[8];
            unpack2<T>(x.x, f[0], f[1]);
            unpack2<T>(x.y, f[2], f[3]);
            unpack2<T>(x.z, f[4], f[5]);
            unpack2<T>(x.w, f[6], f[7]);
            float amax = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
#pragma unroll
            for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
            const int k = amax > 0.f ? max(-126, min(126, 14 - (((__float_as_int(amax) >> 23) & 0xff) - 127))) : 0;
            const float up = __int_as_float((127 + k) << 23);
            if (lane < C)
                *reinterpret_cast<uint4*>(sQ + swz<D>(r, lane)) =
                    make_uint4(pack2<TC>(f[0] * up, f[1] * up), pack2<TC>(f[2] * up, f[3] * up),
                               pack2<TC>(f[4] * up, f[5] * up), pack2<TC>(f[6] * up, f[7] * up));
            if (lane == 0) sRowF[r] = __int_as_float((127 - k) << 23);  // 2^-k
        }
        __syncthreads();
    }
    const TC* sQc = reinterpret_cast<const TC*>(sQ);  // Q_i in the multiplies' type

    // rows of this thread (stripe mt, half hr: row g or g + 8) and the last key each sees
    int limit[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int rr = r0 + mt * 16 + g + 8 * hr;
            limit[mt][hr] = rr < rows ? seqlen - q_len + rr / group : seqlen - 1;  // padding rows: any real key
        }
    const int mask_from = seqlen - q_len;  // tiles whose last key is past this hold a masked key for some row
    // each row's base-2 softmax scale (a rescaled Q_i's rows: times their 2^-k)
    float row_scale[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) row_scale[mt][hr] = kRescaleQ ? scale_log2 * sRowF[mt * 16 + g + 8 * hr] : scale_log2;

    const int a_row = lane & 15, a_chunk = lane >> 4;                              // A (Q): rows, k chunk
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;  // B (K): n rows, k chunk
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;  // B (V, trans): k rows, n chunk
    unsigned q_frag[kQInRegs ? KD : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int ks = 0; ks < KD; ++ks)
            ldmatrix_x4(q_frag[ks][0], q_frag[ks][1], q_frag[ks][2], q_frag[ks][3],
                        smem_u32(sQc + swz<D>(a_row, ks * 2 + a_chunk)));
    }

    float acc_o[MT][ND][4];
    float m_i[MT][2], l_i[MT][2];  // running row max (raw score units) and this thread's partial row sum
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nd = 0; nd < ND; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nd][e] = 0.f;
        m_i[mt][0] = m_i[mt][1] = -INFINITY;
        l_i[mt][0] = l_i[mt][1] = 0.f;
    }

    int stage = 0, fill = Stages - 1;  // ring slots of tile j and of tile j + Stages - 1
    for (int j = 0; j < n_w; ++j) {
        cp_async_wait<Stages - 2>();  // tile j has landed (this lane's copies) ...
        __syncwarp();                 // ... every lane's; and every lane is done with tile j - 1 (slot `fill`)
        const int jn = j + Stages - 1;
        if (jn < n_w) {
            const int2 at = next_at;
            next_at = page_of();  // tile jn + 1's
            load_tile(jn, at, fill);
        }
        cp_async_commit();  // one group per iteration, so the wait count stays exact
        const TC* sK = reinterpret_cast<const TC*>(ring + stage * kSlot);  // 16-bit cache
        const unsigned char* sK8 = reinterpret_cast<const unsigned char*>(ring + stage * kSlot);  // fp8 cache
        const TC* sV = kFp8 ? sV16 : sK + kDecodeTile * D;
        if constexpr (kFp8) convert_v(stage);  // before S: its stores land while S is computed
        stage = stage + 1 == Stages ? 0 : stage + 1;
        fill = fill + 1 == Stages ? 0 : fill + 1;

        // S = Q K_j^T: MT stripes of 16 rows x 16 keys
        float acc_s[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][0][e] = acc_s[mt][1][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KD; ++ks) {
            unsigned b0, b1, b2, b3;  // keys 0-7 (b0, b1) and 8-15 (b2, b3)
            if constexpr (kFp8) {  // key g (8 + g), d = 16 ks + 2 t4 (+ 8): two e4m3 each, from 16-byte chunk ks
                const unsigned char* k0 = sK8 + swz8<D>(g, ks) + 2 * t4;
                const unsigned char* k1 = sK8 + swz8<D>(8 + g, ks) + 2 * t4;
                b0 = e4m3x2_to_half2(*reinterpret_cast<const unsigned short*>(k0));
                b1 = e4m3x2_to_half2(*reinterpret_cast<const unsigned short*>(k0 + 8));
                b2 = e4m3x2_to_half2(*reinterpret_cast<const unsigned short*>(k1));
                b3 = e4m3x2_to_half2(*reinterpret_cast<const unsigned short*>(k1 + 8));
            } else {
                ldmatrix_x4(b0, b1, b2, b3, smem_u32(sK + swz<D>(b_row, ks * 2 + b_chunk)));
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                unsigned a[4];
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[e] = q_frag[ks][e];
                } else {
                    ldmatrix_x4(a[0], a[1], a[2], a[3], smem_u32(sQc + swz<D>(mt * 16 + a_row, ks * 2 + a_chunk)));
                }
                mma_16816<TC>(acc_s[mt][0], a, b0, b1);
                mma_16816<TC>(acc_s[mt][1], a, b2, b3);
            }
        }

        // keys past n_b and above the diagonal: -inf (col > limit covers both: every row's limit is < n_b)
        const int n0 = tile_token(j);
        if (n0 + kDecodeTile - 1 > mask_from) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (n0 + nt * 8 + 2 * t4 + (e & 1) > limit[mt][e >> 1]) acc_s[mt][nt][e] = -INFINITY;
        }

        // online softmax in fp32 (FlashAttention-2 lines 9-10), rescale O
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                float mx = fmaxf(m_i[mt][hr], fmaxf(fmaxf(acc_s[mt][0][2 * hr], acc_s[mt][0][2 * hr + 1]),
                                                    fmaxf(acc_s[mt][1][2 * hr], acc_s[mt][1][2 * hr + 1])));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_scaled = (mx == -INFINITY) ? 0.f : mx * row_scale[mt][hr];  // no key yet: no NaN
                const float corr = exp2_approx(m_i[mt][hr] * row_scale[mt][hr] - m_scaled);
                m_i[mt][hr] = mx;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
                        const float p = exp2_approx(fmaf(acc_s[mt][nt][e], row_scale[mt][hr], -m_scaled));
                        acc_s[mt][nt][e] = p;
                        rs += p;
                    }
                l_i[mt][hr] = l_i[mt][hr] * corr + rs;
#pragma unroll
                for (int nd = 0; nd < ND; ++nd) {
                    acc_o[mt][nd][2 * hr] *= corr;
                    acc_o[mt][nd][2 * hr + 1] *= corr;
                }
            }

        if constexpr (kFp8) __syncwarp();  // every lane's part of the fp16 V tile is written
        // O += P V_j: P (16 x 16 keys, the A operand) rounded to the multiplies' type, V read with ldmatrix.trans
        unsigned pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            pa[mt][0] = pack2<TC>(acc_s[mt][0][0], acc_s[mt][0][1]);
            pa[mt][1] = pack2<TC>(acc_s[mt][0][2], acc_s[mt][0][3]);
            pa[mt][2] = pack2<TC>(acc_s[mt][1][0], acc_s[mt][1][1]);
            pa[mt][3] = pack2<TC>(acc_s[mt][1][2], acc_s[mt][1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            unsigned b0, b1, b2, b3;  // (b0, b1): d-tile 2 dp; (b2, b3): d-tile 2 dp + 1
            ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sV + swz<D>(v_row, dp * 2 + v_chunk)));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816<TC>(acc_o[mt][2 * dp], pa[mt], b0, b1);
                mma_16816<TC>(acc_o[mt][2 * dp + 1], pa[mt], b2, b3);
            }
        }
    }
    cp_async_wait<0>();  // nothing may still be landing in the ring ...
    __syncthreads();     // ... and every warp is done reading it: the merge area goes over it

    // the warps' (m, l, O) into shared memory: O [warp][row][kMS] fp32, then m [warp][row] (in base-2 logits: times
    // the row's scale), l [warp][row]
    float* sO = reinterpret_cast<float*>(smem_raw);  // over Q_i and the ring: the loop is done with both
    float* sM = sO + kDecodeWarps * Br * kMS;
    float* sL = sM + kDecodeWarps * Br;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            float l = l_i[mt][hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = warp * Br + mt * 16 + g + 8 * hr;
            if (t4 == 0) {
                sM[row] = m_i[mt][hr] * row_scale[mt][hr];  // -inf stays -inf
                sL[row] = l;
            }
#pragma unroll
            for (int nd = 0; nd < ND; ++nd)
                *reinterpret_cast<float2*>(sO + row * kMS + nd * 8 + 2 * t4) =
                    make_float2(acc_o[mt][nd][2 * hr], acc_o[mt][nd][2 * hr + 1]);
        }
    __syncthreads();

    // merge by the log-sum-exp rule, 4 columns a thread, and write O and lse (one split) or this split's O_s, lse_s
    for (int idx = tid; idx < rows_here * (D / 4); idx += kThreads) {
        const int r = idx / (D / 4), c4 = idx % (D / 4);
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, sM[w * Br + r]);
        const float m_scaled = (mx == -INFINITY) ? 0.f : mx;
        float l = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
            const float f = exp2_approx(sM[w * Br + r] - m_scaled);  // a warp with no key: 0
            const float4 x = *reinterpret_cast<const float4*>(sO + (w * Br + r) * kMS + 4 * c4);
            l += f * sL[w * Br + r];
            acc.x += f * x.x;
            acc.y += f * x.y;
            acc.z += f * x.z;
            acc.w += f * x.w;
        }
        const float inv = l > 0.f ? v_factor / l : 0.f;
        const float row_lse = l > 0.f ? (m_scaled + __log2f(l)) * 0.69314718055994531f : -INFINITY;
        const long long orow = out_row(r0 + r);
        if (n_splits == 1) {
            *reinterpret_cast<uint2*>(o + orow * D + 4 * c4) =
                make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
            if (c4 == 0) lse[lse_index(r0 + r)] = row_lse;
        } else {
            *reinterpret_cast<float4*>(o_part + (orow * n_splits + split) * D + 4 * c4) =
                make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
            if (c4 == 0) lse_part[orow * n_splits + split] = row_lse;
        }
    }
}

// V consecutive floats of a partial output row (16-byte aligned where V >= 4): one float2, or V / 4 float4 loads.
template <int V>
__device__ __forceinline__ void load_row(const float* __restrict__ src, float (&x)[V]) {
    if constexpr (V == 2) {
        const float2 a = *reinterpret_cast<const float2*>(src);
        x[0] = a.x;
        x[1] = a.y;
    } else {
#pragma unroll
        for (int e = 0; e < V; e += 4) {
            const float4 a = *reinterpret_cast<const float4*>(src + e);
            x[e] = a.x;
            x[e + 1] = a.y;
            x[e + 2] = a.z;
            x[e + 3] = a.w;
        }
    }
}

// One round of a row's splits into its sums: the running maximum mx raised to the round's largest lse_s (the sums
// rescaled by e^(old - new), 0 from -inf), then each split's weight f = e^(lse_s - mx) added: l += f, acc += f O_s.
template <int V, int U>
__device__ __forceinline__ void merge_round(const float (&ls)[U], const float (&x)[U][V], int n, float& mx, float& l,
                                            float (&acc)[V]) {
    constexpr float kLog2e = 1.4426950408889634f;
    float m_new = mx;
#pragma unroll
    for (int u = 0; u < U; ++u)
        if (u < n) m_new = fmaxf(m_new, ls[u]);
    if (m_new == -INFINITY) return;  // no split of this round saw a key: nothing to add
    const float c = exp2_approx((mx - m_new) * kLog2e);  // mx = -inf: 0 (the sums are 0 too)
    l *= c;
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] *= c;
    mx = m_new;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u < n) {
            const float f = exp2_approx((ls[u] - mx) * kLog2e);
            l += f;
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] += f * x[u][e];
        }
    }
}

// Kernel 2: merge the splits of each output row (b, i, h), one warp a row, D / 32 columns a lane.
// o_part (B * L * H, n_splits, D) fp32 and lse_part (B * L * H, n_splits) as kernel 1 wrote them; a sequence of n_b
// keys has ceil(n_b / chunk) splits written (none when n_b = 0: O = 0, lse = -inf); a row whose token sees no key
// (i < L - n_b) has O = 0, lse = -inf and reads nothing.
// __launch_bounds__(128, 4): at least 4 blocks an SM, which leaves ptxas the registers to keep a round's loads in
// flight (56-71 registers; with the default it scheduled for 34 and issued the loads two at a time)
template <int D, typename T>
__global__ void __launch_bounds__(128, 4)
    flash_decode_combine_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                const int* __restrict__ seqlens_k, T* __restrict__ o, float* __restrict__ lse,
                                int n_rows, int q_len, int heads, int chunk, int n_splits) {
    constexpr int V = D / 32;  // columns per lane: 2, 4 or 8
    static_assert(V == 2 || V == 4 || V == 8, "head dim 64, 128 or 256");
    constexpr int kCombineUnroll = V == 8 ? 4 : 8;  // splits a round (iosim/launch/decode.py COMBINE_UNROLL)
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int b = row < n_rows ? (int)(row / ((long long)q_len * heads)) : 0;
    const int i = (int)((row / heads) % q_len), h = (int)(row % heads);
    const int seqlen = seqlens_k[b];  // an input: read before kernel 1 is done
    wait_prerequisite_grids();        // kernel 1's partials complete and visible (sm_90: a dependent launch)
    if (row >= n_rows) return;
    const int ns = i >= q_len - seqlen ? min(n_splits, (seqlen + chunk - 1) / chunk) : 0;  // 0: the row sees no key
    const float* lp = lse_part + row * n_splits;
    const float* op = o_part + row * n_splits * D + lane * V;

    // kCombineUnroll splits a round, their loads (lse_s and O_s) all issued before any is used, so a round costs one
    // L2 round trip: a long sequence of a small batch has up to 128 splits (the loop one split after another was a
    // chain of L2 round trips: 14 us of a 26 us call, one sequence of 32K keys on an H100). The last round loads the
    // splits that exist only (predicated), so every byte is read once.
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.f;
    float l = 0.f, mx = -INFINITY;
    for (int s = 0; s < ns; s += kCombineUnroll) {
        float ls[kCombineUnroll], x[kCombineUnroll][V];
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
            if (s + u < ns) {
                ls[u] = lp[s + u];
                load_row<V>(op + (long long)(s + u) * D, x[u]);
            }
        }
        merge_round<V, kCombineUnroll>(ls, x, ns - s, mx, l, acc);
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    unsigned packed[V / 2];
#pragma unroll
    for (int e = 0; e < V / 2; ++e) packed[e] = pack2<T>(acc[2 * e] * inv, acc[2 * e + 1] * inv);
    T* orow = o + row * D + lane * V;
    if constexpr (V == 2) {
        *reinterpret_cast<unsigned*>(orow) = packed[0];
    } else if constexpr (V == 4) {
        *reinterpret_cast<uint2*>(orow) = make_uint2(packed[0], packed[1]);
    } else {
        *reinterpret_cast<uint4*>(orow) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    if (lane == 0) lse[((long long)b * heads + h) * q_len + i] = l > 0.f ? mx + __logf(l) : -INFINITY;
}

}  // namespace iosim
