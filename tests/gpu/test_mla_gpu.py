"""torch's MLA decode attention on a real GPU: the kernel it runs is the one iosim.timing.mla describes, and its
step (iosim.calibrate.mla_step) is measured at every residency."""

from __future__ import annotations

import pytest

from iosim.gpu import GPUUnavailableError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    try:
        from iosim.gpu._cupy import require_cupy

        require_cupy()
    except GPUUnavailableError as exc:
        pytest.skip(f"GPU test: {exc}")
    from iosim.calibrate.backward_step import torch_or_none

    t = torch_or_none()
    if t is None:
        pytest.skip("GPU test: torch with CUDA is needed for its memory-efficient attention")
    return t


def test_torch_runs_the_kernel_the_model_describes(torch):
    from torch.profiler import ProfilerActivity, profile

    from iosim.calibrate.mla_step import _call
    from iosim.timing.mla import REFERENCE

    call = _call(torch, 2, 300)
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert any(n.startswith(REFERENCE.name) for n in names), names


def test_its_step_is_measured_at_every_residency(torch):
    from iosim.calibrate.forward_step import builtin_profile
    from iosim.calibrate.mla_step import mla_part
    from iosim.calibrate.rates_kernels import Bench
    from iosim.gpu._cupy import require_cupy
    from iosim.timing.mla import KERNEL, residency

    cp = require_cupy()
    profile = builtin_profile(cp)
    if profile is None:
        pytest.skip("GPU test: no built-in profile for this GPU (the kernel's residency)")
    got = []
    mla_part(Bench(cp, 10), cp, lambda m, note: got.append(m))
    steps = {m.path[-1]: m.value for m in got if m.path[:3] == ("forward", "resident_step", KERNEL)}
    fixed = [m.value for m in got if m.path[:3] == ("forward", "call_fixed", KERNEL)]
    assert sorted(steps) == list(range(1, residency(profile) + 1)) and len(fixed) == 1
    # a block-step of 576 + 512 columns on 32 x 128 is microseconds; k blocks sharing an SM take longer than one, and
    # less than k lone ones (they hide part of one another)
    assert 1e-6 < steps[1] < 1e-4 and 0 < fixed[0] < 1e-4
    for k in range(2, len(steps) + 1):
        assert steps[1] < steps[k] < k * steps[1]
