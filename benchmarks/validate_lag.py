"""Paired launches (docs/validation.md, "One launch, its timeline and its DRAM bytes"): is the L2 model wrong, or
the schedule it is given?

    python benchmarks/validate_lag.py DIR
    python benchmarks/validate_lag.py --patterns TIMELINE.npz ...

DIR holds what one device call of ``validate_timeline.py --repeat K`` under ncu left (the device commands are in
docs/validation.md): ``timeline_<problem>_r<i>.npz`` (the block timeline of launch i of that problem; any
``validate_timeline.py`` SPEC: grouped-query, d=64, causal, bf16), ``pair_ncu.csv`` (ncu's DRAM bytes of the
same launches, in launch order) and ``order.json`` (the problem of each launch, in order). For every launch it
prints the GPU's DRAM read and write bytes beside the model's: the model's own schedule (block drift by age, the
default), and the launch's own timeline replayed
(``simulate_l2(block_rate=timeline_rates(...))``; under a causal mask each block's rate counts its own accesses)
through the one-pool L2 and through the two-partition L2; then both schedules through the soft-edge variant
(``miss_curve``: the read probe's measured miss curve in place of the LRU's hard edge, as
``validate_compare.py --soft-edge``). About 15 minutes for run 7 (long grids), seconds for short kernels. The last
lines: how far apart the launches of one problem are, and the per-SM speed pattern of each launch against the first
launch's (correlation), to show whether the SMs' order is the GPU's own.

``--patterns``: the per-SM speed pattern of each timeline given (any run), their correlations and the GPU each ran
on (its UUID where the timeline recorded one): patterns from one GPU agree, patterns from two GPUs need not.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_l2_inputs import sm_starts
from validate_compare import SOFT_EDGE_ROOM, probe_curve

from iosim import l2
from iosim.measure import parse_ncu_csv
from iosim.problem import AttentionProblem
from iosim.profile import get_profile
from iosim.schedules import Tiles

PROFILE = Path(__file__).resolve().parents[1] / "docs/validation/h200-sxm-141gb-measured.yaml"
TILES = Tiles(128, 32)  # the tiles of timelines that did not record theirs (d=128, the kernel's default)
RAW = PROFILE.parent / "raw"  # the read probe (measured_probes.json) gives the soft edge's miss curve
MODELS = ("default", "replay", "replay 2p", "soft", "replay soft")


def sm_speed(z) -> np.ndarray | None:
    """Each SM's time per block (slope of its blocks' start times), relative to the mean over SMs; None where some
    SM ran fewer than two blocks."""
    st = sm_starts(z).astype(np.float64)
    if st.shape[1] < 2:
        return None
    j = np.arange(st.shape[1])
    slope = np.array([np.polyfit(j, row, 1)[0] for row in st])
    return slope / slope.mean() - 1


def patterns(files: list[Path]) -> None:
    sp = [sm_speed(np.load(f)) for f in files]
    short = [f.name for f, x in zip(files, sp, strict=True) if x is None]
    if short:
        raise SystemExit(f"too few blocks per SM for a speed pattern: {', '.join(short)}")
    for i, f in enumerate(files):
        z = np.load(f)
        dev = json.loads(str(z["device"])).get("uuid", "?")[:12] if "device" in z.files else "not recorded"
        print(f"{i:2d} {f.parent.name}/{f.stem} (GPU {dev}): SM speed std {100 * sp[i].std():.3f}%")
    print("correlation: " + " ".join(f"{i:>5d}" for i in range(len(files))))
    for i in range(len(files)):
        print(f"{i:>11d}  " + " ".join(f"{np.corrcoef(sp[i], sp[j])[0, 1]:+.2f}" for j in range(len(files))))


def main() -> None:
    main_args(sys.argv[1:])


def main_args(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    if argv[0] == "--patterns":
        patterns([Path(a) for a in argv[1:]])
        return
    d = Path(argv[0])
    launches = [x for x in parse_ncu_csv((d / "pair_ncu.csv").read_text()) if "flash_fwd" in x["kernel"]]
    files = sorted(
        d.glob("timeline_N*_r*.npz"),
        key=lambda f: (f.stem.rsplit("_r", 1)[0], int(f.stem.rsplit("_r", 1)[1])),
    )
    by_cfg: dict[str, list[Path]] = {}
    for f in files:
        by_cfg.setdefault(f.stem.rsplit("_r", 1)[0].removeprefix("timeline_"), []).append(f)
    if len(launches) != len(files):
        raise SystemExit(
            f"{d}: ncu profiled {len(launches)} flash launches, but there are {len(files)} timelines"
        )
    prof = get_profile(str(PROFILE))
    rows, li = [], 0
    device = None
    # the model's own schedule (hard and soft edge): one result per problem
    default: dict[str, tuple] = {}
    soft = {"miss_curve": probe_curve(RAW, SOFT_EDGE_ROOM[0]), "room": SOFT_EDGE_ROOM, "partitions": False}
    for cfg in _launch_order(d, by_cfg, launches):
        for f in by_cfg[cfg]:
            z = np.load(f)
            c = json.loads(str(z["config"]))
            device = json.loads(str(z["device"])).get("uuid") if "device" in z.files else device
            lau = launches[li]
            li += 1
            if _grid(lau) != tuple(int(x) for x in z["grid"]):
                raise SystemExit(
                    f"{f.name}: ncu launch {lau['id']} has grid {lau['grid']}, the timeline {z['grid']}"
                )
            p, tiles = _problem(c)
            work = l2.block_accesses("flash2", p, tiles) if p.causal else None
            rates = l2.timeline_rates(z["start_ns"], z["end_ns"], work)
            if cfg not in default:
                default[cfg] = (
                    l2.simulate_l2("flash2", p, tiles, prof),
                    l2.simulate_l2("flash2", p, tiles, prof, **soft),
                )
            model = {
                "default": default[cfg][0],
                "replay": l2.simulate_l2("flash2", p, tiles, prof, block_rate=rates, partitions=False),
                "replay 2p": l2.simulate_l2("flash2", p, tiles, prof, block_rate=rates, partitions=True),
                "soft": default[cfg][1],
                "replay soft": l2.simulate_l2("flash2", p, tiles, prof, block_rate=rates, **soft),
            }
            meas = (lau["metrics"]["dram__bytes_read.sum"], lau["metrics"].get("dram__bytes_write.sum"))
            rows.append((cfg, f.stem.rsplit("_r", 1)[1], meas, model, z))
            print(
                f"{cfg} launch {rows[-1][1]}: measured read {meas[0] / 1e9:7.3f} GB | "
                + " | ".join(f"{k} {_err(v.read_bytes, meas[0])}" for k, v in model.items())
                + (
                    f"\n{' ' * len(cfg)}          measured write {meas[1] / 1e6:8.2f} MB | "
                    + " | ".join(f"{k} {_err(v.write_bytes, meas[1])}" for k, v in model.items())
                    if meas[1] is not None
                    else ""
                ),
                flush=True,
            )
    print(f"\nGPU {device}")
    for what, i, unit in (("read", 0, 1e9), ("write", 1, 1e6)):
        if any(r[2][i] is None for r in rows):
            continue
        u = "GB" if unit == 1e9 else "MB"
        print(
            f"\n| problem | launches | measured {what} ({u}) | default model | replay (one pool) "
            "| replay (two partitions) | soft edge | replay (soft edge) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for cfg in dict.fromkeys(r[0] for r in rows):
            rs = [r for r in rows if r[0] == cfg]
            meas = ", ".join(f"{r[2][i] / unit:.2f}" for r in rs)
            print(f"| {cfg} | {len(rs)} | {meas} | " + " | ".join(_span(rs, k, i) for k in MODELS) + " |")
    print(
        "\nper-SM speed pattern of each launch against the problem's first launch (correlation), spread (std):"
    )
    for cfg in dict.fromkeys(r[0] for r in rows):
        rs = [r for r in rows if r[0] == cfg]
        base = sm_speed(rs[0][4])
        line = []
        for r in rs:
            sp = sm_speed(r[4])
            if base is None or sp is None:
                line.append("too few blocks per SM")
                break
            line.append(f"{np.corrcoef(base, sp)[0, 1]:+.2f} ({100 * sp.std():.3f}%)")
        print(f"  {cfg}: " + ", ".join(line))


def _problem(c: dict) -> tuple[AttentionProblem, Tiles]:
    """The problem and tiles a timeline recorded (older timelines: fp16, d=128, no mask, 128x32)."""
    p = AttentionProblem.make(
        heads=c["heads"],
        kv_heads=c.get("kv_heads", c["heads"]),
        seq_len=c["seq_len"],
        head_dim=c["head_dim"],
        dtype=c.get("dtype", "fp16"),
        causal=c.get("causal", False),
    )
    return p, Tiles(c.get("block_q", TILES.block_q), c.get("block_kv", TILES.block_kv))


def _err(model: int, meas: int) -> str:
    if meas == 0:
        return f"{model:,} B (measured 0)"
    return f"{100 * (model / meas - 1):+6.1f}%"


def _span(rs, key: str, i: int = 0) -> str:
    """Error range of one model over a problem's launches; ``i``: 0 read, 1 write."""
    if any(r[2][i] == 0 for r in rs):
        return "measured 0 B in some launch"
    e = [100 * ((r[3][key].write_bytes if i else r[3][key].read_bytes) / r[2][i] - 1) for r in rs]
    return f"{min(e):+.1f}% to {max(e):+.1f}%"


def _grid(launch: dict) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", launch["grid"]))


def _launch_order(d: Path, by_cfg, launches) -> list[str]:
    """The problems in the order their launches appear in ncu's CSV, K launches each: from ``order.json`` (written
    by validate_timeline.py), else matched by grid, which must then tell the problems apart."""
    f = d / "order.json"
    if f.exists():
        names = json.loads(f.read_text())
        out = list(dict.fromkeys(names))
        for c in out:
            if c not in by_cfg or names.count(c) != len(by_cfg[c]):
                raise SystemExit(f"{f}: {c} launched {names.count(c)} times, {len(by_cfg.get(c, []))} timelines")
        if len(names) != len(launches):
            raise SystemExit(f"{f}: {len(names)} launches named, ncu profiled {len(launches)}")
        return out
    grids = {c: tuple(int(x) for x in np.load(by_cfg[c][0])["grid"]) for c in by_cfg}
    same = [c for c in by_cfg if list(grids.values()).count(grids[c]) > 1]
    if same:
        raise SystemExit(f"{d}: no order.json, and {', '.join(same)} have the same grid: which launch is which?")
    out, i = [], 0
    left = list(by_cfg)
    while i < len(launches) and left:
        g = _grid(launches[i])
        hit = next((c for c in left if grids[c] == g), None)
        if hit is None:
            raise SystemExit(
                f"ncu launch {launches[i]['id']} (grid {launches[i]['grid']}) matches no timeline"
            )
        out.append(hit)
        left.remove(hit)
        i += len(by_cfg[hit])
    return out


if __name__ == "__main__":
    main()
