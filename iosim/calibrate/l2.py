"""The L2 model's probe-derived inputs: ``l2.dirty_at_start`` and ``l2.room`` (private, shared, dirty).

* ``dirty_at_start``: the DRAM bytes the read probe (:class:`~iosim.measure.ReadProbe`, nothing written) writes
  once its buffer is past L2 (>= 0.8 x L2: 48 MiB and up on the H200's 60 MiB): dirty lines present when the kernel starts; the mean.
* ``room``: on a grid of factors, the (private, shared, dirty) for which the L2 model run on every probe
  (:func:`iosim.l2.probes.simulate_probe`, at the physical capacity, blocks in lockstep) reproduces the probes'
  measured DRAM read and write bytes best: least squares in MB, summed over probes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..hardware.gpu import Profile, get_profile
from ..l2 import L2Inputs
from ..l2.probes import simulate_probe
from ..measure.records import Measured
from ..measure.runs import ReadProbe, WriteProbe

MiB = 1 << 20
PAST_L2 = 0.8  # read probes of at least this fraction of L2 (48 of the H200's 60 MiB) overflow it
ROOM_GRID = ((1.25, 1.3125, 1.375), (2.0, 2.125, 2.25), (1.75, 1.875, 2.0, 2.125, 2.25))  # 1/16 steps


class CalibrationError(ValueError):
    """Not enough, or not the right, measurements to derive a value; the message says what is missing."""


@dataclass(frozen=True)
class ProbeCase:
    """One probe as the model takes it, and its measured DRAM bytes (medians of its launches)."""

    write_bytes: int
    read_bytes: int
    shared: bool
    reread: bool
    interleave: bool
    dram_read: int
    dram_write: int


def probe_cases(measured: list[Measured]) -> list[ProbeCase]:
    """The calibration probes among ``measured`` (errors and attention runs left out)."""
    out = []
    for m in measured:
        if m.error:
            continue
        rd, wr = int(m.measured["dram_read_bytes"]), int(m.measured["dram_write_bytes"])
        if isinstance(m.run, ReadProbe) and (m.run.blocks_per_sm, m.run.threads) == (8, 256):
            out.append(ProbeCase(0, m.run.nbytes, False, True, False, rd, wr))
        elif isinstance(m.run, WriteProbe):
            r = m.run
            out.append(ProbeCase(r.nbytes, r.read_bytes, r.shared, False, r.interleave, rd, wr))
    return out


def dirty_at_start(cases: list[ProbeCase], past: int) -> int:
    """Mean DRAM bytes written by the read probes of at least ``past`` bytes (B)."""
    big = [c.dram_write for c in cases if c.reread and c.read_bytes >= past]
    if not big:
        raise CalibrationError(f"dirty_at_start needs read probes (l2probe) of at least {past:,} B; none measured")
    return int(sum(big) / len(big))


def misfit(cases: list[ProbeCase], profile: Profile, inputs: L2Inputs) -> float:
    """Squared misfit (MB^2) of the model's DRAM read and write bytes against the measured ones, over ``cases``."""
    sms = int(profile.require("sm_count"))
    err = 0.0
    for c in cases:
        res = simulate_probe(c.write_bytes, c.read_bytes, profile, inputs, shared=c.shared, reread=c.reread,
                             interleave=c.interleave, sms=sms)
        err += ((res.read_bytes - c.dram_read) / 1e6) ** 2 + ((res.write_bytes - c.dram_write) / 1e6) ** 2
    return err


@dataclass(frozen=True)
class RoomFit:
    """The best ``room`` and its misfit, with every candidate tried (misfit, room), best first."""

    room: tuple[float, float, float]
    misfit: float
    dirty_at_start: int
    tried: list[tuple[float, tuple[float, float, float]]]


def fit_room(cases: list[ProbeCase], profile: str | Profile, capacity: int | None = None,
             grid: tuple[tuple[float, ...], ...] = ROOM_GRID) -> RoomFit:
    """The (private, shared, dirty) room factors of ``grid`` that fit ``cases`` best, at L2 ``capacity`` (the
    profile's if None), with ``dirty_at_start`` from the same probes and blocks in lockstep (block share 1)."""
    if not any(c.write_bytes for c in cases):
        raise CalibrationError("room needs write probes (l2write): the dirty factor is read from their write-backs")
    prof = get_profile(profile)
    cap = int(capacity if capacity is not None else prof.require("l2.capacity"))
    init = dirty_at_start(cases, int(PAST_L2 * cap))
    tried = sorted((misfit(cases, prof, L2Inputs(cap, room, init, 1.0)), room) for room in itertools.product(*grid))
    return RoomFit(tried[0][1], tried[0][0], init, tried)
