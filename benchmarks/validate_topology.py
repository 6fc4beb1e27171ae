"""Device side: where blocks land and which SMs share an L2 partition (iosim.gpu.topology), for the L2 model.

    python3 benchmarks/validate_topology.py OUTDIR

Writes OUTDIR/topology.json (every raw number) and prints a summary: whether the dispatch map repeats run to run,
and the two SM groups from each reference SM with their latencies.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from iosim.gpu import topology as topo

OCCUPANCIES = (1, 2, 3, 4, 8)
REPEATS = 3


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import cupy as cp

    n = cp.cuda.Device().attributes["MultiProcessorCount"]
    data: dict = {"sm_count": n, "dispatch": {}, "partition": []}
    for k in OCCUPANCIES:
        runs = [topo.dispatch_map(k) for _ in range(REPEATS)]
        data["dispatch"][str(k)] = runs
        same = all(r["sm"] == runs[0]["sm"] for r in runs)
        print(f"dispatch occupancy {k}: {REPEATS} runs identical: {same}; first 24 SMs {runs[0]['sm'][:24]}")
    parts = []
    for ref in (0, n // 2, n - 1):
        p = topo.l2_partition_map(ref=ref, seed=ref)
        part, gap = topo.split_halves(p)
        parts.append(part)
        data["partition"].append({**asdict(p), "split": part, "gap_cycles": gap})
        a, o, c = (np.array(x) for x in (p.after_ref, p.own, p.cold))
        g = np.array([part[s] for s in p.sm])
        keep = ~np.isnan(a)
        print(
            f"partition ref block {ref} (SM {p.ref_sm}): groups {int((np.array(part) == 0).sum())}/"
            f"{int((np.array(part) == 1).sum())}, gap {gap:.1f} cycles; after-ref median "
            f"{np.median(a[keep & (g == 0)]):.0f} (same group) vs {np.median(a[keep & (g == 1)]):.0f} (other), "
            f"own {np.median(o[keep]):.0f}, cold {np.median(c[keep]):.0f} cycles/load"
        )
    agree = [
        max(np.mean(np.array(parts[0]) == np.array(q)), np.mean(np.array(parts[0]) != np.array(q)))
        for q in parts
    ]
    print(f"partition: agreement of the splits from the 3 references with the first: {agree}")
    print(f"partition by SM id (first split): {''.join(map(str, parts[0]))}")
    (out / "topology.json").write_text(json.dumps(data))


if __name__ == "__main__":
    main()
