"""Speed of the L2 model on the issue's case: flash2, N = 131072, 32 heads, d = 128 (H200 profile).

    python benchmarks/validate_l2_speed.py

Prints the wall time of one cold run in a fresh process (numba's compiled code is cached on disk after the first
run; the first run of a new install also compiles, about 10-20 s more) for the GPU kernel's tiles (128 x 32) and
FlashAttention-2's (128 x 64).
"""

from __future__ import annotations

import time

t0 = time.perf_counter()
from iosim import l2  # noqa: E402
from iosim.problem import AttentionProblem  # noqa: E402
from iosim.schedules import Tiles  # noqa: E402

t_import = time.perf_counter() - t0
p = AttentionProblem(heads=32, seq_len=131072, head_dim=128)
for tiles in (Tiles(128, 32), Tiles(128, 64)):
    t1 = time.perf_counter()
    r = l2.simulate_l2("flash2", p, tiles, "h200-sxm-141gb")
    k = r.kernels[0]
    print(
        f"flash2 N=131072 H=32 d=128 tiles {tiles.block_q}x{tiles.block_kv}: {time.perf_counter() - t1:.2f} s "
        f"(hbm read {k.dram_read / 1e9:.2f} GB, write {k.dram_write / 1e9:.2f} GB, global read "
        f"{k.global_read / 1e9:.0f} GB, {k.resident} blocks resident, {k.rounds} rounds)"
    )
print(f"import {t_import:.2f} s, total {time.perf_counter() - t0:.2f} s")
