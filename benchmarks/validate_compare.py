"""Simulation side of the cross-check: measured (docs/validation/raw/measured_*.json) against simulated.

    python benchmarks/validate_compare.py [RAW_DIR] [--device h200] [--soft-edge [--limit] [--placement]
        [--grid-curve RAW2]]

Writes docs/validation/<device>.csv (the issue's columns), docs/validation/<device>-extra.csv (other metrics, time,
the L2 model at the physical capacity), docs/validation/<device>-parity.html, and prints the error tables that
docs/validation.md quotes. Runs on any CPU; the measurements come from benchmarks/validate_sweep.py on the GPU.

What is compared (DESIGN.md section 3):

* ``global`` read/write: the schedule's counts (``iosim.simulate``, closed form) against the bytes the kernel's
  global load/store instructions move (``smsp__sass_data_bytes_mem_global_op_{ld,ldgsts,st}``). The -extra CSV
  also has what leaves the SM (``l1tex__m_xbar2l1tex_read_bytes``, after L1 hits) and what reaches the L2 slices
  (``lts__t_sectors_srcunit_tex_op_read`` x 32, after the L2 request coalescer merges reads of different SMs).
* ``hbm`` read/write: ``iosim.l2.simulate_l2`` (L2 flushed before each kernel, dirty lines left at the end not
  written) against ``dram__bytes_{read,write}.sum`` of the one-pass DRAM profile (iosim.measure; the replayed
  profile's are in the -extra CSV). Where a block timeline of the same problem exists, the -extra CSV also has the
  model with that timeline replayed (``block_rate``).
* time: the roofline with ``hbm`` from the L2 model against the CUDA-event median.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

from iosim import l2
from iosim.problem import AttentionProblem
from iosim.profile import get_profile
from iosim.roofline import predict
from iosim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "docs/validation/h200-sxm-141gb-measured.yaml"
PHYSICAL_L2 = 62_914_560
# Ablations: the model with one measured input taken away (docs/validation.md, "What each input buys")
ONE_POOL_ROOM = (1.3125, 2.125, 2.0)  # private, shared, dirty: the one-pool model's fit on run 10's probes
TWO_PARTITION_ROOM = (
    1.0,
    1.0,
    2.0,
)  # the two-partition model: only the dirty factor (fit on the same probes)
ABLATIONS = {
    "placement": {},  # measured block placement and L2 partitions (raw/topology.json; filled in by main)
    # the two-partition L2 (iosim.l2.partitions) with its own dirty factor (fit_l2_inputs.py --partitions)
    "partitions": {"partitions": True, "room": TWO_PARTITION_ROOM},
    "lockstep": {"block_share": 1.0},  # no block drift
    "plain_room": {
        "room": (1.0, 1.0, 1.0),
        "dirty_at_start": 0,
        "partitions": False,
    },  # LRU of the physical 60 MiB, all lines alike
    "previous": {  # the first model: LRU of the read probe's effective 44.8 MiB, lockstep, nothing dirty at start
        "capacity": 46_978_048,
        "room": (1.0, 1.0, 1.0),
        "dirty_at_start": 0,
        "block_share": 1.0,
        "partitions": False,
    },
}


def measured_topology(raw: Path):
    """The placement measured by benchmarks/validate_topology.py: the first reference's split, the first run of
    each occupancy's dispatch map (every run was identical)."""
    from iosim.profile import SMTopology

    f = raw / "topology.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    return SMTopology(
        l2_partition=d["partition"][0]["split"],
        dispatch={int(k): runs[0]["sm"] for k, runs in d["dispatch"].items()},
        source=f"measured: {f.name}",
    )


FIELDS = (
    "kernel",
    "device",
    "profile",
    "batch",
    "heads",
    "kv_heads",
    "seq_len",
    "kv_len",
    "head_dim",
    "dtype",
    "causal",
    "block_q",
    "block_kv",
    "boundary",
    "direction",
    "simulated_bytes",
    "measured_bytes",
)


def fa2_tiles(name: str) -> tuple[int, int, int]:
    """(d, Br, Bc) from FlashAttention-2's kernel name: Flash_fwd_kernel_traits<d, Br, Bc, warps, ...>."""
    m = re.search(r"Flash_fwd_kernel_traits<(\d+), (\d+), (\d+), (\d+)", name)
    if not m:
        raise ValueError(f"no Flash_fwd_kernel_traits in {name[:120]!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def merge_repeats(entries: list[dict]) -> list[dict]:
    """One entry per config: a sweep run with ``--repeat K`` measured each config K times. Every numeric counter
    and the time become the median over the repeats; ``repeats`` keeps each run's DRAM bytes for the spread."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(json.dumps(e["config"], sort_keys=True), []).append(e)
    out = []
    for runs in groups.values():
        ok = [e for e in runs if not e.get("error") and e.get("measured")]
        e = dict(ok[0] if ok else runs[0])
        if ok:
            m = dict(ok[0]["measured"])
            for key, v in m.items():
                vals = [r["measured"].get(key) for r in ok]
                if isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
                    m[key] = statistics.median(vals)
            e["measured"] = m
            times = [r["time_ms"] for r in ok if r.get("time_ms")]
            e["time_ms"] = statistics.median(times) if times else None
            e["repeats"] = [
                {"hbm_read": r["measured"]["dram_read_bytes"], "hbm_write": r["measured"]["dram_write_bytes"]}
                for r in ok
            ]
        out.append(e)
    return out


SWEEP_PARTS = ("naive", "flash", "big", "extra", "long", "ramp")  # validate_sweep parts of attention kernels


def load(raw: Path, parts=SWEEP_PARTS) -> list[dict]:
    out = []
    for part in parts:
        f = raw / f"measured_{part}.json"
        if f.exists():
            d = json.loads(f.read_text())
            for e in merge_repeats(d["configs"]):
                e["device"] = d["device"]["name"]
                out.append(e)
    return out


def simulate_config(e: dict, prof, **model) -> dict | None:
    """Simulated bytes and time of one measured config; ``model``: options of ``iosim.l2.simulate_l2``."""
    c = e["config"]
    kind = c["kind"]
    if kind not in ("flash2", "naive", "sdpa-flash") or e.get("error") or not e.get("kernels"):
        return None
    p = AttentionProblem.make(
        batch=c["batch"],
        heads=c["heads"],
        kv_heads=c["kv_heads"],
        seq_len=c["seq_len"],
        kv_len=c["kv_len"],
        head_dim=c["head_dim"],
        dtype=c["dtype"],
        causal=c["causal"],
    )
    regs = [k.get("registers_per_thread") for k in e["kernels"]]
    if kind == "flash2":
        t = e["launch"]["tiles"]
        bq, bkv, schedule, variant = t["block_q"], t["block_kv"], "flash2", "iosim"
    elif kind == "naive":
        qk = e["launch"]["tiles"]["qk"]
        bq, bkv, schedule, variant = qk["block_m"], qk["block_n"], "naive", "iosim"
    else:
        _, bq, bkv = fa2_tiles(e["kernels"][0]["kernel"])
        schedule, variant = "flash2", "fa2"
    r = simulate(schedule, p, prof, block_q=bq, block_kv=bkv)
    res = l2.simulate_l2(
        schedule,
        p,
        r.tiles,
        prof,
        variant=variant,
        registers=regs,
        **model,
    )
    hbm = [k.dram_read + k.dram_write for k in res.kernels]
    time = predict(r.counts, hbm, p.dtype, prof)
    return {
        "problem": p,
        "block_q": bq,
        "block_kv": bkv,
        "global_read": r.counts.global_read_bytes,
        "global_write": r.counts.global_write_bytes,
        "hbm_read": res.read_bytes,
        "hbm_write": res.write_bytes,
        "dirty_at_end": sum(k.dirty_at_end for k in res.kernels),
        "time_s": time.predicted_s,
        "resident": [k.resident for k in res.kernels],
        "l2_seconds": res.seconds,
    }


def timeline_block_rate(raw: Path, e: dict):
    """Per-block rates from the block timeline of the same problem (``raw/timeline_N<n>_H<h>_d<d>.npz``, measured
    in another run of benchmarks/validate_timeline.py), for the model to replay; None where there is none. Only
    flash2 (ours) without a mask: its blocks all make the same accesses."""
    c = e["config"]
    if c["kind"] != "flash2" or c["causal"] or c["batch"] != 1 or c["kv_heads"] != c["heads"] or c["block_q"]:
        return None
    f = raw / f"timeline_N{c['seq_len']}_H{c['heads']}_d{c['head_dim']}.npz"
    if not f.exists():
        return None
    z = np.load(f)
    if json.loads(str(z["config"]))["dtype"] != c["dtype"]:
        return None
    return l2.timeline_rates(z["start_ns"], z["end_ns"])


def measured(e: dict) -> dict:
    m = e["measured"]
    return {
        "global_read": (m.get("sass_global_ld_bytes") or 0) + (m.get("sass_global_ldgsts_bytes") or 0),
        "global_write": m.get("sass_global_st_bytes"),
        "hbm_read": m["dram_read_bytes"],
        "hbm_write": m["dram_write_bytes"],
        # the same kernel's DRAM bytes in ncu's replayed profile (with every other counter): not the kernel's alone
        "hbm_read_replayed": m.get("dram_read_bytes_replayed"),
        "hbm_write_replayed": m.get("dram_write_bytes_replayed"),
        "xbar_read": m.get("xbar_read_bytes"),
        "lts_read": m.get("l2_read_bytes"),
        "time_s": (e.get("time_ms") or 0) / 1e3,
    }


def err(sim, meas):
    if meas == 0 and sim == 0:
        return 0.0
    if meas in (None, 0):
        return None
    return (sim - meas) / meas


SOFT_EDGE_ROOM = (
    1.3125,
    2.0,
    2.0,
)  # the stack-distance variant's best factors on the probes (fit_l2_inputs grid)
# --soft-edge --limit: the soft edge with a dirty limit and lines written back ahead of eviction, the best of
# fit_l2_inputs.py docs/validation/raw/run13 --soft-edge (run 13's probes, the read-back ones included)
SOFT_LIMIT_MODEL = {"room": (1.3125, 2.125, 1.3125), "dirty_limit": 27 << 20, "clean_ahead": float(4 << 20)}


def probe_curve(
    raw: Path, private_room: float, grid: tuple[int, int] | None = None
) -> list[tuple[float, float]]:
    """The read probe's second-pass miss fraction against its room-weighted stack distance (buffer x room).
    ``grid`` (blocks, threads per SM): the read probe measured in that grid (``measured_geometry.json``,
    validate_sweep.py --part geometry, run 17 on) instead of l2probe's 8 x 256 (``measured_probes.json``); it starts
    at 36 MiB, so none missed up to 32 MiB (where l2probe misses 0.3-0.5%), and all from 64 MiB."""
    f = raw / ("measured_geometry.json" if grid else "measured_probes.json")
    if grid and not f.exists():
        sys.exit(
            f"{raw}: no read probe in other grids (measured_geometry.json; validate_sweep.py --part geometry)"
        )
    pts, last = [(0.0, 0.0)], 0.0
    if grid:
        pts.append((32 * 2**20 * private_room, 0.0))
    for e in merge_repeats(json.loads(f.read_text())["configs"]):
        c = e["config"]
        if (
            c["kind"] == "l2probe"
            and e.get("measured")
            and (grid is None or (c["blocks_per_sm"], c["threads"]) == grid)
        ):
            size = c["nbytes"]
            last = min(1.0, max(last, (e["measured"]["dram_read_bytes"] - size) / size))
            pts.append((size * private_room, last))
    if grid and len(pts) == 2:
        sys.exit(f"{f}: no read probe in a {grid[0]} x {grid[1]} grid")
    return [*pts, (64 * 2**20 * private_room, 1.0)] if grid and last < 1.0 else pts


# --soft-edge --limit --grid-curve RAW2: flash2's kernels (ours and FA2's: 2 blocks of 128 threads per SM) take
# the read probe measured in their own grid (run 17 on), and no early write-back (the best on run 13's probes with
# that grid's curve for the 1 x 256 write probes: fit_l2_inputs.py RAW --soft-edge --grid-curve RAW2); the naive
# kernels keep SOFT_LIMIT_MODEL. A diagnostic.
GRID_CURVE_MODEL = {"room": (1.3125, 2.125, 1.3125), "dirty_limit": 27 << 20, "clean_ahead": 0.0}


def main() -> None:
    """``--soft-edge``: the stack-distance variant instead of the LRU (prints the tables, writes nothing);
    ``--limit``: with a dirty limit and early write-back (``SOFT_LIMIT_MODEL``); ``--grid-curve RAW2``: with it,
    flash2's kernels take RAW2's read probe in their grid (``GRID_CURVE_MODEL``)."""
    argv = sys.argv[1:]
    grid_raw = None
    if "--grid-curve" in argv:
        i = argv.index("--grid-curve")
        grid_raw = Path(argv[i + 1])
        del argv[i : i + 2]
    args = [a for a in argv if not a.startswith("--")]
    raw = Path(args[0]) if args else ROOT / "docs/validation/raw"
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "h200"
    prof = get_profile(PROFILE)
    soft = "--soft-edge" in sys.argv
    if ("--placement" in sys.argv and not soft) or (grid_raw and not (soft and "--limit" in sys.argv)):
        sys.exit("--placement goes with --soft-edge, --grid-curve RAW2 with --soft-edge --limit")
    model = (
        {"miss_curve": probe_curve(raw, SOFT_EDGE_ROOM[0]), "room": SOFT_EDGE_ROOM, "partitions": False}
        if soft
        else {}
    )
    if soft and "--limit" in sys.argv:
        room = SOFT_LIMIT_MODEL["room"]
        model = {**SOFT_LIMIT_MODEL, "miss_curve": probe_curve(raw, room[0]), "partitions": False}
    topo = measured_topology(raw)
    # --placement: the measured block placement and L2 partitions (run 3's, unless RAW has its own)
    if "--placement" in sys.argv:
        topo = topo or measured_topology(ROOT / "docs/validation/raw")
        if topo is None:
            sys.exit(f"{raw}: --placement needs the measured topology (topology.json)")
        model = {**model, "topology": topo}
    flash_model = model
    if grid_raw is not None:
        curve = probe_curve(grid_raw, GRID_CURVE_MODEL["room"][0], grid=(2, 128))
        flash_model = {**GRID_CURVE_MODEL, "miss_curve": curve, "partitions": False}
        if "topology" in model:
            flash_model["topology"] = topo
    ablations = {k: v for k, v in ABLATIONS.items() if k != "placement" or topo is not None}
    if topo is not None:
        ablations["placement"] = {"topology": topo}
    rows, extra = [], []
    entries = load(raw)
    if not entries:
        sys.exit(f"{raw}: no measured sweep (measured_<part>.json, part one of {', '.join(SWEEP_PARTS)})")
    for e in entries:
        s = simulate_config(
            e, prof, **(flash_model if e["config"]["kind"] in ("flash2", "sdpa-flash") else model)
        )
        if s is None:
            continue
        abl = {name: simulate_config(e, prof, **kw) for name, kw in ablations.items()}
        rates = None if soft else timeline_block_rate(raw, e)
        abl["timeline"] = simulate_config(e, prof, block_rate=rates) if rates is not None else None
        m = measured(e)
        c = e["config"]
        base = {
            "kernel": c["kind"],
            "device": e["device"],
            "profile": prof.name,
            "batch": c["batch"],
            "heads": c["heads"],
            "kv_heads": c["kv_heads"],
            "seq_len": c["seq_len"],
            "kv_len": c["kv_len"],
            "head_dim": c["head_dim"],
            "dtype": c["dtype"],
            "causal": c["causal"],
            "block_q": s["block_q"],
            "block_kv": s["block_kv"],
        }
        for b, d, key in (
            ("global", "read", "global_read"),
            ("global", "write", "global_write"),
            ("hbm", "read", "hbm_read"),
            ("hbm", "write", "hbm_write"),
        ):
            rows.append(
                {**base, "boundary": b, "direction": d, "simulated_bytes": s[key], "measured_bytes": m[key]}
            )
        extra.append(
            {
                **base,
                "xbar_read_bytes": m["xbar_read"],
                "lts_read_bytes": m["lts_read"],
                **{
                    f"hbm_{d}_{name}": a[f"hbm_{d}"] if a else None
                    for name, a in abl.items()
                    for d in ("read", "write")
                },
                "hbm_read_ncu_replayed": m["hbm_read_replayed"],
                "hbm_write_ncu_replayed": m["hbm_write_replayed"],
                **{
                    f"hbm_{d}_runs": ";".join(str(r[f"hbm_{d}"]) for r in e.get("repeats", []))
                    for d in ("read", "write")
                },
                "dirty_at_end_bytes": s["dirty_at_end"],
                "resident": ";".join(map(str, s["resident"])),
                "predicted_s": s["time_s"],
                "measured_s": m["time_s"],
            }
        )
    if soft:
        report(rows, extra)
        return
    out = ROOT / "docs/validation"
    with open(out / f"{dev}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    with open(out / f"{dev}-extra.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(extra[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(extra)
    report(rows, extra)
    parity(rows, out / f"{dev}-parity.html")


def _label(r):
    gqa = f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    return (
        f"{r['kernel']} N={r['seq_len']} H={r['heads']}{gqa} d={r['head_dim']} {r['dtype']}"
        f"{' causal' if r['causal'] in (True, 'True') else ''} {r['block_q']}x{r['block_kv']}"
        + (f" B={r['batch']}" if r["batch"] != 1 else "")
    )


def report(rows, extra) -> None:
    bounds = {
        ("global", "read"): 0.05,
        ("hbm", "read"): 0.05,
        ("hbm", "write"): 0.10,
        ("global", "write"): 0.05,
    }
    print(
        "\n| config | global read | global write | hbm read | hbm write | hbm read sim / meas (MB) | "
        "hbm write sim / meas (MB) |"
    )
    print("|---|---|---|---|---|---|---|")
    by = {}
    for r in rows:
        by.setdefault(_label(r), {})[(r["boundary"], r["direction"])] = r
    outliers = []
    for lab, d in by.items():
        cells = []
        for key in (("global", "read"), ("global", "write"), ("hbm", "read"), ("hbm", "write")):
            r = d[key]
            x = err(r["simulated_bytes"], r["measured_bytes"])
            bad = x is None or abs(x) > bounds[key]
            if bad:
                outliers.append((lab, key, r["simulated_bytes"], r["measured_bytes"], x))
            cells.append("n/a" if x is None else f"{'**' if bad else ''}{x:+.1%}{'**' if bad else ''}")
        hr, hw = d[("hbm", "read")], d[("hbm", "write")]
        cells.append(f"{hr['simulated_bytes'] / 1e6:.1f} / {hr['measured_bytes'] / 1e6:.1f}")
        cells.append(f"{hw['simulated_bytes'] / 1e6:.1f} / {hw['measured_bytes'] / 1e6:.1f}")
        print(f"| {lab} | " + " | ".join(cells) + " |")
    print("\n| kernel | global read | global write | hbm read | hbm write |\n|---|---|---|---|---|")
    for kern in dict.fromkeys(r["kernel"] for r in rows):
        cells = []
        for key in (("global", "read"), ("global", "write"), ("hbm", "read"), ("hbm", "write")):
            es = [
                err(r["simulated_bytes"], r["measured_bytes"])
                for r in rows
                if r["kernel"] == kern and (r["boundary"], r["direction"]) == key
            ]
            a = sorted(abs(x) if x is not None else float("inf") for x in es)
            ok = sum(x <= bounds[key] for x in a)
            cells.append(f"{ok}/{len(a)}, median {statistics.median(a):.1%}, max {a[-1]:.1%}")
        print(f"| {kern} | " + " | ".join(cells) + " |")
    print("\npredicted time error:\n\n| kernel | min | max | median |\n|---|---|---|---|")
    for kern in dict.fromkeys(x["kernel"] for x in extra):
        t = sorted(
            err(x["predicted_s"], x["measured_s"]) for x in extra if x["kernel"] == kern and x["measured_s"]
        )
        print(f"| {kern} | {t[0]:+.0%} | {t[-1]:+.0%} | {statistics.median(t):+.0%} |")
    print(f"\noutliers: {len(outliers)}")
    for o in outliers:
        print("  ", o[0], o[1], o[2], o[3], "n/a" if o[4] is None else f"{o[4]:+.1%}")
    heads = {
        "placement": "hbm read / write err, measured placement",
        "partitions": "... two partitions",
        "lockstep": "... lockstep",
        "plain_room": "... all lines alike (plain LRU of 60 MiB)",
        "previous": "... previous model (LRU of 44.8 MiB, lockstep)",
        "timeline": "... measured block timeline replayed",
    }
    names = [n for n in [*ABLATIONS, "timeline"] if extra and f"hbm_read_{n}" in extra[0]]
    print(
        "\n| config | measured spread read / write | "
        + " | ".join(heads[n] for n in names)
        + " | SM->L2 (xbar) read err | L2-slice (lts) read err | predicted ms | measured ms | time err |"
    )
    print("|---" * (len(names) + 7) + "|")

    def f(v):
        return "n/a" if v is None else f"{v:+.1%}"

    def spread(runs: str) -> str:  # (max - min) / median over the repeats
        v = sorted(int(t) for t in runs.split(";") if t)
        if len(v) < 2:
            return "-"
        med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
        return f"{(v[-1] - v[0]) / med:.1%}" if med else "0 B"

    for x in extra:
        lab = _label(x)
        d = by[lab]
        hr, hw = d[("hbm", "read")]["measured_bytes"], d[("hbm", "write")]["measured_bytes"]
        g = d[("global", "read")]["simulated_bytes"]
        cols = [
            f"{f(err(x[f'hbm_read_{n}'], hr))} / {f(err(x[f'hbm_write_{n}'], hw))}"
            if x[f"hbm_read_{n}"] is not None
            else "-"
            for n in names
        ]
        ex, el = err(g, x["xbar_read_bytes"]), err(g, x["lts_read_bytes"])
        et = err(x["predicted_s"], x["measured_s"])
        sp = f"{spread(x['hbm_read_runs'])} / {spread(x['hbm_write_runs'])}"
        print(
            f"| {lab} | {sp} | {' | '.join(cols)} | {f(ex)} | {f(el)} | {x['predicted_s'] * 1e3:.3f} | "
            f"{x['measured_s'] * 1e3:.3f} | {f(et)} |"
        )


def parity(rows, path: Path) -> None:
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        print("plotly not installed: no parity plot")
        return
    panels = [("global", "read"), ("hbm", "read"), ("hbm", "write"), ("global", "write")]
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{b} {d} (bytes)" for b, d in panels])
    colors = {"flash2": "#1f77b4", "naive": "#d62728", "sdpa-flash": "#2ca02c"}
    for i, (b, d) in enumerate(panels):
        rr, cc = i // 2 + 1, i % 2 + 1
        sel = [r for r in rows if r["boundary"] == b and r["direction"] == d and r["measured_bytes"]]
        lo = max(1.0, min(min(r["measured_bytes"], max(r["simulated_bytes"], 1)) for r in sel) / 2)
        hi = max(max(r["measured_bytes"], r["simulated_bytes"]) for r in sel) * 2
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                line={"color": "gray", "dash": "dot"},
                showlegend=False,
                hoverinfo="skip",
            ),
            row=rr,
            col=cc,
        )
        for kind, col in colors.items():
            pts = [r for r in sel if r["kernel"] == kind]
            if not pts:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[r["measured_bytes"] for r in pts],
                    y=[max(r["simulated_bytes"], lo) for r in pts],
                    mode="markers",
                    name=kind,
                    legendgroup=kind,
                    showlegend=i == 0,
                    marker={"color": col, "size": 8},
                    text=[_label(r) for r in pts],
                    hovertemplate="%{text}<br>measured %{x:.4s}B<br>simulated %{y:.4s}B<extra></extra>",
                ),
                row=rr,
                col=cc,
            )
        fig.update_xaxes(type="log", title_text="measured (Nsight Compute)", row=rr, col=cc)
        fig.update_yaxes(type="log", title_text="simulated (iosim)", row=rr, col=cc)
    fig.update_layout(
        title="iosim vs Nsight Compute on an NVIDIA H200 (sdpa-flash = blind check, torch's FA2)",
        height=900,
        width=1100,
        template="plotly_white",
    )
    fig.write_html(path, include_plotlyjs="cdn")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
