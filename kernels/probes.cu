// Calibration probes of the L2 model (iosim.measure, run by iosim.calibrate): what they measure becomes the
// profile's l2.room (private, shared, dirty) and l2.dirty_at_start. Plain extern "C" kernels, no templates.
//
// iosim_marker  launched before each measured call with grid = call index + 1: ncu's launches are attributed
//               to their call by it, whatever kernels a library launches in between.
// iosim_l2probe the read probe: a buffer read `reps` times through L2 (ld.global.cg), grid-stride. Past the
//               room L2 gives read lines, the second pass reads from DRAM again (room.private); the DRAM bytes
//               it writes, having written nothing, are the dirty lines present at the start (dirty_at_start).
// iosim_l2write the write probe, one block per SM (all co-resident): phase 1 writes w (dirty lines), a grid
//               barrier, phase 2 reads r, each float4 by one block (mode 0) or the whole of r by every block in
//               the same order (mode 1, as K/V in attention: room.shared). Mode 2 interleaves: one grid-stride
//               loop over both, each step reads r[i] then writes w[i], as flash2's blocks read Q and write O.
//               The DRAM writes are the dirty bytes the reads pushed out of L2 (room.dirty).

extern "C" __global__ void iosim_marker(int* p) {
    if (p && threadIdx.x == 0 && blockIdx.x == 0) p[0] = 1;
}

extern "C" __global__ void iosim_l2probe(const float4* __restrict__ a, float* out, long long n, int reps) {
    float s = 0.f;
    for (int r = 0; r < reps; ++r)
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x) {
            float4 x = __ldcg(a + i);  // L2 only: L1 must not serve the second pass
            s += x.x + x.y + x.z + x.w;
        }
    if (s == 12345.678f) out[0] = s;  // keeps the loads; never true for the data used
}

// all blocks of the grid (one per SM, all co-resident) past this point before any goes on; bar starts at 0
__device__ void iosim_grid_barrier(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        while (atomicAdd(bar, 0u) < gridDim.x) {}
    }
    __syncthreads();
}

extern "C" __global__ void iosim_l2write(float4* w, long long nw, const float4* __restrict__ r, long long nr,
                                         int mode, unsigned* bar, float* out) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long nthreads = (long long)gridDim.x * blockDim.x;
    float s = 0.f;
    if (mode == 2) {  // interleaved: read r[i], then write w[i], in the same step
        for (long long i = tid; i < nw || i < nr; i += nthreads) {
            if (i < nr) {
                float4 x = __ldcg(r + i);
                s += x.x + x.y + x.z + x.w;
            }
            if (i < nw) w[i] = make_float4(1.f, 2.f, s, (float)i);
        }
    } else {
        for (long long i = tid; i < nw; i += nthreads) w[i] = make_float4(1.f, 2.f, 3.f, (float)i);
        iosim_grid_barrier(bar);
        const bool every = mode == 1;  // shared: every block reads all of r, in the same order
        const long long start = every ? threadIdx.x : tid, step = every ? blockDim.x : nthreads;
        for (long long i = start; i < nr; i += step) {
            float4 x = __ldcg(r + i);
            s += x.x + x.y + x.z + x.w;
        }
    }
    if (s == 12345.678f) out[0] = s;
}
