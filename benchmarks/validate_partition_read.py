"""Device side: how much of L2 can the SMs of ONE partition use? (docs/validation.md, "One partition's reads")

    python3 benchmarks/validate_partition_read.py OUTDIR

Finds the two SM groups (iosim.gpu.topology.l2_partition_map), then runs the read-twice probe under Nsight Compute
(L2 flushed first) with every SM reading, with only partition 0's SMs, and with only partition 1's, at several
buffer sizes; then a write-only probe from every SM and from partition 0's SMs only. Second-pass DRAM reads / buffer - 1 is the fraction that missed. Writes OUTDIR/partition_read.json and
OUTDIR/partition_read_ncu.csv; prints the table.

Predictions written before the run (docs/validation.md): if each partition keeps a copy of every line its own SMs
read (lines homed in the other partition as well), one partition's readers fill their 30 MiB alone, and second
passes start to miss near 30 MiB, not at the 40-48 MiB of every SM reading. If L2 were one pool, the knee would
not move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
SIZES = (8, 16, 20, 24, 28, 32, 36, 40, 48, 56)
WRITE_SIZES = (16, 24, 32, 40, 48, 64)
METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def _launch_all(split_path: Path) -> None:
    """Inside ncu: the partition probe (not profiled), then every masked read-twice launch."""
    import cupy as cp

    from iosim.gpu import topology as topo

    p = topo.l2_partition_map(ref=0)
    part, gap = topo.split_halves(p)
    split_path.write_text(json.dumps({"partition": part, "gap_cycles": gap, "ref_sm": p.ref_sm}))
    groups = {
        "all": list(range(len(part))),
        "p0": [m for m, x in enumerate(part) if x == 0],
        "p1": [m for m, x in enumerate(part) if x == 1],
    }
    for who, sms in groups.items():
        for size in SIZES:
            fn = topo.masked_read_probe(size * MiB, sms)
            fn()
            cp.cuda.Device().synchronize()
            print(f"LAUNCHED {who} {size}", flush=True)
    for who in ("all", "p0"):
        for size in WRITE_SIZES:
            fn = topo.masked_read_probe(size * MiB, groups[who], write=True)
            fn()
            cp.cuda.Device().synchronize()


def main() -> None:
    if sys.argv[1] == "--inside":
        _launch_all(Path(sys.argv[2]))
        return
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    from iosim.measure import find_ncu, parse_ncu_csv

    log = out / "partition_read_ncu.csv"
    cmd = [find_ncu(), "--clock-control", "none", "--cache-control", "all", "--csv", "--print-units", "base"]
    cmd += ["--metrics", METRICS, "-k", "regex:iosim_l2(probe|write)_masked", "--log-file", str(log)]
    cmd += [sys.executable, __file__, "--inside", str(out / "partition_split.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        raise SystemExit(proc.returncode)
    launches = parse_ncu_csv(log.read_text())
    order = [(w, s) for w in ("all", "p0", "p1") for s in SIZES]
    order += [(w + " write", s) for w in ("all", "p0") for s in WRITE_SIZES]
    if len(launches) != len(order):
        raise SystemExit(f"expected {len(order)} profiled launches, ncu has {len(launches)}")
    rows = []
    for (who, size), k in zip(order, launches):
        m = k["metrics"]
        rows.append(
            {
                "readers": who,
                "mib": size,
                "dram_read": m["dram__bytes_read.sum"],
                "dram_write": m["dram__bytes_write.sum"],
                "ns": m["gpu__time_duration.sum"],
            }
        )
    split = json.loads((out / "partition_split.json").read_text())
    (out / "partition_read.json").write_text(json.dumps({"split": split, "rows": rows}, indent=1))
    print(
        f"partition sizes {split['partition'].count(0)} / {split['partition'].count(1)}, gap {split['gap_cycles']:.0f}"
    )
    print("second-pass miss fraction (DRAM read / buffer - 1) by buffer MiB:")
    print("readers | " + " | ".join(str(s) for s in SIZES))
    for who in ("all", "p0", "p1"):
        fr = [r["dram_read"] / (r["mib"] * MiB) - 1 for r in rows if r["readers"] == who]
        print(f"{who:7} | " + " | ".join(f"{x:.3f}" for x in fr))
    print("written only: dirty bytes L2 kept (written - DRAM writes, MB) by buffer MiB:")
    print("writers | " + " | ".join(str(s) for s in WRITE_SIZES))
    for who in ("all write", "p0 write"):
        kept = [(r["mib"] * MiB - r["dram_write"]) / 1e6 for r in rows if r["readers"] == who]
        print(f"{who[:-6]:7} | " + " | ".join(f"{x:.2f}" for x in kept))


if __name__ == "__main__":
    main()
