"""``calibration.backward.step``: the seconds a thread block of a backward kernel spends on one step (one Q block of
Br queries against its K/V block of Bc keys), on this GPU, for iosim's two backward kernels and, where torch runs
here, torch SDPA's FlashAttention-2 and cuDNN backward.

Why it is measured: a step is five GEMMs, the exponentials and the dS arithmetic of Br x Bc scores, in phases that a
block-wide barrier keeps in step, with two warps (mma.sync) or one warpgroup's worth of work (wgmma) on each
scheduler. How much of a phase's shared-memory traffic a kernel hides under its multiplies is its code's, not the
chip's: Nsight Compute on an H100 (2026-11-27, bf16, B = 4, N = 4096, non-causal) counts the same shared-memory
wavefronts a step in iosim's flash2 backward and FlashAttention-2's (5,325 and 5,189 at d = 128, within 3% of the
bytes iosim.timing.fa2_bwd counts) and the same tensor work, yet 8,859 against 8,068 cycles a step (d = 64: 10,001
against 8,696; d = 256: 11,780 against 9,611). The rates of the chip price both alike, so the kernel's own step is
timed.

How: one wave of one thread block on every SM, all on one head (batch 1, one head of SMs · Bc keys, so the grid
is one block a SM), bf16, no mask; the queries grow from N1 to N2, so each block visits (N2 − N1) / Br more Q
blocks whatever its fixed costs (start, K_j and V_j, dK_j and dV_j written, the launch) are: step = (t(N2) −
t(N1)) · Br / (N2 − N1). With every block on one head, a step's Q_i, dO_i and the dQ_i rows it adds into are
shared by all of them and stay in L2: the step measured is the kernel's own, without DRAM. How it grows where few
blocks share a head (H100, 2026-11-27, this measurement with the SMs split into heads of 4, 8, 32, 66 and 132 K/V
blocks): iosim's flash2 backward at d = 128 5.95, 5.36, 4.85, 4.69 and 4.64 us, FlashAttention-2's 5.92, 5.16,
4.37, 4.27, 4.24 us, cuDNN's 3.99, 2.98, 2.32, 2.23 and 2.20 us; that growth is not in the models yet
(docs/timing.md). Each time is the median CUDA-event time of CALLS calls queued behind a busy kernel, as the
time records time theirs, after a rest: a few milliseconds of tensor work from rest, before the board's power
limiter acts (:mod:`iosim.timing.clock`), so the step is at the clock the other rates were measured at.
The three kernels of a call (Delta, the main kernel, dQ's conversion) are all timed; their rows grow with N too, by
under 2% of the main kernel's growth (the two row kernels stream the Q block's rows once).

``calibration.backward.tile_fixed``: what a further work tile costs an SM beyond its steps. Two more calls at
SHORT_STEPS · Br queries (a short tile) have one and two K/V blocks for each SM on the head (a second wave of
blocks, or a second tile for a persistent block); the Q rows, so the two row kernels, are the same in both:
tile_fixed = t2 − t1 − SHORT_STEPS · step. It is the block's start, K_j and V_j's loads, dK_j and dV_j's stores and
the pipeline's fill and drain, as far as the kernel does not hide them under its steps: the kernel's code, which the
composed per-tile parts (iosim.timing.fa2_bwd, fa3_bwd) price from the chip's rates alone. The K/V of both calls
stay in L2. Why short tiles: what a tile costs beyond its steps shrinks as tiles grow (H200, 2026-11-28, the
second tile an SM less its steps at 4, 8, 16 and 32 steps a tile, Br = 64: cuDNN's at d = 128 4.7, 3.6, 2.7 and
1.7 us, FA2's 3.7, 3.6, 2.0 and 0.4), so it matters, and is best measured, where tiles are short (the records'
short and causal rows); measured at N1 (16 steps a tile at Br = 64) it was the small difference of two large
times: 1.0-3.1 us for torch's and cuDNN's kernels, whose 4-step tiles pay 2.6-4.7 (docs/timing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer

N1, N2 = 1024, 4096  # queries of the head, the step's two calls
SHORT_STEPS = 4  # steps a tile in tile_fixed's two calls (SHORT_STEPS x Br queries)
CALLS = 15  # timed calls of each (median), queued behind a busy kernel
REST_S = 0.2  # idle seconds before each timing, so each starts from rest (the power limiter)
KERNELS = ("iosim-flash2-bwd", "iosim-flash3-bwd", "fa2-bwd", "cudnn-bwd")  # timing descriptions: the table's keys


def step_from(t1: float, t2: float, block_q: int) -> float:
    """Seconds a step from the calls at N1 and N2 queries: the time a block adds per Q block it visits."""
    return max(t2 - t1, 1e-12) * block_q / (N2 - N1)


def tile_fixed_from(one_tile: float, two_tiles: float, step: float) -> float:
    """Seconds a further work tile costs beyond its steps, from the calls of SHORT_STEPS-step tiles with one and two
    K/V blocks an SM and the step (module docstring); at least 1 ns (a measurement noisier than the part)."""
    return max(two_tiles - one_tile - SHORT_STEPS * step, 1e-9)


def _ours(cp, schedule: str, n: int, nk: int, d: int) -> Callable[[], Any]:
    """iosim's backward (``schedule``) on random bf16 inputs of one head, its forward's O and lse, ready to time."""
    import ml_dtypes

    from iosim import gpu

    bf16 = ml_dtypes.bfloat16
    q, do = (cp.random.standard_normal((1, n, 1, d), dtype=cp.float32).astype(bf16) for _ in range(2))
    k, v = (cp.random.standard_normal((1, nk, 1, d), dtype=cp.float32).astype(bf16) for _ in range(2))
    o, lse = gpu.attention(q, k, v, return_lse=True)
    opts = gpu.BackwardOptions(schedule=schedule, out=tuple(cp.empty_like(x) for x in (q, k, v)))
    return lambda: gpu.attention_backward(q, k, v, o, do, lse, options=opts)


def torch_backward(torch, backend: str, q, k, v, do, causal: bool = False, scale: float | None = None
                   ) -> Callable[[], Any]:
    """A zero-argument call of torch SDPA's ``backend`` ("flash" or "cudnn") backward, its aten op, on its own
    forward's outputs (the forward runs here, once); q, k, v, do (batch, tokens, heads, d) as iosim.gpu takes them
    (the time records and the benchmarks call it the same way)."""
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
    aten = torch.ops.aten
    if backend == "flash":
        o, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(qt, kt, vt, 0.0, causal,
                                                                                           False, scale=scale)
        return lambda: aten._scaled_dot_product_flash_attention_backward(dot, qt, kt, vt, o, lse, cq, ck, mq, mk,
                                                                          0.0, causal, seed, off, scale=scale)
    o, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, 0.0,
                                                                                       causal, False, scale=scale)
    return lambda: aten._scaled_dot_product_cudnn_attention_backward(dot, qt, kt, vt, o, lse, seed, off, None, cq,
                                                                      ck, mq, mk, 0.0, causal, scale=scale)


def _torch(torch, backend: str, n: int, nk: int, d: int) -> Callable[[], Any]:
    """torch SDPA's ``backend`` backward on random bf16 inputs of one head (:func:`torch_backward`), ready to time."""
    q, k, v, do = (torch.randn(1, tokens, 1, d, device="cuda", dtype=torch.bfloat16) for tokens in (n, nk, nk, n))
    return torch_backward(torch, backend, q, k, v, do)


def torch_or_none():
    """torch with a CUDA device, or None (the peers' steps are then not measured)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def backward_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``backward.step`` and ``backward.tile_fixed`` of each backward description (:data:`KERNELS`) at each
    head dim its tiles list, where the kernel runs on this GPU; report each (a kernel that refuses is said and
    skipped)."""
    from iosim.timing import load_kernel

    cc = int(cp.cuda.Device().compute_capability)
    if cc < 80:
        print(f"backward: skipped (iosim's backward kernels need compute capability 8.0; this GPU is {cc / 10:.1f})",
              flush=True)
        return
    torch = torch_or_none()
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    for name in KERNELS:
        desc = load_kernel(name)
        for d in sorted(desc.tiles):
            tc = desc.tiles_for(d)
            nk, short = b.sms * tc.block_kv, SHORT_STEPS * tc.block_q  # one K/V block a SM, all of one head
            try:
                calls = [_call(cp, torch, name, n, keys, d) for n, keys in ((N1, nk), (N2, nk), (short, nk),
                                                                            (short, 2 * nk))]
                times = [seconds(call) for call in calls]
            except _Skip as exc:
                print(f"backward.step.{name}.{d}: skipped ({exc})", flush=True)
                continue
            except Exception as exc:  # the kernel refuses this head dim or GPU (torch's backends, sm_90a only)
                print(f"backward.step.{name}.{d}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})",
                      flush=True)
                continue
            what = (f"the {name} backward (its timing description's tiles), bf16, no mask, one block on each of "
                    f"{b.sms} SMs (batch 1, one head of {b.sms} K/V blocks): (time at {N2} queries - time at {N1}) x "
                    f"Br / {N2 - N1}, each the median of {CALLS} calls behind a busy kernel after {REST_S} s idle "
                    "(iosim/calibrate/backward_step.py); by head dim")
            step = step_from(*times[:2], tc.block_q)
            report(Measured(("backward", "step", name, d), step, "s", what),
                   f"{times[0] * 1e6:.1f} us at {N1} queries, {times[1] * 1e6:.1f} us at {N2} (Br = {tc.block_q})")
            report(Measured(("backward", "tile_fixed", name, d), tile_fixed_from(*times[2:], step), "s",
                            f"the same kernel and inputs at {SHORT_STEPS} x Br queries ({SHORT_STEPS} steps a tile) "
                            f"with two K/V blocks for each SM on the head ({2 * b.sms} K/V blocks): time - the "
                            f"one-block call's - {SHORT_STEPS} steps (iosim/calibrate/backward_step.py); by head dim"),
                   f"{times[2] * 1e6:.1f} / {times[3] * 1e6:.1f} us with one / two K/V blocks an SM")
            del calls
            cp.get_default_memory_pool().free_all_blocks()


class _Skip(Exception):
    """A kernel that cannot be measured here (no torch)."""


def _call(cp, torch, name: str, n: int, nk: int, d: int) -> Callable[[], Any]:
    if name.startswith("iosim-"):
        return _ours(cp, "flash3" if "flash3" in name else "flash2", n, nk, d)
    if torch is None:
        raise _Skip("torch with CUDA is not importable here")
    return _torch(torch, "flash" if name == "fa2-bwd" else "cudnn", n, nk, d)
