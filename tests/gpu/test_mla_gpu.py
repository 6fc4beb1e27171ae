"""torch's MLA attention on a real GPU: in decode, the kernel it runs is the one iosim.timing.mla describes, and its
step (iosim.calibrate.mla_step) is measured at every residency; in prefill, cuDNN's kernel at keys of 192 and values of
128 is the one iosim.timing.mla.PREFILL_REFERENCE names, its step, tile and call parts are measured
(iosim.calibrate.cudnn_step.cudnn_mla_part), and benchmarks/mla_prefill_record.py's reference equals float64."""

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


def kernels_of(torch, call) -> list[str]:
    """The CUDA kernels one warm ``call`` launches (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def test_torch_runs_the_kernel_the_model_describes(torch):
    from iosim.calibrate.mla_step import _call
    from iosim.timing.mla import REFERENCE

    names = kernels_of(torch, _call(torch, 2, 300))
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


def test_cudnn_runs_the_prefill_kernel_the_model_names(torch):
    from iosim.calibrate.cudnn_step import _sdpa_call
    from iosim.timing.mla import PREFILL_REFERENCE

    names = kernels_of(torch, _sdpa_call(torch, 4, 256, 300, 192, 128))
    assert any(n.startswith(PREFILL_REFERENCE.name) for n in names), names


def test_the_prefill_reference_equals_float64(torch):
    from helpers import load_benchmark

    record = load_benchmark("mla_prefill_record")
    assert record.check(torch) < record.CHECK_TOL


def test_cudnns_step_at_mlas_widths_is_measured(torch):
    from iosim.calibrate.backward_step import CALLS, REST_S
    from iosim.calibrate.cudnn_step import cudnn_mla_part
    from iosim.calibrate.rates_kernels import Bench, busy_timer
    from iosim.gpu._cupy import require_cupy

    cp = require_cupy()
    b = Bench(cp, 10)
    if not b.hopper:
        pytest.skip("GPU test: cuDNN's MLA-width step is measured on Hopper, where the prefill model describes it")
    got = {}
    cudnn_mla_part(b, lambda m, note: got.setdefault(m.path[1], m), busy_timer(b, cp, CALLS, 2, REST_S))
    assert sorted(got) == ["call_fixed", "step", "tile_fixed"]
    assert all(m.path[2:] == ("cudnn", "bf16-v128-128x128", 192) for m in got.values())
    # a 128 x 128 step of keys of 192 and values of 128 is about 2 us on an H100 or H200; a tile's and a call's
    # fixed parts a few us
    assert 0.5e-6 < got["step"].value < 10e-6
    assert 0 < got["tile_fixed"].value < 50e-6 and 0 < got["call_fixed"].value < 50e-6
