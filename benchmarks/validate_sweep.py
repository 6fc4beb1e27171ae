"""Device side of the cross-check (docs/validation.md): measure the sweep under Nsight Compute.

    python3 benchmarks/validate_sweep.py OUTDIR [--part probes|writeback|mix|reread|reuse|reuse2|geometry|idle|group|ramp|flash|naive|big|extra|long|grids|all] [--repeat K] [--quick]

Writes OUTDIR/measured_<part>.json (iosim.measure.Run) and OUTDIR/ncu_<part>.csv (ncu's raw CSV). ``--repeat K``
measures the whole list K times over (the list again after its end, not each config K times in a row); the
comparison takes each config's median and reports the spread. The simulation side runs on any CPU:
benchmarks/validate_compare.py.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from iosim.measure import Config, measure

MiB = 1 << 20


def sweep(part: str) -> list[Config]:
    c: list[Config] = []
    if part in ("probes", "all"):
        c += [Config("copy", nbytes=64 * MiB), Config("copy", nbytes=256 * MiB)]
        c += [Config("l2probe", nbytes=s * MiB) for s in (8, 16, 24, 32, 40, 48, 56, 64, 80)]
        c += [Config("l2bw", nbytes=8 * MiB)]
    if part in ("writeback", "all"):  # how dirty lines leave L2: the L2 model's write-back input
        W = "l2write"
        c += [Config(W, nbytes=s * MiB) for s in (8, 16, 24, 32, 40, 48, 64, 96)]  # writes only
        for shared in (False, True):  # 8 MiB dirty, then reads of other data, one SM / every SM per line
            c += [
                Config(W, nbytes=8 * MiB, read_bytes=r * MiB, read_shared=shared)
                for r in (8, 16, 24, 32, 40, 48, 64)
            ]
        c += [Config(W, nbytes=s * MiB, spin_us=2000) for s in (8, 32)]  # idle: does L2 clean on its own?
        c += [Config(W, nbytes=32 * MiB, read_bytes=r * MiB) for r in (8, 16, 32)]
    if part in ("mix", "all"):  # run 10: reads and writes side by side (as flash2's Q and O): what room a dirty line takes
        W = "l2write"
        c += [Config(W, nbytes=s * MiB, read_bytes=s * MiB, interleave=True) for s in (16, 24, 32, 40, 48)]
        c += [Config(W, nbytes=w * MiB, read_bytes=r * MiB, interleave=True) for w, r in ((16, 32), (24, 48))]
        c += [Config(W, nbytes=w * MiB, read_bytes=r * MiB, interleave=True) for w, r in ((32, 16), (48, 24))]
    if part in ("reread", "all"):  # run 13: written, then read back: do lines L2 wrote back stay in it, clean?
        W = "l2write"
        c += [Config(W, nbytes=s * MiB, read_written=True) for s in (16, 24, 28, 30, 32, 34, 36, 38, 40, 44, 48)]
    # run 15: do lines read more often, or by every SM, stay in L2 longer than an LRU keeps them?
    if part in ("reuse", "all"):
        R = "l2reuse"
        for shared, k in ((False, 1), (False, 4), (True, 1)):
            c += [
                Config(R, nbytes=16 * MiB, read_bytes=r * MiB, read_shared=shared, hot_reps=k)
                for r in (12, 16, 20, 24, 28, 32, 36, 40)
            ]
    # run 16: the same probe read twice with no other data (against l2probe), read twice, and with an 8 MiB buffer
    if part in ("reuse2", "all"):
        R = "l2reuse"
        c += [Config(R, nbytes=s * MiB) for s in (32, 40, 44, 48, 56)] + [Config("l2probe", nbytes=44 * MiB)]
        c += [Config(R, nbytes=16 * MiB, read_bytes=r * MiB, hot_reps=2) for r in (20, 24, 28, 32)]
        for k in (1, 4):
            c += [Config(R, nbytes=8 * MiB, read_bytes=r * MiB, hot_reps=k) for r in (28, 32, 36, 40)]
    # run 17: the read probe's soft edge in other grids: does it move with the blocks and threads per SM?
    if part in ("geometry", "all"):
        for bps, threads in ((1, 256), (2, 128), (2, 256), (8, 256), (1, 1024)):
            c += [
                Config("l2probe", nbytes=s * MiB, blocks_per_sm=bps, threads=threads) for s in (36, 40, 44, 48, 52)
            ]
    # run 18: do clean lines leave L2 with time? The reuse kernel idling between the two reads of its buffer
    if part in ("idle", "all"):
        R = "l2reuse"
        c += [Config(R, nbytes=a * MiB, spin_us=t) for a in (16, 32, 40) for t in (0, 50, 200, 1000, 4000)]
        c += [Config(R, nbytes=16 * MiB, read_bytes=24 * MiB, spin_us=t) for t in (0, 200, 1000)]
        c += [Config("l2write", nbytes=32 * MiB, spin_us=t) for t in (0, 1000)]  # dirty lines, as run 3 did
    # run 19: lines read by groups of SMs, as flash2's K/V by the blocks of one head: what room do they take?
    if part in ("group", "all"):
        for g in (1, 2, 4, 12, 33, 132):
            c += [Config("l2reuse", nbytes=16 * MiB, read_bytes=r * MiB, read_group=g) for r in (12, 16, 20, 24, 28)]
    if part in ("ramp", "all"):  # run 14: the write-back outliers' neighbours, head count by head count
        F = "flash2"
        c += [Config(F, seq_len=2048, heads=h, head_dim=128) for h in (16, 20, 24, 28, 32, 36, 40, 48, 64)]
        c += [Config(F, seq_len=4096, heads=h, kv_heads=h // 4, head_dim=128) for h in (16, 24, 32, 40, 48)]
        c += [Config(F, seq_len=4096, heads=h, head_dim=64) for h in (16, 24, 32, 40, 48)]
        c += [Config(F, seq_len=2048, heads=h, head_dim=128, block_q=64, block_kv=64) for h in (24, 32, 40)]
    if part in ("flash", "all"):
        F = "flash2"
        c += [
            Config(F, seq_len=n, heads=32, head_dim=128) for n in (512, 1024, 2048, 4096, 8192, 16384, 32768)
        ]
        c += [Config(F, seq_len=n, heads=32, head_dim=64) for n in (1024, 4096, 16384)]
        c += [Config(F, seq_len=n, heads=32, head_dim=128, causal=True) for n in (1024, 4096, 16384)]
        c += [Config(F, seq_len=4096, heads=32, head_dim=64, causal=True)]
        c += [Config(F, seq_len=n, heads=32, kv_heads=8, head_dim=128) for n in (4096, 16384)]
        c += [Config(F, seq_len=8192, heads=32, kv_heads=8, head_dim=128, causal=True)]
        c += [Config(F, seq_len=32768, heads=1, head_dim=128), Config(F, seq_len=8192, heads=8, head_dim=128)]
        c += [Config(F, seq_len=n, heads=32, head_dim=128, dtype="bf16") for n in (4096, 16384)]
        c += [Config(F, seq_len=8192, heads=32, head_dim=128, block_q=64, block_kv=64)]
        c += [Config(F, seq_len=8192, heads=16, batch=2, head_dim=128)]
        S = "sdpa-flash"
        c += [Config(S, seq_len=n, heads=32, head_dim=128) for n in (1024, 4096, 16384)]
        c += [
            Config(S, seq_len=4096, heads=32, head_dim=64),
            Config(S, seq_len=4096, heads=32, head_dim=128, causal=True),
        ]
        c += [Config(S, seq_len=4096, heads=32, kv_heads=8, head_dim=128)]
        c += [Config("sdpa-cudnn", seq_len=4096, heads=32, head_dim=128)]
    if part in ("big", "all"):  # K/V of one head near or above the L2 size
        c += [
            Config("flash2", seq_len=65536, heads=32, head_dim=128),
            Config("flash2", seq_len=131072, heads=8, head_dim=128),
        ]
    if part in ("extra", "all"):  # run 5: axes the earlier runs left out, measured after the model was set
        F, N_ = "flash2", "naive"
        c += [Config(F, seq_len=131072, heads=32, head_dim=128)]  # the speed case, measured
        c += [Config(F, seq_len=16384, heads=4, head_dim=128), Config(F, seq_len=4096, heads=16, head_dim=64)]
        c += [Config(F, seq_len=8192, heads=32, head_dim=128, dtype="bf16", causal=True)]
        c += [Config(F, seq_len=32768, heads=16, kv_heads=2, head_dim=64, causal=True)]
        c += [Config(F, seq_len=2048, heads=2, head_dim=128)]
        c += [Config(N_, seq_len=n, heads=8, head_dim=64, dtype="bf16") for n in (1024, 4096)]
        c += [Config(N_, seq_len=2048, heads=4, head_dim=128, dtype="bf16", causal=True)]
        c += [Config(N_, seq_len=8192, heads=2, kv_heads=1, head_dim=64)]
    if part in ("long", "all"):  # N=131072 between H=8 (big) and H=32 (extra): where does the model part ways?
        c += [Config("flash2", seq_len=131072, heads=h, head_dim=128) for h in (12, 16, 24)]
    if part == "grids":  # run 6: the long grids again, on one GPU with its block timelines (validate_lag.py)
        c += [Config("flash2", seq_len=131072, heads=h, head_dim=128) for h in (8, 12, 16, 24, 32)]
        c += [Config("flash2", seq_len=n, heads=32, head_dim=128) for n in (32768, 65536)]
    if part in ("naive", "all"):
        N_ = "naive"
        c += [Config(N_, seq_len=n, heads=8, head_dim=64) for n in (512, 1024, 2048, 4096)]
        c += [Config(N_, seq_len=n, heads=8, head_dim=128) for n in (1024, 4096)]
        c += [Config(N_, seq_len=2048, heads=8, head_dim=64, causal=True)]
        c += [Config(N_, seq_len=2048, heads=8, kv_heads=2, head_dim=64)]
        c += [Config(N_, seq_len=16384, heads=1, head_dim=64)]
    return c


def main() -> None:
    out = Path(sys.argv[1])
    part = sys.argv[sys.argv.index("--part") + 1] if "--part" in sys.argv else "all"
    out.mkdir(parents=True, exist_ok=True)
    cfgs = sweep(part)
    if "--quick" in sys.argv:  # a smoke test of the harness: one of each kind
        cfgs = [
            Config("copy", nbytes=64 * MiB),
            Config("l2probe", nbytes=32 * MiB),
            Config("l2bw", nbytes=8 * MiB),
            Config("flash2", seq_len=1024, heads=32, head_dim=128),
            Config("naive", seq_len=1024, heads=8, head_dim=64),
            Config("sdpa-flash", seq_len=1024, heads=32, head_dim=128),
            Config("sdpa-cudnn", seq_len=1024, heads=32, head_dim=128),
        ]
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    cfgs = cfgs * repeat
    t0 = time.time()
    run = measure(cfgs, workdir=str(out / f"work_{part}"), keep_csv=str(out / f"ncu_{part}.csv"))
    data = run.to_json()
    data["sweep_configs"] = [asdict(x) for x in cfgs]
    data["wall_s"] = time.time() - t0
    data["repeat"] = repeat
    (out / f"measured_{part}.json").write_text(json.dumps(data, indent=1))
    for e in run.configs:
        c, m = e["config"], e.get("measured") or {}
        print(
            c["kind"],
            c["seq_len"],
            c["heads"],
            c["kv_heads"],
            c["head_dim"],
            c["dtype"],
            c["causal"],
            m.get("dram_read_bytes"),
            m.get("dram_write_bytes"),
            m.get("l2_read_bytes"),
            m.get("l2_write_bytes"),
            "replayed",
            m.get("dram_read_bytes_replayed"),
            m.get("dram_write_bytes_replayed"),
            e.get("time_ms"),
            e.get("error", ""),
            flush=True,
        )
    print(f"{part}: {len(cfgs)} configs in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
