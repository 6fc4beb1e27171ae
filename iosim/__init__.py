"""iosim: exact memory-traffic simulation of attention schedules across DRAM, L2 and SRAM.

``import iosim`` needs neither CuPy nor a GPU; :mod:`iosim.gpu` imports CuPy lazily.
"""

from ._version import __version__
from .hardware.gpu import Profile, ProfileError, get_profile
from .problem import AttentionProblem, ProblemError
from .schedules import SCHEDULES, ScheduleError, Tiles
from .simulate import Result, simulate

__all__ = [
    "SCHEDULES",
    "AttentionProblem",
    "ProblemError",
    "Profile",
    "ProfileError",
    "Result",
    "ScheduleError",
    "Tiles",
    "__version__",
    "get_profile",
    "simulate",
]
