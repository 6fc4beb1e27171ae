"""Shared test settings: hypothesis profiles and the GPU marker.

* Hypothesis: profile ``dev`` (default, 100 examples) and ``ci`` (loaded where ``CI`` is set:
  derandomized, no deadline, fewer examples so the suite stays within CI's time).
* ``@pytest.mark.gpu`` tests are skipped, with the reason, where CuPy or an NVIDIA GPU is missing.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    return None


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
