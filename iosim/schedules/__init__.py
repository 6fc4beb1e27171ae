"""The schedules iosim knows, one module each: naive, flash1, flash2, flash3, flash-decoding, block-sparse.

Each module reads like its paper's algorithm and ends with its registry record, a :class:`Schedule`: the tile
program of one head, the closed form proven equal to it, the default tiles and the on-chip working set that the
one tile-fit rule (:mod:`iosim.schedules.fit`) checks. Backward passes live in their own modules (``naive_bwd``,
``flash1_bwd``, ``flash2_bwd``, ``flash3_bwd``, ``block_sparse_bwd``), registered in ``BACKWARD`` under the name of the forward
schedule whose outputs they consume. A tile program is written against the instruction set of
:mod:`iosim.schedules.machine` (:class:`~iosim.schedules.machine.Machine`), which also holds the counting interpreter
(:class:`~iosim.schedules.machine.Counter`), the twin of the closed forms.
"""

from __future__ import annotations

from . import (
    block_sparse,
    block_sparse_bwd,
    flash1,
    flash1_bwd,
    flash2,
    flash2_bwd,
    flash3,
    flash3_bwd,
    flash_decoding,
    fp8_quantize,
    naive,
    naive_bwd,
)
from .base import Schedule, ScheduleError, ScheduleOptions, Tiles
from .fit import check_fit, fits

SCHEDULES: dict[str, Schedule] = {m.SCHEDULE.name: m.SCHEDULE for m in (naive, flash1, flash2, flash3,
                                                                       flash_decoding, block_sparse)}
BACKWARD: dict[str, Schedule] = {m.SCHEDULE.name: m.SCHEDULE for m in (naive_bwd, flash1_bwd, flash2_bwd,
                                                                      flash3_bwd, block_sparse_bwd)}
# kernels that run beside attention, counted and timed like a schedule's forward pass but not attention (no numeric
# program, not in SCHEDULES): the fp8 quantize kernels that write iosim's fp8 layout
AUXILIARY: dict[str, Schedule] = {fp8_quantize.SCHEDULE.name: fp8_quantize.SCHEDULE}
PASSES = ("forward", "backward", "both")


def get_schedule(name: str, pass_: str = "forward") -> Schedule:
    """The record of schedule ``name`` for ``pass_`` ("forward" or "backward")."""
    if name in AUXILIARY and pass_ == "forward":
        return AUXILIARY[name]
    if name in AUXILIARY:
        raise ScheduleError(f"{name}: runs once, before the attention's forward pass; it has no {pass_!r} pass")
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}: expected one of {', '.join(SCHEDULES)}, or "
                            f"{', '.join(AUXILIARY)}")
    if pass_ == "forward":
        return SCHEDULES[name]
    if pass_ != "backward":
        raise ScheduleError(f"pass={pass_!r}: expected one of {', '.join(PASSES)}")
    if name not in BACKWARD:
        raise ScheduleError(f"{name}: no backward pass is modeled; schedules with one: {', '.join(BACKWARD)}")
    return BACKWARD[name]


def resolve_tiles(schedule: str, problem, profile, block_q: int | None = None, block_kv: int | None = None, *,
                  pass_: str = "forward", options: ScheduleOptions | None = None) -> Tiles:
    """Explicit tiles if given (both, or one of them with the default for the other), else the default.

    ``options`` (:class:`ScheduleOptions`: ``splits``, ``kv_lens``, ``page_size``, ``kv_dtype``, ``density``,
    ``mask``, ``seed``, ``gqa``; None = not given)
    go to schedules that take them (a record with ``make_tiles``); giving one to any other schedule is an error."""
    s = get_schedule(schedule, pass_)
    options = (options or ScheduleOptions()).given()
    foreign = {k: v for k, v in options.items() if k not in s.options}
    if foreign:
        given = ", ".join(f"{k}={v!r}" for k, v in foreign.items())
        raise ScheduleError(f"{s.label} takes no {', '.join(foreign)} (given {given}): only flash-decoding takes "
                            "splits (and, with kernel='iosim-decode', kv_lens, page_size and kv_dtype); only block-sparse "
                            "density, mask and seed; only flash2's backward pass (pass backward or both) gqa, "
                            "'expand' (the default) or 'grouped'; only flash2's and flash3's forward pass window and "
                            "seqlens; only fp8-quantize incoherent")
    if s.make_tiles is not None:
        return s.make_tiles(problem, profile, block_q, block_kv, **options)
    if block_q is None and block_kv is None:
        return s.default_tiles(problem, profile)
    if schedule == "naive" and (block_q is None or block_kv is None):
        raise ScheduleError(f"naive: give both block_q and block_kv to tile its GEMMs, or neither (given "
                            f"block_q={block_q!r}, block_kv={block_kv!r})")
    default = s.default_tiles(problem, profile)
    return Tiles(block_q if block_q is not None else default.block_q,
                 block_kv if block_kv is not None else default.block_kv)


__all__ = ["AUXILIARY", "BACKWARD", "PASSES", "SCHEDULES", "Schedule", "ScheduleError", "ScheduleOptions", "Tiles", "check_fit",
           "fits", "get_schedule", "resolve_tiles"]
