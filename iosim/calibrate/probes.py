"""What the calibration measures: the probe list (as measured for the built-in H200 profile's L2 inputs,
data/validation/h200-probes.tar.xz) and the flash2 problems whose block timelines give ``sm.block_share``."""

from __future__ import annotations

from ..measure.runs import Attention, ReadProbe, WriteProbe

MiB = 1 << 20


def _probes() -> list:
    runs: list = [ReadProbe(s * MiB) for s in (8, 16, 24, 32, 40, 48, 56, 64, 80)]
    runs += [WriteProbe(s * MiB) for s in (8, 16, 24, 32, 40, 48, 64, 96)]  # writes only
    for shared in (False, True):  # 8 MiB dirty, then other data read by one SM / by every SM per line
        runs += [WriteProbe(8 * MiB, r * MiB, shared=shared) for r in (8, 16, 24, 32, 40, 48, 64)]
    runs += [WriteProbe(32 * MiB, r * MiB) for r in (8, 16, 32)]
    pairs = [(s, s) for s in (16, 24, 32, 40, 48)] + [(16, 32), (24, 48), (32, 16), (48, 24)]
    runs += [WriteProbe(w * MiB, r * MiB, interleave=True) for w, r in pairs]  # side by side, as flash2's Q and O
    return runs


CALIBRATION_PROBES = tuple(_probes())  # 43 probes: 9 read, 25 write, 9 interleaved
TIMELINE_RUNS = tuple(Attention("flash2", seq_len=n, heads=h, head_dim=128)
                      for n, h in ((4096, 32), (16384, 32), (32768, 32), (65536, 32), (131072, 8)))
