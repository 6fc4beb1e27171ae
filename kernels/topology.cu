// Topology probes for the L2 model (docs/validation.md, "Which SM feeds which L2 partition"); driven by
// iosim/gpu/topology.py. Plain extern "C" kernels, one thread per block does the work.
//
// iosim_dispatch: where the hardware puts each block of a grid. Every block records its %smid and its start time,
//   then holds its SM for spin_ns so that a whole wave is resident at once. The launch's dynamic shared memory sets
//   how many blocks fit on one SM.
// iosim_l2near: which SMs share an L2 partition. Block `ref` walks a pointer chain through region j (its lines go
//   into L2), then lets block j walk the same chain three times, timed with clock64: (1) lines that the ref SM has
//   just loaded, (2) the same lines again (now loaded by this SM too), (3) a region nobody has touched (DRAM). An SM
//   that sees the ref SM's lines as fast as its own shares the ref SM's partition. Turns are serialized (one SM
//   walks at a time) through flags, so walks do not contend. Needs every block resident at once: launch one block
//   per SM (grid = SM count, shared memory large enough that two do not fit).

__device__ __forceinline__ unsigned iosim_smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

__device__ __forceinline__ unsigned long long iosim_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void iosim_dispatch(int* sm_of_block, unsigned long long* start_ns, long long spin_ns) {
    extern __shared__ unsigned char hold[];  // only its size matters: it sets the blocks per SM
    if (threadIdx.x != 0) return;
    const unsigned long long t0 = iosim_globaltimer();
    sm_of_block[blockIdx.x] = (int)iosim_smid();
    start_ns[blockIdx.x] = t0;
    hold[0] = 1;
    while (iosim_globaltimer() - t0 < (unsigned long long)spin_ns) {
    }
}

__device__ __forceinline__ unsigned iosim_ld_cg(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");  // L2 only, never L1
    return v;
}

// n dependent loads starting at word `i`; returns where the walk ends, *cycles = its clock64 span. The store to
// shared memory needs the last load's value, so the second clock read comes after every load has returned.
__device__ __forceinline__ unsigned iosim_walk(const unsigned* chain, unsigned i, int n, long long* cycles,
                                               volatile unsigned* sink) {
    const long long t0 = clock64();
    for (int k = 0; k < n; ++k) i = iosim_ld_cg(chain + i);
    sink[0] = i;
    *cycles = clock64() - t0;
    return i;
}

// chain: the regions' pointer chains (word index of the next line, in each line's first word); heads[r]: the first
// word of region r (regions 0..G-1 are loaded by ref, G..2G-1 are cold). Outputs per block b: sm_of_block[b],
// cycles[4b + 0..3] = (ref's loading walk of region b, walk 1, walk 2, walk 3), ends[4b + 0..3] = where each ended.
extern "C" __global__ void iosim_l2near(const unsigned* chain, const unsigned* heads, int n, int ref, unsigned* flag,
                                        int* sm_of_block, long long* cycles, unsigned* ends) {
    extern __shared__ unsigned char hold[];  // sized by the launch so that one block fills an SM
    volatile unsigned* sink = reinterpret_cast<volatile unsigned*>(hold);
    if (threadIdx.x != 0) return;
    const int G = gridDim.x, b = blockIdx.x;
    sm_of_block[b] = (int)iosim_smid();
    long long c;
    if (b == ref) {
        for (int j = 0; j < G; ++j) {
            if (j == ref) continue;
            ends[4 * j] = iosim_walk(chain, heads[j], n, &c, sink);
            cycles[4 * j] = c;
            __threadfence();
            atomicExch(flag + j, 1u);
            while (atomicAdd(flag + j, 0u) != 2u) __nanosleep(200);
        }
    } else {
        while (atomicAdd(flag + b, 0u) != 1u) __nanosleep(500);
        ends[4 * b + 1] = iosim_walk(chain, heads[b], n, &c, sink);
        cycles[4 * b + 1] = c;
        ends[4 * b + 2] = iosim_walk(chain, heads[b], n, &c, sink);
        cycles[4 * b + 2] = c;
        ends[4 * b + 3] = iosim_walk(chain, heads[G + b], n, &c, sink);
        cycles[4 * b + 3] = c;
        __threadfence();
        atomicExch(flag + b, 2u);
    }
}

// iosim_l2probe_masked: the read-twice probe (iosim measure's l2probe) with only some SMs reading. rank_of_sm[smid]
// is the block's rank among the reading SMs, or -1: that block exits. Launch one block per SM (grid = SM count,
// shared memory so that two do not fit), so the n_active reading blocks sit on exactly the chosen SMs. Each float4
// is read by one thread in both passes (so each line by one SM), through L2 only (ld.global.cg).
extern "C" __global__ void iosim_l2probe_masked(const float4* __restrict__ a, long long n, const int* rank_of_sm,
                                                int n_active, float* out) {
    extern __shared__ unsigned char hold[];
    const int rank = rank_of_sm[iosim_smid()];
    if (rank < 0) return;
    if (threadIdx.x == 0) hold[0] = 0;
    float s = 0.f;
    const long long stride = (long long)n_active * blockDim.x;
    for (int pass = 0; pass < 2; ++pass)
        for (long long i = (long long)rank * blockDim.x + threadIdx.x; i < n; i += stride) {
            const float4 x = __ldcg(a + i);
            s += x.x + x.y + x.z + x.w;
        }
    if (s == 12345.678f) out[0] = s;  // keeps the loads; never true for the data used
}

// iosim_l2write_masked: write nbytes (whole lines, dirty in L2) from the chosen SMs only (rank_of_sm as above).
// Under ncu the DRAM writes are what L2 could not keep dirty.
extern "C" __global__ void iosim_l2write_masked(float4* w, long long n, const int* rank_of_sm, int n_active) {
    extern __shared__ unsigned char hold[];
    const int rank = rank_of_sm[iosim_smid()];
    if (rank < 0) return;
    if (threadIdx.x == 0) hold[0] = 0;
    const long long stride = (long long)n_active * blockDim.x;
    for (long long i = (long long)rank * blockDim.x + threadIdx.x; i < n; i += stride)
        w[i] = make_float4(1.f, 2.f, 3.f, (float)i);
}
