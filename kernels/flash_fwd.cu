// flash_fwd.cu: FlashAttention-2 forward (Dao 2023, Algorithm 1) on tensor cores, mma.sync m16n8k16.
//
//   O = softmax(scale * Q K^T) V, per (batch, head); Q (B, N, H, d), K and V (B, N_kv, H_kv, d), O like Q,
//   lse (B, H, N) fp32 = natural-log logsumexp of each row's scaled scores (-inf for a row that sees no key).
//
// Schedule (one thread block = one Q tile of Br rows of one (batch, head); grid = (Tr, H, B)):
//   Alg. line 4:  load Q_i (Br x d) into SRAM once
//   Alg. line 6:  for j in 0..Tc-1: load K_j, V_j (Bc x d) into SRAM through a ring of Stages cp.async buffers:
//                 tiles j+1 .. j+Stages-1 are in flight while tile j is used
//   Alg. line 8:  S_ij = Q_i K_j^T                                 (tensor cores, fp32 accumulators in registers)
//   Alg. line 9:  m_new = max(m, rowmax(S)); P = exp2(S*scale*log2e - m_new*scale*log2e); l = l*e^(m-m_new) + rowsum(P)
//   Alg. line 10: O = O * e^(m-m_new) + P V_j                       (P rounded to the input dtype, V via ldmatrix.trans)
//   Alg. line 12: O = O / l, written once in the input dtype;  line 13: lse = m*scale + ln(l)
// Each of the 4 warps owns MT = Br/64 stripes of 16 query rows, so softmax statistics never leave a warp's quad.
// Shared memory (computed term by term in iosim/gpu/build.py): Q (Br*d) + K, V (Stages * Bc*d each), input dtype.
// Layout: 16-byte chunks of each tile row are XOR-swizzled (chunk c of row r lives at c ^ (r & 7)), so the 8 row
// addresses of every ldmatrix phase and every cp.async store phase fall on 8 different 16-byte bank groups.
// Masking: keys >= kv_len (ragged last tile, zero-filled by cp.async) and, when causal, keys j > i + (kv_len - N)
// (bottom-right aligned) get -inf; K/V tiles entirely above the diagonal are never loaded.
// Grouped-query / multi-query: query head h reads kv head h / (H / H_kv).
// Varlen (template Varlen; iosim.gpu.attention_varlen): q, o (total_q, H, d), k, v (total_k, H_kv, d) packed, sequence
// b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 (keys likewise), lse (H, total_q); no padding is read, computed or
// written; grid (ceil(max_seqlen_q / Br), H, B), a block past its sequence's last Q tile exits at once; causal is
// bottom-right per sequence. Null cu_seqlens: the dense batch (what a window on iosim.gpu.attention runs).
// Paged (template Paged, with Varlen; iosim.gpu.attention_varlen with a block table): chunked prefill against a paged
// KV cache. k, v (num_pages, page_size, H_kv, d); key t of sequence b is slot t % page_size of page
// block_table[b * table_stride + t / page_size] (pages in any order); sequence b's keys are the first n_k =
// cu_seqlens_k[b + 1] - cu_seqlens_k[b] of its pages (the cache's lengths, FlashAttention's seqused_k), its queries the
// packed rows of q as in Varlen (a chunk of new tokens: bottom-right causal puts them at the cache's end). Row lists:
// thread r < Bc finds the cache row of key r of a tile and leaves it in the row list of the ring slot the tile goes to
// (Stages lists of Bc rows in shared memory, after the K/V ring), which the 16-byte cp.async copies of K and V then
// read; the loop keeps the lookups off the barrier every warp waits at: the entry of tile jn+2 is loaded after tile
// j's barrier (jn = j+Stages-1, the tile it copies), its row list stored after the next barrier, a tile before its
// copies read it, and the entry and slot of each key are moved on a tile at a time without a division (PageCursor).
// PageTiles (an instantiation of its own, for a page_size that is a multiple of Bc; the host runs it at d <= 128): a
// tile lies in one page, every thread loads the entry of tile jn+1 (one word, the same in every lane) after tile j's
// barrier and keeps it in a register, and the tile's copies run from its first row through 32-bit offsets within the
// page (load_kv_page_tile), issued after S; no row list. Measured (H200, docs/kernels.md has the search): row lists
// 0.95-0.96x the contiguous cache on the same tiles (the first versions, with a division and the list's store before
// the barrier: 0.61-0.90x); PageTiles 0.99-1.00x at d = 64 and 1.04-1.05x at d = 128.
// Sliding window (template Local; runtime bounds left, right: FlashAttention's window_size): row i sees keys
// i + off - left .. i + off + right (off = kv_len - seq_len; a causal window is right = 0). K/V tiles wholly outside
// a Q tile's window are never loaded (the loop runs n_min .. n_max - 1); tiles partly outside take the mask pass,
// which only tiles that need it run. The dense kernel (Local = Varlen = false) compiles to the same PTX and SASS as
// v4 (every instantiation, sm_80 and sm_90), apart from its name and four unused trailing parameters.
//
// Versions (llm.c style; numbers: device, bf16, d=128, N=4096, B*N=16384, H=16, TFLOP/s by 4*N^2*d*B*H/t;
// full tables in docs/benchmarks.md, the log with predictions in docs/kernels.md):
//   v1  first version: 4 warps, Br=128 (2 row stripes per warp, Q re-read from SRAM per k-step; Br=64 keeps Q
//       in registers), Bc=64 (32 at d=128), 2-stage cp.async for K and V together, two barriers per K/V tile, O
//       staged through SRAM for 16-byte stores, causal Q tiles launched heaviest first. Measured (H200): d=128
//       bf16 N=4096 296.8 TFLOP/s (0.85x torch SDPA flash), causal 239.9 (0.81x); d=64 291.9 (0.97x).
//   v2  Stages-deep K/V ring (3 for d <= 128, 2 for d=256) with one barrier per K/V tile: the load of tile
//       j+Stages-1 is issued right after the barrier that proves every warp is done with tile j-1, whose slot it
//       reuses. Measured (H200): d=128 bf16 N=4096 311.1 TFLOP/s (0.92x), causal 244-273 across runs; d=64 304.5.
//   v3  O rescaled only when a row's running max changed (warp vote), __syncwarp before O is staged in the
//       warp's own Q rows (racecheck warned about lanes of one warp without it). Measured (H200): SLOWER, d=128
//       bf16 N=4096 289.5 TFLOP/s (-7%), d=64 278.1 (-9%): the branch cost more than the multiplies it skipped.
//   v4  v3 without the conditional rescale (v2's unconditional O *= corr) and with the __syncwarp.
//       Measured (H200): d=128 bf16 N=4096 311.2 TFLOP/s (0.87x torch SDPA flash), N >= 2048 0.87-0.90x,
//       causal 0.84-0.91x; d=64 1.01x; racecheck and memcheck clean. The current version.
//   v4.1 (same code for the dense batch) varlen and sliding-window instantiations (Varlen, Local); their mask pass
//       compares each bound as one number per thread and tile against compile-time offsets (fewer live registers:
//       the index form spilled at d=128 128x32). Not measured yet (docs/kernels.md has the prediction).
#include "common.cuh"
#include "tile.cuh"

namespace iosim {

// depth of the K/V cp.async ring; mirrored by iosim/gpu/build.py flash_stages() for the shared-memory budget
__host__ __device__ constexpr int flash_stages(int D) { return D >= 256 ? 2 : 3; }

// *p by an asm volatile load: the compiler neither merges it with an earlier read of p (a value found once before the
// K/V loop is found again after it instead of living in a register across it: d = 128 sits at 255 registers) nor
// moves it past the asm around it (cp.async, ldmatrix, mma), so it issues where it is written
__device__ __forceinline__ int ld_global_again(const int* p) {
    int x;
    asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(x) : "l"(p));
    return x;
}

// Paged: where key t of a sequence lives, entry t / page_size of its block-table row and slot t % page_size of that
// page, moved on a tile (Bc keys: `pages` whole pages and `keys` more) without a division
struct PageCursor {
    int entry, slot;
    __device__ __forceinline__ void advance(int pages, int keys, int page_size) {
        entry += pages;
        slot += keys;
        if (slot >= page_size) {
            slot -= page_size;
            ++entry;
        }
    }
};

// K_j and V_j (ROWS keys, nvalid of them real) from a paged cache into swizzled shared memory: kg, vg point at the
// cache's first row for this kv head, rows[r] is key r's cache row (a list in shared memory). Rows >= nvalid are
// zero-filled (source: the cache's first row, never read), as load_tile_async does.
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_kv_paged(T* sk, T* sv, const T* kg, const T* vg, long long stride,
                                              const int* rows, int nvalid, int tid) {
    constexpr int C = D / 8;
    constexpr int TOTAL = ROWS * C;
#pragma unroll
    for (int it = 0; it < (TOTAL + THREADS - 1) / THREADS; ++it) {
        const int idx = it * THREADS + tid;
        if (TOTAL % THREADS == 0 || idx < TOTAL) {
            const int r = idx / C, c = idx % C;
            const bool ok = r < nvalid;
            const long long row = ok ? rows[r] : 0;
            cp_async_16(smem_u32(sk + swz<D>(r, c)), kg + row * stride + c * 8, ok ? 16 : 0);
            cp_async_16(smem_u32(sv + swz<D>(r, c)), vg + row * stride + c * 8, ok ? 16 : 0);
        }
    }
}

// PageTiles: K_j and V_j (ROWS consecutive rows of one page, nvalid of them real) from kt, vt (the tile's first row)
// into swizzled shared memory. Every row lies in the page, so a row past nvalid keeps its own address and is
// zero-filled; a copy's offset within the tile fits 32 bits (ROWS * stride elements).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_kv_page_tile(T* sk, T* sv, const T* kt, const T* vt, int stride, int nvalid,
                                                  int tid) {
    constexpr int C = D / 8;
    constexpr int TOTAL = ROWS * C;
#pragma unroll
    for (int it = 0; it < (TOTAL + THREADS - 1) / THREADS; ++it) {
        const int idx = it * THREADS + tid;
        if (TOTAL % THREADS == 0 || idx < TOTAL) {
            const int r = idx / C, c = idx % C;
            const int off = r * stride + c * 8;
            const int bytes = r < nvalid ? 16 : 0;
            cp_async_16(smem_u32(sk + swz<D>(r, c)), kt + off, bytes);
            cp_async_16(smem_u32(sv + swz<D>(r, c)), vt + off, bytes);
        }
    }
}

template <int D, int Br, int Bc, typename T, bool Causal, bool Local = false, bool Varlen = false, bool Paged = false,
          bool PageTiles = false>
__global__ void __launch_bounds__(128)
    flash_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                     float* __restrict__ lse, int seq_len, int kv_len, int heads, int kv_heads, float scale_log2,
                     const int* __restrict__ cu_seqlens_q, const int* __restrict__ cu_seqlens_k, int window_left,
                     int window_right, const int* __restrict__ block_table, int table_stride, int page_size) {
    constexpr int kWarps = 4, kThreads = 32 * kWarps;
    constexpr int MT = Br / (16 * kWarps);  // 16-row stripes per warp
    constexpr int NT = Bc / 8;              // n8 tiles of S per stripe
    constexpr int KD = D / 16;              // k16 steps of Q K^T
    constexpr int ND = D / 8;               // n8 tiles of O per stripe
    constexpr bool kQInRegs = (MT == 1 && D <= 128);  // Q fragments live in registers for the whole loop
    static_assert(Br % (16 * kWarps) == 0 && Bc % 16 == 0 && D % 32 == 0, "tile shape");
    static_assert(!(Causal && Local), "a causal window is Local with right = 0");
    static_assert(!Paged || Varlen, "a paged cache takes the varlen arguments");
    static_assert(!PageTiles || Paged, "tiles in one page are a paged cache's");

    constexpr int Stages = flash_stages(D);
    IOSIM_TRACE_BLOCK();  // no-op unless compiled with -DIOSIM_BLOCK_TRACE (kernels/common.cuh)

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // Br x D
    T* sK = sQ + Br * D;                     // Stages x Bc x D
    T* sV = sK + Stages * Bc * D;            // Stages x Bc x D
    // Paged: Stages x Bc cache rows, the list of the K/V tile in ring slot s at s (iosim/launch/forward.py
    // flash_smem_terms(paged=True) mirrors it)
    int* sRows = reinterpret_cast<int*>(sV + Stages * Bc * D);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;  // mma fragment coordinates: row group, thread in group
    // this sequence's queries and keys: the dense batch's seq_len and kv_len; varlen: sequence b is rows q0 ..
    // q0 + n_q - 1 of q and rows k0 .. k0 + n_k - 1 of k, v (cu_seqlens), or the dense batch's b-th (null cu_seqlens)
    int n_q = seq_len, n_k = kv_len;
    long long q0 = 0, k0 = 0;
    if constexpr (Varlen) {
        if (cu_seqlens_q != nullptr) {
            q0 = cu_seqlens_q[blockIdx.z];
            k0 = cu_seqlens_k[blockIdx.z];
            n_q = cu_seqlens_q[blockIdx.z + 1] - (int)q0;
            n_k = cu_seqlens_k[blockIdx.z + 1] - (int)k0;
        } else {
            q0 = (long long)blockIdx.z * seq_len;
            k0 = (long long)blockIdx.z * kv_len;
        }
        if ((int)blockIdx.x * Br >= n_q) return;  // past this sequence's last Q tile: nothing to do
    }
    // causal Q tiles near the bottom see the most keys: launch them first (longest-processing-time first); a
    // varlen or windowed sequence's tiles likewise, from its own last tile
    const int m_block = Varlen ? ((Causal || Local) ? (n_q - 1) / Br - (int)blockIdx.x : (int)blockIdx.x)
                               : Causal ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (heads / kv_heads);
    const int m0 = m_block * Br;
    const long long q_stride = (long long)heads * D;      // elements between consecutive query rows
    const long long kv_stride = (long long)kv_heads * D;  // elements between consecutive key rows
    const T* qg = Varlen ? q + (q0 + m0) * q_stride + (long long)h * D
                         : q + ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
    T* og = Varlen ? nullptr : o + ((long long)b * seq_len + m0) * q_stride + (long long)h * D;
    if constexpr (Paged) k0 = 0;  // the keys live in the pages of block_table's row b
    const T* kg = Varlen ? k + k0 * kv_stride + (long long)hk * D : k + (long long)b * kv_len * kv_stride + (long long)hk * D;
    const T* vg = Varlen ? v + k0 * kv_stride + (long long)hk * D : v + (long long)b * kv_len * kv_stride + (long long)hk * D;
    const int* table = Paged ? block_table + (long long)b * table_stride : nullptr;
    // Paged, row lists: thread tid < Bc finds the cache row of key tid of each tile and leaves it in the row list of
    // the ring slot the tile goes to; the K/V loop does it without a division. PageTiles: every thread loads the
    // entry of a tile's one page a tile ahead (the same word in every lane) and keeps it in a register.
    // The block-table entry of key tid of tile jj (0 past the keys): issued before the tile's math, used after it
    // (ptxas would otherwise sink a plain load to its use)
    auto page_of = [&](int jj) {
        const int t = jj * Bc + (PageTiles ? 0 : tid);
        return ((PageTiles || tid < Bc) && t < n_k) ? ld_global_again(table + t / page_size) : 0;
    };
    auto put_row = [&](int slot, int jj, int page) {
        if (tid < Bc) sRows[slot * Bc + tid] = page * page_size + (jj * Bc + tid) % page_size;
    };
    // Alg. line 7: K_j, V_j into ring slot `slot` (contiguous rows; the pages of a paged cache: the slot's row list,
    // or PageTiles: Bc consecutive rows from `first`, the cache row of the tile's first key)
    auto load_kv = [&](int slot, int jj, int first) {
        if constexpr (PageTiles) {
            const long long off = (long long)first * (int)kv_stride;
            load_kv_page_tile<Bc, D, kThreads>(sK + slot * Bc * D, sV + slot * Bc * D, kg + off, vg + off,
                                               (int)kv_stride, n_k - jj * Bc, tid);
        } else if constexpr (Paged) {
            load_kv_paged<Bc, D, kThreads>(sK + slot * Bc * D, sV + slot * Bc * D, kg, vg, kv_stride,
                                           sRows + slot * Bc, n_k - jj * Bc, tid);
        } else {
            const long long off = (long long)jj * Bc * kv_stride;
            load_tile_async<Bc, D, kThreads>(sK + slot * Bc * D, kg + off, kv_stride, n_k - jj * Bc, tid);
            load_tile_async<Bc, D, kThreads>(sV + slot * Bc * D, vg + off, kv_stride, n_k - jj * Bc, tid);
        }
    };
    float* lseg = Varlen ? nullptr : lse + ((long long)b * heads + h) * seq_len + m0;
    // Varlen: O's and lse's rows of the tile, found when they are written (varlen_out) rather than held in registers
    // across the K/V loop; the dense batch's are made of kernel parameters, which cost no register to keep
    auto varlen_out = [&]() {
        if constexpr (Varlen) {
            // lse is (H, total_q) with cu_seqlens (seq_len = total_q), (B, H, N) without
            const long long q0_again = cu_seqlens_q != nullptr ? ld_global_again(cu_seqlens_q + blockIdx.z) : q0;
            og = o + (q0_again + m0) * q_stride + (long long)h * D;
            lseg = lse + (cu_seqlens_q != nullptr ? (long long)h * seq_len + q0_again
                                                  : ((long long)b * heads + h) * seq_len) + m0;
        }
    };

    const int q_valid = min(Br, n_q - m0);
    const int offset = n_k - n_q;  // causal: row i sees key j iff j <= i + offset
    int n_blocks = (n_k + Bc - 1) / Bc;  // Tc
    if (Causal) {
        const int last_key = m0 + Br - 1 + offset;  // the largest key any row of this tile sees
        n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / Bc + 1);
    }
    // Local: query i sees keys i + offset - left .. i + offset + right; each bound clamped to the lengths (one past
    // them excludes nothing, and the index sums stay within int). K/V tiles n_min .. n_blocks - 1 are visited.
    const int left = Local ? min(window_left, n_k) : 0, right = Local ? min(window_right, n_q) : 0;
    int n_min = 0;
    if constexpr (Local) {
        const int last_key = m0 + Br - 1 + offset + right;  // the largest key any row of this tile sees
        n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / Bc + 1);
        const int first_key = m0 + offset - left;  // the smallest; tiles left of it are never loaded
        n_min = first_key <= 0 ? 0 : first_key / Bc;
    }
    if (Local ? n_blocks <= n_min : n_blocks <= 0) {  // no row of this tile sees any key: O = 0, lse = -inf
        varlen_out();
        for (int idx = tid; idx < q_valid * ND; idx += kThreads) {
            *reinterpret_cast<uint4*>(og + (idx / ND) * q_stride + (idx % ND) * 8) = make_uint4(0, 0, 0, 0);
        }
        for (int r = tid; r < q_valid; r += kThreads) lseg[r] = -INFINITY;
        return;
    }

    // Alg. line 4: Q_i into SRAM (group 0); line 6 for j = n_min .. n_min+Stages-2: K_j, V_j (one group each, maybe
    // empty) into ring slots 0 .. Stages-2 (n_min = 0 but for Local)
    // Paged, row lists: the loop stores the row list of tile jn+1 (jn = j+Stages-1, the tile it loads) after its
    // barrier, into the slot tile jn+1 will use (tile j's, read before that barrier), from next_page, the entry loaded
    // a tile earlier; `at` is where key tid of tile jn+1 lives. PageTiles: next_page is tile jn's page, `at` where
    // its first key lives.
    int next_page = 0;
    PageCursor at{0, 0};
    constexpr bool kRowLists = Paged && !PageTiles;
    const int step_pages = kRowLists ? Bc / page_size : 0, step_keys = kRowLists ? Bc % page_size : 0;  // row lists:
    // a tile's whole pages and keys more
    if constexpr (PageTiles) {  // the first tile the loop loads
        if (n_min + Stages - 1 < n_blocks) next_page = page_of(n_min + Stages - 1);
        const int t = (n_min + Stages - 1) * Bc;
        at = PageCursor{t / page_size, t % page_size};
    } else if constexpr (Paged) {  // the row lists of the tiles loaded before the loop and at its first tile
#pragma unroll
        for (int s = 0; s < Stages; ++s)
            if (n_min + s < n_blocks) put_row(s, n_min + s, page_of(n_min + s));
        if (n_min + Stages < n_blocks) next_page = page_of(n_min + Stages);
        const int t = (n_min + Stages) * Bc + tid;
        at = PageCursor{t / page_size, t % page_size};
        __syncthreads();  // the lists are visible to every thread before its copies read them
    }
    load_tile_async<Br, D, kThreads>(sQ, qg, q_stride, q_valid, tid);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
        const int js = Local ? n_min + s : s;
        if (js < n_blocks) load_kv(s, js, PageTiles ? page_of(js) * page_size + js * Bc % page_size : 0);
        cp_async_commit();
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
    unsigned q_frag[kQInRegs ? KD : 1][4];

    // ldmatrix lane roles (see the fragment layouts of mma.m16n8k16 in the PTX ISA)
    const int a_row = lane & 15, a_chunk = lane >> 4;            // A (Q): rows 0-15, k chunk 0/1
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;  // B (K): n rows, k chunk
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;  // B (V, trans): k rows, n chunk

    int stage = 0;                // slot of tile j in the ring
    int fill = (Stages - 1) % Stages;  // slot that tile j + Stages - 1 goes to
    for (int j = Local ? n_min : 0; j < n_blocks; ++j) {
        const T* sKs = sK + stage * Bc * D;
        const T* sVs = sV + stage * Bc * D;
        cp_async_wait<Stages - 2>();  // all but the newest Stages-2 groups have landed: Q, K_j, V_j
        // one barrier per tile: tile j is visible to every warp, and every warp is done with tile j-1 (slot `fill`)
        __syncthreads();
        const int jn = j + Stages - 1;
        int ready = 0;  // Paged: tile jn+1's entry (PageTiles: tile jn's first row)
        PageCursor next = at;  // row lists: where key tid of tile jn+2 lives
        if constexpr (PageTiles) {  // tile jn+1's page, in flight for this tile's math
            ready = next_page * page_size + at.slot;
            at.advance(0, Bc, page_size);
            if (jn + 1 < n_blocks) next_page = ld_global_again(table + at.entry);
        } else if constexpr (Paged) {  // tile jn+2's entry, issued before this tile's copies, in flight for its math
            ready = next_page;
            next.advance(step_pages, step_keys, page_size);
            if (jn + 2 < n_blocks)
                next_page = (tid < Bc && (jn + 2) * Bc + tid < n_k) ? ld_global_again(table + next.entry) : 0;
        }
        const int fill_jn = fill;  // PageTiles: tile jn's slot, its copies issued after S (below)
        if (!PageTiles && jn < n_blocks) load_kv(fill, jn, ready);  // Alg. line 6, tile j+Stages-1, over tiles j ..
        if constexpr (kRowLists) {  // tile jn+1's row list, after the barrier: no warp waits for it until
            if (jn + 1 < n_blocks && tid < Bc) sRows[stage * Bc + tid] = ready * page_size + at.slot;  // the next one
            at = next;
        }

        if constexpr (!PageTiles) cp_async_commit();  // one group per iteration: the wait count above stays exact
        stage = (stage + 1 == Stages) ? 0 : stage + 1;
        fill = (fill + 1 == Stages) ? 0 : fill + 1;

        if constexpr (kQInRegs) {
            if (j == (Local ? n_min : 0)) {
#pragma unroll
                for (int ks = 0; ks < KD; ++ks)
                    ldmatrix_x4(q_frag[ks][0], q_frag[ks][1], q_frag[ks][2], q_frag[ks][3],
                                smem_u32(sQ + swz<D>(warp * 16 + a_row, ks * 2 + a_chunk)));
            }
        }

        // Alg. line 8: S = Q_i K_j^T
        float acc_s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KD; ++ks) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[ks][e];
                } else {
                    ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                                smem_u32(sQ + swz<D>(mt * 16 * kWarps + warp * 16 + a_row, ks * 2 + a_chunk)));
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned b0, b1, b2, b3;  // (b0, b1): n-tile 2np; (b2, b3): n-tile 2np+1
                ldmatrix_x4(b0, b1, b2, b3, smem_u32(sKs + swz<D>(np * 16 + b_row, ks * 2 + b_chunk)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<T>(acc_s[mt][2 * np], a[mt], b0, b1);
                    mma_16816<T>(acc_s[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
        }

        // PageTiles: tile jn's copies (Alg. line 7) after S. Issued before S, ptxas re-read the thread index for S's
        // ldmatrix offsets behind them, and every warp waited on it (docs/kernels.md, v9); its slot was freed at the
        // barrier either way, and it still has Stages-2 tiles to land
        if constexpr (PageTiles) {
            if (jn < n_blocks) load_kv(fill_jn, jn, ready);
            cp_async_commit();
        }

        // mask keys past kv_len and, when causal, above the diagonal (Local: outside the window); only tiles that
        // hold such keys pay for it, in a pass of its own (a test inside the exp loop would cost every tile)
        const int n0 = j * Bc;
        const bool need_mask = Local ? (n0 + Bc > n_k) || (n0 + Bc - 1 > m0 + offset + right) ||  // right of row 0's
                                           (n0 < m0 + Br - 1 + offset - left)  // window, or left of the last row's
                                     : (n0 + Bc > n_k) || (Causal && n0 + Bc - 1 > m0 + offset);
        if (need_mask) {
            if constexpr (Varlen) {
                // key col = n0 + 2 t4 + c and row = m0 + 16 warp + g + r, c and r known at compile time: each bound
                // as one number per thread and tile compared with constants (fewer live registers than the indices)
                const int base = n0 + 2 * t4 - m0 - warp * 16 - g;  // col - row - (c - r)
                const int hi = offset + right - base;                // causal, Local: masked where c - r > hi
                const int lo = offset - left - base;                 // Local: masked where c - r < lo
                const int kv_hi = n_k - n0 - 2 * t4;                 // masked where c >= kv_hi (past the keys)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int c = nt * 8 + (e & 1), r = mt * 16 * kWarps + ((e >> 1) << 3);
                            if (c >= kv_hi || ((Causal || Local) && c - r > hi) || (Local && c - r < lo))
                                acc_s[mt][nt][e] = -INFINITY;
                        }
            } else {  // the dense kernel's pass, as it was
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int row = m0 + mt * 16 * kWarps + warp * 16 + g + ((e >> 1) << 3);
                            const int col = n0 + nt * 8 + 2 * t4 + (e & 1);
                            if (col >= n_k || (Causal && col > row + offset)) acc_s[mt][nt][e] = -INFINITY;
                        }
            }
        }

        // Alg. line 9-10: online softmax in fp32, rescale O
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {  // hr = 0: row g, hr = 1: row g + 8
                float mx = m_i[mt][hr];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * hr], acc_s[mt][nt][2 * hr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // a row with no visible key so far keeps max -inf: subtract 0 instead, so exp2(-inf - 0) = 0, no NaN
                const float m_scaled = (mx == -INFINITY) ? 0.f : mx * scale_log2;
                const float corr = exp2_approx(m_i[mt][hr] * scale_log2 - m_scaled);
                m_i[mt][hr] = mx;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
                        const float p = exp2_approx(fmaf(acc_s[mt][nt][e], scale_log2, -m_scaled));
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

        // Alg. line 10: O += P V_j, P rounded to the input dtype as the A operand
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                a[mt][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                a[mt][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b0, b1, b2, b3;  // (b0, b1): d-tile 2dp; (b2, b3): d-tile 2dp+1
                ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sVs + swz<D>(kk * 16 + v_row, dp * 2 + v_chunk)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<T>(acc_o[mt][2 * dp], a[mt], b0, b1);
                    mma_16816<T>(acc_o[mt][2 * dp + 1], a[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy may still be in flight into shared memory when the block exits

    // Alg. line 12-13: O = O / l, lse = m*scale + ln(l); rows that saw no key: O = 0, lse = -inf
    varlen_out();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            float l = l_i[mt][hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) {
                acc_o[mt][nd][2 * hr] *= inv;
                acc_o[mt][nd][2 * hr + 1] *= inv;
            }
            const int row = mt * 16 * kWarps + warp * 16 + g + 8 * hr;
            if (t4 == 0 && row < q_valid)
                lseg[row] = l > 0.f ? (m_i[mt][hr] * scale_log2 + __log2f(l)) * 0.69314718055994531f : -INFINITY;
        }

    // O tile -> this warp's own rows of sQ (no other warp reads them) -> 16-byte coalesced stores
    __syncwarp();  // every lane's last ldmatrix of these Q rows is done before any lane overwrites them
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int r0 = mt * 16 * kWarps + warp * 16;
#pragma unroll
        for (int nd = 0; nd < ND; ++nd) {
            *reinterpret_cast<unsigned*>(sQ + swz<D>(r0 + g, nd) + 2 * t4) =
                pack2<T>(acc_o[mt][nd][0], acc_o[mt][nd][1]);
            *reinterpret_cast<unsigned*>(sQ + swz<D>(r0 + g + 8, nd) + 2 * t4) =
                pack2<T>(acc_o[mt][nd][2], acc_o[mt][nd][3]);
        }
        __syncwarp();
#pragma unroll
        for (int idx = lane; idx < 16 * ND; idx += 32) {
            const int r = r0 + idx / ND, c = idx % ND;
            if (r < q_valid)
                *reinterpret_cast<uint4*>(og + r * q_stride + c * 8) =
                    *reinterpret_cast<const uint4*>(sQ + swz<D>(r, c));
        }
    }
}

}  // namespace iosim
