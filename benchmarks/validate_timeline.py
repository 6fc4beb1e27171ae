"""Device side: the block timeline of iosim's flash2 kernel (each thread block's SM, start and end).

    python3 benchmarks/validate_timeline.py OUTDIR [N:H ...]
    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
        python3 benchmarks/validate_timeline.py OUTDIR --repeat K N:H ...   # timelines paired with DRAM bytes

For each config: a warm-up launch, then one launch of the -DIOSIM_BLOCK_TRACE build (iosim.gpu.attention's
``block_trace``), saved as OUTDIR/timeline_<name>.npz (start_ns, end_ns, sm: one entry per block in linear block
order; grid; config; device: which GPU, with its UUID), and the CUDA-event time of the traced and plain kernels
(median of 5), to show the trace costs nothing measurable. The L2 model's drift input is read from these (docs/validation.md). ``N:H`` pairs
(d=128, not causal) replace the default list; their summary goes to timeline_summary_more.json.

``--repeat K``: K traced launches of each config and nothing else inside the profiler range (compilation and the
first launch outside it), each launch's timeline saved as timeline_<name>_r<i>.npz. Run under ncu (as above: one
pass, L2 flushed before each kernel), the i-th profiled launch of a config is the i-th timeline: the DRAM bytes of
the very run whose schedule the timeline records (benchmarks/validate_lag.py replays them through the L2 model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

from iosim import gpu
from iosim.measure import _device_info, event_median_ms

CONFIGS = [  # (seq_len, heads, head_dim, causal)
    (4096, 32, 128, False),
    (16384, 32, 128, False),
    (32768, 32, 128, False),
    (65536, 32, 128, False),
    (131072, 8, 128, False),
    (16384, 32, 128, True),
]


def trace_one(out: Path, n: int, h: int, d: int, causal: bool) -> dict:
    rng = cp.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, n, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    gpu.attention(q, k, v, causal=causal)
    grid = gpu.last_launch().launches[0].grid
    nblk = grid[0] * grid[1] * grid[2]
    buf = cp.zeros(4 * nblk, dtype=cp.uint64)
    t_plain = event_median_ms(lambda: gpu.attention(q, k, v, causal=causal), cp, 5)
    t_traced = event_median_ms(lambda: gpu.attention(q, k, v, causal=causal, block_trace=buf), cp, 5)
    rec = buf.reshape(nblk, 4).get()
    if (rec[:, 1] == 0).any():
        raise RuntimeError(f"N={n}: {(rec[:, 1] == 0).sum()} blocks left no record")
    name = f"N{n}_H{h}_d{d}{'_causal' if causal else ''}"
    cfg = {"seq_len": n, "heads": h, "head_dim": d, "causal": causal, "dtype": "fp16"}
    save(out / f"timeline_{name}.npz", rec, grid, cfg)
    dur = (rec[:, 1] - rec[:, 0]) / 1e3
    return {
        "name": name,
        "device": _device_info(cp).get("uuid"),
        "blocks": nblk,
        "sms": len(np.unique(rec[:, 2])),
        "plain_ms": t_plain,
        "traced_ms": t_traced,
        "span_ms": (rec[:, 1].max() - rec[:, 0].min()) / 1e6,
        "block_us_median": float(np.median(dur)),
        "block_us_cv": float(dur.std() / dur.mean()),
    }


def save(path: Path, rec: np.ndarray, grid, config: dict) -> None:
    t0 = int(rec[:, 0].min())
    np.savez_compressed(
        path,
        start_ns=(rec[:, 0] - t0).astype(np.int64),
        end_ns=(rec[:, 1] - t0).astype(np.int64),
        sm=rec[:, 2].astype(np.int32),
        grid=np.array(grid),
        config=json.dumps(config),
        device=json.dumps(_device_info(cp)),
    )


def paired(out: Path, n: int, h: int, repeat: int) -> None:
    """``repeat`` traced launches inside the profiler range (see the module docstring)."""
    rng = cp.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, n, h, 128), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    gpu.attention(q, k, v)
    grid = gpu.last_launch().launches[0].grid
    nblk = grid[0] * grid[1] * grid[2]
    bufs = [cp.zeros(4 * nblk, dtype=cp.uint64) for _ in range(repeat)]
    gpu.attention(q, k, v, block_trace=bufs[0])  # compile the traced build outside the range
    for b in bufs:
        b.fill(0)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    for b in bufs:
        gpu.attention(q, k, v, block_trace=b)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    cfg = {"seq_len": n, "heads": h, "head_dim": 128, "causal": False, "dtype": "fp16"}
    for i, b in enumerate(bufs):
        rec = b.reshape(nblk, 4).get()
        if (rec[:, 1] == 0).any():
            raise RuntimeError(f"N={n} H={h} launch {i}: {(rec[:, 1] == 0).sum()} blocks left no record")
        save(out / f"timeline_N{n}_H{h}_d128_r{i}.npz", rec, grid, {**cfg, "launch": i})
    print(f"N={n} H={h}: {repeat} traced launches saved", flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    if "--repeat" in args:
        i = args.index("--repeat")
        repeat = int(args[i + 1])
        for a in args[:i] + args[i + 2 :]:
            paired(out, *map(int, a.split(":")), repeat)
            cp.get_default_memory_pool().free_all_blocks()
        return
    pairs = [tuple(map(int, a.split(":"))) for a in args]
    configs = [(n, h, 128, False) for n, h in pairs] or CONFIGS
    summary = []
    for cfg in configs:
        summary.append(trace_one(out, *cfg))
        print(json.dumps(summary[-1]), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    name = "timeline_summary_more.json" if pairs else "timeline_summary.json"
    (out / name).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
