"""``calibration.forward.resident_step.torch-mla`` and ``call_fixed.torch-mla``: the step of the kernel torch runs for
MLA decode's attention (:mod:`iosim.timing.mla`), measured where torch runs here.

Why it is measured: the kernel (xFormers' CUTLASS kernel, 32 query rows a block, 128 keys a tile, its fp32 output
accumulator in global memory) is bound by latency and by its SM's share of L2, not by a rate the chip's calibration
holds, and how much of its step a second block hides is its code's: a block-step costs 11.9 us alone on an H200 and
8.7-9.1 us an SM once two or more share it (2026-11-28).

How (bf16, DeepSeek-V3's widths: queries and keys of 576, values the keys' first 512, as benchmarks/mla_record.py
calls it through ``scaled_dot_product_attention`` with the memory-efficient backend): sequences of 128 query rows
(one token of 128 heads: 4 blocks each) on a latent cache of their own, ceil(k x SMs / 4) of them, so k blocks run
on every SM; k = 1 .. the kernel's residency on this GPU's profile:

- ``resident_step.torch-mla.d576x512_32x128.<k>``: (t(64 tiles) - t(16 tiles)) / 48;
- ``call_fixed.torch-mla.d576x512_32x128.1``: the call at k = 1 and 2 tiles less its 2 steps (the launch, a block's
  start and its last tile's store of O).

Each time is the median of CALLS calls behind a busy kernel after a rest, as the other steps
(:mod:`iosim.calibrate.forward_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iosim.blocks import cdiv
from iosim.calibrate.backward_step import CALLS, REST_S, torch_or_none
from iosim.calibrate.forward_step import TILES, builtin_profile, step_from
from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer

ROWS = 128  # query rows a sequence: one token of DeepSeek-V3's 128 heads
FIXED_TILES = 2  # key tiles of the call the fixed part is taken from


def _call(torch, batch: int, kv_len: int) -> Callable[[], Any]:
    """torch's MLA attention on random bf16 inputs: ``batch`` sequences of ROWS rows, each on its own cache."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from iosim.schedules.mla_decode import NOPE, MlaDecode

    m = MlaDecode(batch=1, kv_len=1)
    q = torch.randn(batch, 1, ROWS, m.key_dim, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(batch, 1, kv_len, m.key_dim, device="cuda", dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def call():  # the softmax scale of DeepSeek-V3's query heads: 128 + 64 values a head
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return sdpa(q, cache, cache[..., :m.latent], scale=(NOPE + m.rope) ** -0.5)

    return call


def mla_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``forward.resident_step.torch-mla`` and ``forward.call_fixed.torch-mla`` (module docstring); said and
    skipped without torch, below sm_80 or without a built-in profile (the residency)."""
    from iosim.timing.mla import KERNEL, REFERENCE, reference, residency, step_key

    torch = torch_or_none()
    profile = builtin_profile(cp)
    if torch is None or int(cp.cuda.Device().compute_capability) < 80 or profile is None:
        print(f"forward: {KERNEL} skipped (torch's memory-efficient attention with CUDA, compute capability 8.0 and a "
              "built-in profile for this GPU are needed)", flush=True)
        return
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    key, per_seq = step_key(reference(1, 1)), cdiv(ROWS, REFERENCE.block_q)
    how = (f"torch's memory-efficient attention ({REFERENCE.name}) through scaled_dot_product_attention, bf16, "
           f"queries and keys of 576, values the keys' first 512: sequences of {ROWS} query rows ({per_seq} blocks "
           f"of {REFERENCE.block_q}) each on its own latent cache, ceil(k x {b.sms} / {per_seq}) of them (k blocks "
           f"on each SM); each time the median of {CALLS} calls behind a busy kernel after {REST_S} s idle")
    steps = {}
    for k in range(1, residency(profile) + 1):
        batch = cdiv(k * b.sms, per_seq)
        t = [seconds(_call(torch, batch, m * REFERENCE.block_kv)) for m in TILES]
        steps[k] = step_from(*t)
        report(Measured(("forward", "resident_step", KERNEL, key, k), steps[k], "s",
                        f"{how}: (time at {TILES[1]} key tiles - time at {TILES[0]}) / {TILES[1] - TILES[0]} "
                        "(iosim/calibrate/mla_step.py); by widths and tiles, then k"),
               f"{t[0] * 1e6:.1f} us at {TILES[0]} key tiles, {t[1] * 1e6:.1f} us at {TILES[1]}")
        torch.cuda.empty_cache()
    short = seconds(_call(torch, cdiv(b.sms, per_seq), FIXED_TILES * REFERENCE.block_kv))
    report(Measured(("forward", "call_fixed", KERNEL, key, 1), max(short - FIXED_TILES * steps[1], 1e-9), "s",
                    f"{how}: the call at k = 1 and {FIXED_TILES} key tiles less its {FIXED_TILES} steps "
                    "(iosim/calibrate/mla_step.py); by widths and tiles, then k"), f"{short * 1e6:.1f} us")
    torch.cuda.empty_cache()
