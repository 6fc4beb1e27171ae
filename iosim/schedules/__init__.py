"""The schedules iosim knows, one module each: naive, flash1, flash2, flash3, flash-decoding, block-sparse.

Each module provides ``NAME``, ``SUMMARY``, ``STATS`` (its softmax-statistics tensors), ``default_tiles``,
``program`` (the tile program of one head), ``working_set`` (on-chip bytes a thread block allocates) and
``closed_form`` (counts of one head, proven equal to the program's walk by the tests).

Backward passes live in their own modules (``naive_bwd``, ``flash1_bwd``, ``flash2_bwd``, ``block_sparse_bwd``),
registered in ``BACKWARD`` under the name of the forward schedule whose outputs they consume. A module may declare
``UNIT = "kv_head"`` when its program runs one key/value head with its group of query heads (split-KV
decoding); the default unit is one query head.
"""

from __future__ import annotations

from types import ModuleType

from . import (
    block_sparse,
    block_sparse_bwd,
    flash1,
    flash1_bwd,
    flash2,
    flash2_bwd,
    flash3,
    flash_decoding,
    naive,
    naive_bwd,
)
from .base import ScheduleError, Tiles

SCHEDULES: dict[str, ModuleType] = {m.NAME: m for m in (naive, flash1, flash2, flash3, flash_decoding,
                                                          block_sparse)}
BACKWARD: dict[str, ModuleType] = {m.NAME: m for m in (naive_bwd, flash1_bwd, flash2_bwd, block_sparse_bwd)}
PASSES = ("forward", "backward", "both")


def get_schedule(name: str) -> ModuleType:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}: expected one of {', '.join(SCHEDULES)}") from None


def get_module(name: str, pass_: str = "forward") -> ModuleType:
    """The module of schedule ``name`` for ``pass_`` ("forward" or "backward")."""
    if pass_ == "forward":
        return get_schedule(name)
    if pass_ != "backward":
        raise ScheduleError(f"pass={pass_!r}: expected one of {', '.join(PASSES)}")
    get_schedule(name)  # an unknown name is reported as such
    try:
        return BACKWARD[name]
    except KeyError:
        raise ScheduleError(f"{name}: no backward pass is modeled; schedules with one: "
                            f"{', '.join(BACKWARD)}") from None


def unit_count(mod: ModuleType, problem) -> int:
    """How many times the module's one-unit program runs for the whole problem."""
    if getattr(mod, "UNIT", "head") == "kv_head":
        return problem.batch * problem.kv_heads
    return problem.n_heads_total


__all__ = ["BACKWARD", "PASSES", "SCHEDULES", "ScheduleError", "Tiles", "get_module", "get_schedule",
           "unit_count"]
