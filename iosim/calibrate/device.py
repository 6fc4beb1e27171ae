"""Which GPU the calibration runs on: its facts (name, SMs, compute capability, driver, CUDA) and the built-in
profile its name fits."""

from __future__ import annotations

import subprocess

from iosim.calibrate.rates_kernels import RatesError
from iosim.hardware.gpu import profiles_fitting


def guess_profile(device: str) -> str:
    """The built-in profile whose display name shares the most model tokens (H100, SXM5, 80GB ...) with the CUDA
    device name (:func:`iosim.hardware.gpu.profiles_fitting`); RatesError where none or several fit equally."""
    names = profiles_fitting(device)
    if len(names) != 1:
        raise RatesError(f"no built-in profile fits {device!r} by name ({', '.join(names) or 'none'}): "
                         "give --profile NAME|FILE")
    return names[0]


def device_facts(cp) -> dict:
    """Name, SM count, compute capability, driver and CUDA versions of device 0."""
    p = cp.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    v = cp.cuda.runtime.driverGetVersion()
    rt = cp.cuda.runtime.runtimeGetVersion()
    return {"device": name, "sms": p["multiProcessorCount"], "cc": f"{p['major']}.{p['minor']}",
            "driver": smi or f"CUDA driver API {v // 1000}.{v % 1000 // 10}",
            "cuda": f"{rt // 1000}.{rt % 1000 // 10} (CuPy {cp.__version__})"}
