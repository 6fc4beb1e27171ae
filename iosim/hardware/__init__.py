"""Hardware descriptions: what iosim knows of a GPU or a CPU, every number with its source.

* :mod:`iosim.hardware.gpu`: a GPU profile (:class:`Profile`: memory levels, SMs, peak rates) and its loading;
* :mod:`iosim.hardware.calibration`: a GPU profile's optional ``calibration`` section (rates measured by
  ``iosim calibrate rates``);
* :mod:`iosim.hardware.cpu`: a CPU profile (:class:`CpuProfile`: cores, caches, DRAM, measured rates);
* :mod:`iosim.hardware.sourced`: a number with where it comes from (``{value, source}``) and the units it is
  written in;
* ``profiles/*.yaml`` (GPUs) and ``profiles/cpu/*.yaml`` (CPUs): the built-in profiles, data files in the package.
"""

from .calibration import Calibration
from .cpu import CpuProfile, builtin_cpu_profile_names, get_cpu_profile, is_cpu_profile
from .gpu import DEFAULT_PROFILE, Profile, ProfileError, builtin_profile_names, get_profile, load_profile_file

__all__ = [
    "DEFAULT_PROFILE",
    "Calibration",
    "CpuProfile",
    "Profile",
    "ProfileError",
    "builtin_cpu_profile_names",
    "builtin_profile_names",
    "get_cpu_profile",
    "get_profile",
    "is_cpu_profile",
    "load_profile_file",
]
