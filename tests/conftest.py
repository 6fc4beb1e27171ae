"""Shared test settings: hypothesis profiles and the GPU marker.

* Hypothesis, two profiles:
  - ``dev`` (the default, where ``CI`` is not set): 100 examples, derandomized, so a local run draws the same
    examples every time and a failure seen once is seen again; no deadline (a laptop's timing is not a bug).
  - ``ci`` (where ``CI`` is set; ``.ci/run``): 60 **new random examples** per test on every run (``derandomize``
    off) from the seed CI prints (``.ci/run`` passes ``--hypothesis-seed``), so CI explores beyond what the
    derandomized runs cover, and ``pytest --hypothesis-seed=SEED`` replays a failure, as does the
    ``@reproduce_failure`` blob it prints; no example database (nothing carried between runs); a fixed deadline,
    :data:`CI_DEADLINE`, per example.
  ``HYPOTHESIS_PROFILE=ci`` or ``dev`` picks one explicitly. A test's own ``@settings`` override its profile's.
* ``@pytest.mark.gpu`` tests are skipped, with the reason, where CuPy or an NVIDIA GPU is missing.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings

# The slowest property's examples take up to about 0.3 s on a 2-core machine (--hypothesis-show-statistics, CI
# profile, cold numba cache, 2026-11-26); 5 s leaves room for a busy machine. An example that compiles numba code
# on its first call (15 s) would exceed it and fail as flaky: such tests compile in a fixture first (test_cpu.py).
CI_DEADLINE = timedelta(seconds=5)

settings.register_profile("dev", max_examples=100, deadline=None, derandomize=True)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=CI_DEADLINE,
    derandomize=False,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def pytest_report_header(config):
    seed = config.getoption("hypothesis_seed", default=None)
    drawn = "derandomized" if settings.default.derandomize else (f"seed {seed}" if seed is not None else
                                                                    "a random seed per test")
    return f"hypothesis profile {PROFILE!r}: {settings.default.max_examples} examples, {drawn}, deadline " \
           f"{settings.default.deadline}"


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
