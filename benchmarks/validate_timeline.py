"""Device side: the block timeline of iosim's flash2 kernel (each thread block's SM, start and end).

    python3 benchmarks/validate_timeline.py OUTDIR [SPEC ...]
    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
        python3 benchmarks/validate_timeline.py OUTDIR --repeat K SPEC ...   # timelines paired with DRAM bytes

SPEC is ``N:H`` (fp16, d=128, no mask) with optional fields after further colons: ``H/KV`` grouped-query heads,
``dD`` head dim, ``causal``, ``bf16``; e.g. ``4096:32/8``, ``4096:32:d64:causal``, ``16384:32:bf16``.

For each config: a warm-up launch, then one launch of the -DIOSIM_BLOCK_TRACE build (iosim.gpu.attention's
``block_trace``), saved as OUTDIR/timeline_<name>.npz (start_ns, end_ns, sm: one entry per block in linear block
order; grid; config; device: which GPU, with its UUID), and the CUDA-event time of the traced and plain kernels
(median of 5), to show the trace costs nothing measurable. The L2 model's drift input is read from these
(docs/validation.md). SPECs replace the default list; their summary goes to timeline_summary_more.json.

``--repeat K``: K traced launches of each config and nothing else inside the profiler range (compilation and the
first launch outside it), each launch's timeline saved as timeline_<name>_r<i>.npz. Run under ncu (as above: one
pass, L2 flushed before each kernel), the i-th profiled launch of a config is the i-th timeline: the DRAM bytes of
the very run whose schedule the timeline records (benchmarks/validate_lag.py replays them through the L2 model);
OUTDIR/order.json names the problem of every profiled launch, in order.
Each launch's output is poisoned (NaN) before it and checked against a float64 reference of a few rows after it.
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


def parse_spec(spec: str) -> dict:
    """``N:H[/KV][:dD][:causal][:bf16]`` (see the module docstring) -> the config of a timeline."""
    parts = spec.split(":")
    try:
        n = int(parts[0])
        h, _, kv = parts[1].partition("/")
        cfg = {"seq_len": n, "heads": int(h), "kv_heads": int(kv or h), "head_dim": 128, "causal": False}
        cfg["dtype"] = "fp16"
        for f in parts[2:]:
            if f == "causal":
                cfg["causal"] = True
            elif f in ("bf16", "fp16"):
                cfg["dtype"] = f
            elif f.startswith("d"):
                cfg["head_dim"] = int(f[1:])
            else:
                raise ValueError(f)
    except (ValueError, IndexError):
        raise SystemExit(f"{spec!r}: expected N:H[/KV][:dD][:causal][:bf16], e.g. 4096:32/8:d64:causal") from None
    if cfg["heads"] % cfg["kv_heads"]:
        raise SystemExit(f"{spec!r}: heads must be a multiple of kv heads")
    return cfg


def spec_name(cfg: dict) -> str:
    """File-name stem of a config: N<n>_H<h>[-<kv>]_d<d>[_causal][_bf16] (the old names where the fields agree)."""
    kv = f"-{cfg['kv_heads']}" if cfg.get("kv_heads", cfg["heads"]) != cfg["heads"] else ""
    return (
        f"N{cfg['seq_len']}_H{cfg['heads']}{kv}_d{cfg['head_dim']}"
        + ("_causal" if cfg["causal"] else "")
        + ("_bf16" if cfg.get("dtype", "fp16") == "bf16" else "")
    )


def inputs(cfg: dict, seed: int = 7):
    """Q, K, V on the GPU, (1, N, H or KV, d), in the config's dtype."""
    rng = np.random.default_rng(seed)
    dt = np.float16
    if cfg["dtype"] == "bf16":
        import ml_dtypes

        dt = ml_dtypes.bfloat16
    n, d = cfg["seq_len"], cfg["head_dim"]
    shapes = ((1, n, cfg["heads"], d), (1, n, cfg["kv_heads"], d), (1, n, cfg["kv_heads"], d))
    return tuple(cp.asarray(rng.standard_normal(s, dtype=np.float32).astype(dt)) for s in shapes)


def check_rows(q, k, v, o, causal: bool, rows=(0, 1, -1)) -> float:
    """Max |O - reference| over a few query rows of head 0, against float64 (the timeline is of a correct run)."""
    hq, hk, hv, ho = (np.asarray(x[0, :, 0].get(), dtype=np.float64) for x in (q, k, v, o))
    n, d = hq.shape
    worst = 0.0
    for r in rows:
        r = r % n
        s = hk @ hq[r] / np.sqrt(d)
        if causal:
            s[r + 1 :] = -np.inf
        p = np.exp(s - s.max())
        ref = (p / p.sum()) @ hv
        worst = max(worst, float(np.abs(ho[r] - ref).max()))
    return worst


def trace_one(out: Path, n: int, h: int, d: int, causal: bool, kv: int | None = None, dtype: str = "fp16") -> dict:
    cfg = {"seq_len": n, "heads": h, "kv_heads": kv or h, "head_dim": d, "causal": causal, "dtype": dtype}
    q, k, v = inputs(cfg)
    gpu.attention(q, k, v, causal=causal)
    launch = gpu.last_launch()
    grid = launch.launches[0].grid
    nblk = grid[0] * grid[1] * grid[2]
    buf = cp.zeros(4 * nblk, dtype=cp.uint64)
    t_plain = event_median_ms(lambda: gpu.attention(q, k, v, causal=causal), cp, 5)
    t_traced = event_median_ms(lambda: gpu.attention(q, k, v, causal=causal, block_trace=buf), cp, 5)
    rec = buf.reshape(nblk, 4).get()
    if (rec[:, 1] == 0).any():
        raise RuntimeError(f"N={n}: {(rec[:, 1] == 0).sum()} blocks left no record")
    name = spec_name(cfg)
    save(out / f"timeline_{name}.npz", rec, grid, {**cfg, **launch.tiles})
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


def paired(out: Path, cfg: dict, repeat: int) -> None:
    """``repeat`` traced launches inside the profiler range (see the module docstring)."""
    q, k, v = inputs(cfg)
    causal = cfg["causal"]
    o = gpu.attention(q, k, v, causal=causal)
    launch = gpu.last_launch()
    grid = launch.launches[0].grid
    nblk = grid[0] * grid[1] * grid[2]
    bufs = [cp.zeros(4 * nblk, dtype=cp.uint64) for _ in range(repeat)]
    outs = [cp.empty_like(o) for _ in range(repeat)]
    gpu.attention(q, k, v, causal=causal, block_trace=bufs[0])  # compile the traced build outside the range
    for b, x in zip(bufs, outs, strict=True):
        b.fill(0)
        x.view(cp.uint16).fill(0xFFFF)  # poisoned (NaN in fp16 and bf16): a launch that writes nothing fails
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    for b, x in zip(bufs, outs, strict=True):
        gpu.attention(q, k, v, causal=causal, block_trace=b, out=x)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    name = spec_name(cfg)
    tol = {"fp16": 2e-3, "bf16": 2e-2}[cfg["dtype"]]
    for i, (b, x) in enumerate(zip(bufs, outs, strict=True)):
        rec = b.reshape(nblk, 4).get()
        if (rec[:, 1] == 0).any():
            raise RuntimeError(f"{name} launch {i}: {(rec[:, 1] == 0).sum()} blocks left no record")
        err = check_rows(q, k, v, x, causal)
        if not err <= tol:
            raise RuntimeError(f"{name} launch {i}: O differs from the float64 reference by {err:.3g}")
        save(out / f"timeline_{name}_r{i}.npz", rec, grid, {**cfg, **launch.tiles, "launch": i})
    print(f"{name}: {repeat} traced launches saved, O checked", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    if "--repeat" in args:
        i = args.index("--repeat")
        repeat = int(args[i + 1])
        specs = [parse_spec(a) for a in args[:i] + args[i + 2 :]]
        # the problems in launch order: ncu's CSV lists launches in this order (grids alone can be ambiguous)
        (out / "order.json").write_text(json.dumps([spec_name(c) for c in specs for _ in range(repeat)]))
        for c in specs:
            paired(out, c, repeat)
            cp.get_default_memory_pool().free_all_blocks()
        return
    specs = [parse_spec(a) for a in args]
    configs = [(c["seq_len"], c["heads"], c["head_dim"], c["causal"], c["kv_heads"], c["dtype"]) for c in specs]
    summary = []
    for cfg in configs or CONFIGS:
        summary.append(trace_one(out, *cfg))
        print(json.dumps(summary[-1]), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    name = "timeline_summary_more.json" if specs else "timeline_summary.json"
    (out / name).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
