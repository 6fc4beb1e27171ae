"""The schedules iosim knows, one module each: naive, flash1, flash2.

Each module provides ``NAME``, ``SUMMARY``, ``STATS`` (its softmax-statistics tensors), ``default_tiles``,
``program`` (the tile program of one head), ``working_set`` (on-chip bytes a thread block allocates) and
``closed_form`` (counts of one head, proven equal to the program's walk by the tests).
"""

from __future__ import annotations

from types import ModuleType

from . import flash1, flash2, naive
from .base import ScheduleError, Tiles

SCHEDULES: dict[str, ModuleType] = {m.NAME: m for m in (naive, flash1, flash2)}


def get_schedule(name: str) -> ModuleType:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}: expected one of {', '.join(SCHEDULES)}") from None


__all__ = ["SCHEDULES", "ScheduleError", "Tiles", "get_schedule"]
