"""The L2 model's measured inputs, from the probe runs and block timelines in docs/validation/raw/.

    python benchmarks/fit_l2_inputs.py [RAW_DIR] [--partitions] [--lag] [--no-limit] [--soft-edge] [--read-back]
        [--reuse [--curve RAW2]] [--soft-edge --grid-curve RAW2]

Prints what docs/validation/h200-sxm-141gb-measured.yaml states:

* ``sm.block_share``: from each timeline, the first wave's two blocks per SM: the older (first dispatched) block
  of an SM finishes after D0, the younger after D1. With shares f (older) and 1 - f and a lone block at the SM's full
  rate, f D0 = (1 - f) D0 + f (D1 - D0), so f = D0 / (3 D0 - D1); block_share = (1 - f) / f.
* ``l2.dirty_at_start``: DRAM bytes written by the read-only probe (l2probe) once its buffer is past L2 (>= 48 MiB).
* ``l2.room`` of the one-pool model (``l2.partitions`` 1): the (private, shared, dirty) factors on a 1/16 grid for
  which the L2 model (iosim.l2.probes), at the physical capacity, reproduces the probes' DRAM read and write bytes
  best (least squares, MB): the read probe, the write probe and, where RAW_DIR has them (run 10 on), the
  interleaved write probe (reads and writes side by side, as in flash2) and the read-back probe (run 13 on);
* ``l2.dirty_limit`` and the dirty factor beside it: the write-only probes past L2 measure the limit directly (bytes
  written minus bytes written back); then the (dirty, limit) grid with the best private and shared factors, and
  those again at the best pair (``--no-limit`` skips this part);
* ``--soft-edge``: instead of all that, the (dirty, limit, clean-ahead) grid of the stack-distance variant (the
  read probe's miss curve from RAW_DIR in place of the hard edge; private 1.3125, shared 2.125), about 10 min on
  run 13;
  ``--grid-curve RAW2``: the write probes (one block of 256 threads per SM) with the read probe measured in their
  own grid (RAW2's ``measured_geometry.json``, run 17), the read probe with its own;
* ``--read-back``: only the read-back probes (run 13 on), measured against the default model and the fitted soft
  edge with its limit (validate_compare.SOFT_LIMIT_MODEL), in a table.
* ``--reuse``: only the reuse probes (runs 15-19: a buffer read once, several times, by groups of SMs or by every
  SM, then other data or idling, then the buffer again), the same way; an LRU drops the buffer alike whether it
  was read once or four times.
  ``--curve RAW2``: the soft edge's read probe from RAW2 (for a run without the probes part).
* how far SMs drift apart over a long grid, from the same timelines (not an input; ``--lag``: by SM);
* ``--partitions``: the dirty factor of the two-partition model (``l2.partitions`` 2, the profile's), which has no
  other; then the one-partition read probe against both models.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
from validate_compare import (  # merge: a --repeat K sweep, each config's median
    ONE_POOL_ROOM,
    SOFT_EDGE_ROOM,
    merge_repeats,
    probe_curve,
)

from iosim.l2.probes import simulate_probe
from iosim.profile import get_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "docs/validation/h200-sxm-141gb-measured.yaml"
MiB = 1 << 20
PHYSICAL_L2 = 62_914_560


def block_share(raw: Path) -> list[tuple[str, float]]:
    out = []
    for f in sorted(raw.glob("timeline_*.npz")):
        z = np.load(f)
        if json.loads(str(z["config"]))["causal"]:
            continue  # unequal work per block: the shares cannot be read from durations
        s, e, sm = z["start_ns"], z["end_ns"], z["sm"]
        first = np.argsort(s, kind="stable")[: 2 * len(np.unique(sm))]
        d = np.sort(e[first] - s[first])
        half = len(d) // 2
        d0, d1 = np.median(d[:half]), np.median(d[half:])
        f_old = d0 / (3 * d0 - d1)
        out.append((f.stem, (1 - f_old) / f_old))
    return out


def sm_starts(z) -> np.ndarray:
    """Start times of each SM's first k blocks (SMs x k, sorted), k the fewest blocks any SM ran."""
    s, sm = z["start_ns"], z["sm"]
    n = int(sm.max()) + 1
    k = min(int((sm == m).sum()) for m in range(n))
    return np.array([np.sort(s[sm == m])[:k] for m in range(n)])


def sm_lag(raw: Path) -> None:
    """How far each SM falls behind over a long grid (not a model input: docs/validation.md, "Long grids").

    From each timeline: the start of every SM's k-th block minus the mean over SMs, in block durations; printed at
    the last k every SM reached: the spread, the pair correlation of the two SMs of a TPC, and the lag by SM."""
    for f in sorted(raw.glob("timeline_*.npz")):
        z = np.load(f)
        if json.loads(str(z["config"]))["causal"]:
            continue
        starts = sm_starts(z)
        k = starts.shape[1]
        lag = (starts[:, -1] - starts[:, -1].mean()) / np.median(z["end_ns"] - z["start_ns"])
        print(
            f"{f.stem}: {k} blocks per SM; lag at the last: range {np.ptp(lag):.3f}, std {lag.std():.3f} block "
            f"durations; TPC pairs correlate {np.corrcoef(lag[0::2], lag[1::2])[0, 1]:.2f}"
        )
        if "--lag" in sys.argv:
            print("   by SM (x1000):", " ".join(f"{round(x * 1000):+d}" for x in lag))


def probes(raw: Path) -> list[tuple]:
    """(written, read, shared, reread, interleave, read_written, measured) of every probe in RAW (medians of the
    repeats); ``measured_mix.json`` (the interleaved write probe, run 10 on) and ``measured_reread.json`` (written,
    then read back, run 13 on) where present."""
    cases = []
    for part in ("writeback", "probes", "mix", "reread"):
        f = raw / f"measured_{part}.json"
        if part in ("mix", "reread") and not f.exists():
            continue
        for e in merge_repeats(json.loads(f.read_text())["configs"]):
            c, m = e["config"], e.get("measured") or {}
            if c["kind"] == "l2write" and not c.get("spin_us"):
                cases.append(
                    (
                        c["nbytes"],
                        c["read_bytes"],
                        c["read_shared"],
                        False,
                        c.get("interleave", False),
                        c.get("read_written", False),
                        m,
                    )
                )
            elif c["kind"] == "l2probe":
                cases.append((0, c["nbytes"], False, True, False, False, m))
    return cases


def misfit(
    cases, room, init, partitions=False, limit=0, curve=None, ahead=0.0, write_curve=None
) -> tuple[float, float, float]:
    """Squared misfit (MB^2) of DRAM read and write bytes: (all probes, the interleaved ones, the read-back ones);
    ``curve``: the stack-distance variant with that miss curve; ``write_curve``: the write probes' own (their grid,
    one block of 256 threads per SM), ``curve`` then only for the read probe (8 x 256)."""
    err = mixed = back = 0.0
    for w, r, shared, reread, interleave, read_written, m in cases:
        own = curve if reread or write_curve is None else write_curve
        res = simulate_probe(
            w,
            r,
            PROFILE,
            shared=shared,
            reread=reread,
            interleave=interleave,
            read_written=read_written,
            capacity=PHYSICAL_L2,
            room=room,
            dirty_at_start=init,
            dirty_limit=limit,
            block_share=1.0,
            partitions=partitions,
            miss_curve=own,
            clean_ahead=ahead,
        )
        e = ((res.write_bytes - m["dram_write_bytes"]) / 1e6) ** 2
        e += ((res.read_bytes - m["dram_read_bytes"]) / 1e6) ** 2
        err += e
        mixed += e if interleave else 0.0
        back += e if read_written else 0.0
    return err, mixed, back


def _two_models(curve_raw: Path, name_curve: bool = False) -> dict[str, dict]:
    """The probe tables' two models by name: the default, and the soft edge with run 13's dirty limit
    (validate_compare.SOFT_LIMIT_MODEL) on the read probe of ``curve_raw``."""
    from validate_compare import SOFT_LIMIT_MODEL

    soft = "soft edge, dirty limit, clean ahead" + (f" ({curve_raw.name}'s read probe)" if name_curve else "")
    return {
        "default (hard edge, room)": {"room": ONE_POOL_ROOM, "dirty_limit": 0},
        soft: {**SOFT_LIMIT_MODEL, "miss_curve": probe_curve(curve_raw, SOFT_LIMIT_MODEL["room"][0])},
    }


def _simulate_models(models: dict[str, dict], init: int, w: int, r: int, **probe) -> list:
    """Each model's L2Result on one probe (``probe``: simulate_probe's probe options), at the physical L2, in
    lockstep, with ``init`` bytes dirty at the start."""
    return [
        simulate_probe(
            w,
            r,
            PROFILE,
            capacity=PHYSICAL_L2,
            dirty_at_start=init,
            block_share=1.0,
            partitions=False,
            **probe,
            **{"room": ONE_POOL_ROOM, **model},
        )
        for model in models.values()
    ]


def read_back_table(raw: Path, cases, init: int) -> None:
    """The read-back probes: DRAM bytes written and read (MB), measured and modeled."""
    models = _two_models(raw)
    print("written, then read back: DRAM write / read (MB): measured | " + " | ".join(models))
    for w, _, _, _, _, read_written, m in cases:
        if not read_written:
            continue
        cells = [f"{m['dram_write_bytes'] / 1e6:.2f} / {m['dram_read_bytes'] / 1e6:.2f}"]
        for r in _simulate_models(models, init, w, 0, read_written=True):
            cells.append(f"{r.write_bytes / 1e6:.2f} / {r.read_bytes / 1e6:.2f}")
        print(f"  {w // MiB:3d} MiB | " + " | ".join(cells))


def reuse_table(raw: Path, init: int, curve_raw: Path) -> None:
    """The reuse probes (run 15 on: a buffer read once, several times, by groups of SMs or by every SM, other data
    read, the buffer read again; run 16's controls beside l2probe; run 18's idling between the reads): DRAM reads
    past the compulsory ones (MB; the buffer's lines L2 dropped), measured and modeled (the soft edge with the read
    probe of ``curve_raw``). An LRU gives the same for one read and four."""
    entries = []
    for part in ("reuse", "reuse2", "idle", "group"):
        f = raw / f"measured_{part}.json"
        if f.exists():
            entries += merge_repeats(json.loads(f.read_text())["configs"])
    if not entries:
        sys.exit(f"{raw}: no reuse probes (validate_sweep.py --part reuse, reuse2, idle or group)")
    models = _two_models(curve_raw, name_curve=True)
    print("read again after other data: DRAM read past compulsory (MB): measured | " + " | ".join(models))
    for e in entries:
        c, m = e["config"], e.get("measured") or {}
        if c["kind"] == "l2write":  # run 18's dirty-line idling control: see the write probes
            continue
        if not m:
            print(f"  {c}: no measurement ({e.get('error', '')})")
            continue
        a = c["nbytes"]
        if c["kind"] == "l2reuse":
            b, g = c["read_bytes"], c.get("read_group", 1)
            probe = {"hot_bytes": a, "hot_reps": c["hot_reps"], "shared": c["read_shared"], "group": g}
            by = "every SM" if c["read_shared"] else f"groups of {g} SMs" if g > 1 else "one SM"
            who = f"{a // MiB} MiB read by {by}, {c['hot_reps']}x"
            who += f", idle {c['spin_us']} us" if c.get("spin_us") else ""
            results = _simulate_models(models, init, 0, b, **probe)
        else:  # l2probe: read twice, 8 blocks per SM, no barrier
            b, who = 0, f"{a // MiB} MiB read twice (l2probe)"
            results = _simulate_models(models, init, 0, a, reread=True)
        cells = [f"{(m['dram_read_bytes'] - a - b) / 1e6:6.2f}"]
        cells += [f"{(r.read_bytes - a - b) / 1e6:6.2f}" for r in results]
        print(f"  {who:40s} then {b // MiB:3d} MiB: " + " | ".join(cells))


def one_partition(raw: Path, dirty: float, init: int) -> None:
    """The one-partition read probe (benchmarks/validate_partition_read.py: only partition 0's 66 SMs read B twice)
    against both models: second-pass miss fraction. Not used by any fit."""
    f = raw / "partition_read.json"
    if not f.exists():
        return
    rows = [r for r in json.loads(f.read_text())["rows"] if r["readers"] == "p0"]
    print(
        "one partition's readers, second-pass miss fraction: measured / two partitions / one pool (room fit)"
    )
    for r in rows:
        b = r["mib"] * MiB
        kw = {"reread": True, "capacity": PHYSICAL_L2, "dirty_at_start": init, "block_share": 1.0, "sms": 66}
        two = simulate_probe(0, b, PROFILE, partitions=True, room=(1.0, 1.0, dirty), dirty_limit=0, **kw)
        pool = simulate_probe(
            0, b, PROFILE, partitions=False, room=ONE_POOL_ROOM, dirty_limit=0, **kw
        )  # slots 0-65: one half
        fr = [x / b - 1 for x in (r["dram_read"], two.read_bytes, pool.read_bytes)]
        print(f"  {r['mib']:3d} MiB: {fr[0]:.3f} / {fr[1]:.3f} / {fr[2]:.3f}")


def main() -> None:
    argv = sys.argv[1:]
    grid_raw = Path(argv[argv.index("--grid-curve") + 1]) if "--grid-curve" in argv else None
    for opt in ("--curve", "--grid-curve"):  # their values are not RAW_DIR
        if opt in argv:
            del argv[argv.index(opt) : argv.index(opt) + 2]
    args = [a for a in argv if not a.startswith("--")]
    raw = Path(args[0]) if args else ROOT / "docs/validation/raw"
    shares = block_share(raw)
    for name, b in shares:
        print(f"block_share {name}: {b:.3f}")
    if shares:
        print(f"block_share (median): {np.median([b for _, b in shares]):.3f}")
    else:
        print(f"block_share: no block timelines in {raw}")
    sm_lag(raw)
    if "--reuse" in sys.argv:  # needs only the reuse probes (dirty lines at start: the profile's)
        curve_raw = Path(sys.argv[sys.argv.index("--curve") + 1]) if "--curve" in sys.argv else raw
        reuse_table(raw, get_profile(PROFILE).l2_dirty_at_start(), curve_raw)
        return
    cases = probes(raw)
    n_mix = sum(1 for c in cases if c[4])
    n_back = sum(1 for c in cases if c[5])
    big = [m["dram_write_bytes"] for w, r, _, rr, _, _, m in cases if rr and r >= 48 * MiB]
    init = int(np.mean(big))
    print(f"dirty_at_start: {init} B (read-only probe >= 48 MiB: {', '.join(map(str, big))})")
    what = f"over {len(cases)} probes ({n_mix} interleaved, {n_back} read back)"
    if "--read-back" in sys.argv:
        read_back_table(raw, cases, init)
        return
    if "--partitions" in sys.argv:
        fits = sorted((misfit(cases, (1.0, 1.0, d), init, True), d) for d in (1.875, 2.0, 2.125, 2.25, 2.375))
        for (e, em, eb), d in fits:
            print(
                f"two partitions, dirty {d}: misfit {e:.1f} MB^2 {what}; interleaved {em:.1f}, read back {eb:.1f}"
            )
        one_partition(raw, fits[0][1], init)
        return
    if "--soft-edge" in sys.argv:
        p, sh = ONE_POOL_ROOM[:2]
        curve = probe_curve(raw, p)
        # --grid-curve RAW2: the write probes take the read probe measured in their own grid (RAW2's, run 17 on)
        wc = probe_curve(grid_raw, p, grid=(1, 256)) if grid_raw else None
        grid = itertools.product((1.3125, 1.5), (0.0, 27.0, 28.0), (0.0, 4.0))
        sfits = sorted(
            (
                misfit(
                    cases, (p, sh, d), init, limit=int(lim * MiB), curve=curve, ahead=a * MiB, write_curve=wc
                ),
                d,
                lim,
                a,
            )
            for d, lim, a in grid
        )
        e, em, eb = misfit(cases, SOFT_EDGE_ROOM, init, curve=probe_curve(raw, SOFT_EDGE_ROOM[0]))
        print(f"the earlier soft edge, room {SOFT_EDGE_ROOM}, no limit: misfit {e:.1f} MB^2 {what}")
        which = "; for the write probes, the read probe of their 1 x 256 grid" if wc else ""
        print(f"soft edge (the read probe's miss curve{which}), private {p}, shared {sh}:")
        for (e, em, eb), d, lim, a in sfits:
            print(
                f"  dirty {d}, limit {lim:g} MiB, clean ahead {a:g} MiB: misfit {e:.1f} MB^2 {what}; "
                f"interleaved {em:.1f}, read back {eb:.1f}"
            )
        return
    privates, shareds = (1.25, 1.3125, 1.375), (2.0, 2.125, 2.25)
    grid = itertools.product(privates, shareds, (1.75, 1.875, 2.0, 2.125, 2.25))
    fits = sorted((misfit(cases, room, init), room) for room in grid)
    e, em, eb = misfit(cases, ONE_POOL_ROOM, init)
    print(
        f"the profiles' factors {ONE_POOL_ROOM}: misfit {e:.1f} MB^2 {what}; interleaved {em:.1f}, read back {eb:.1f}"
    )
    print("without a dirty limit (dirty lines leave L2 only by eviction):")
    for (e, em, eb), room in fits[:6]:
        print(
            f"  room private {room[0]}, shared {room[1]}, dirty {room[2]}: misfit {e:.1f} MB^2 {what}; "
            f"interleaved {em:.1f}, read back {eb:.1f}"
        )
    if "--no-limit" in sys.argv:
        return
    # writes only, past L2: what stays dirty is the limit (nothing else competes for room)
    only = [(w, m) for w, r, _, rr, _, rw, m in cases if not (r or rr or rw) and w >= 48 * MiB]
    kept = [(w + init - m["dram_write_bytes"]) / MiB for w, m in only]
    print(
        f"dirty bytes kept by the write-only probes past L2 (>= 48 MiB): {', '.join(f'{k:.2f}' for k in kept)} MiB"
    )
    p, sh = fits[0][1][:2]
    pairs = itertools.product((1.3125, 1.5, 1.75, 2.0), (27.0, 28.0, 29.0))
    lfits = sorted((misfit(cases, (p, sh, d), init, limit=int(lim * MiB)), d, lim) for d, lim in pairs)
    (_, _, _), d, lim = lfits[0]
    rooms = sorted(
        (misfit(cases, (pp, ss, d), init, limit=int(lim * MiB)), (pp, ss))
        for pp in privates
        for ss in shareds
    )
    print(f"with a dirty limit (private {p}, shared {sh} from above; then both again at the best pair):")
    for (e, em, eb), dd, ll in lfits[:6]:
        print(
            f"  dirty {dd}, limit {ll:g} MiB: misfit {e:.1f} MB^2 {what}; interleaved {em:.1f}, read back {eb:.1f}"
        )
    for (e, _, _), (pp, ss) in rooms[:3]:
        print(f"  private {pp}, shared {ss}, dirty {d}, limit {lim:g} MiB: misfit {e:.1f} MB^2")


if __name__ == "__main__":
    main()
