"""``calibration.forward`` of cuDNN's fused forward, measured as :mod:`iosim.calibrate.forward_step` measures iosim's
flash3 forward (a K/V step from calls at 16 and 64 K/V tiles of one Q tile an SM on one kv head, then what a tile and a
call cost beyond their steps), on Hopper.

``calibration.forward.{step,tile_fixed,call_fixed}.cudnn.fp8``: the same three parts of cuDNN's fused fp8 forward
(cudnn-frontend's sdpa_fp8 through :mod:`iosim.calibrate.cudnn_fp8`, e4m3 inputs and output, as the fp8 time record
runs it), where torch and cudnn-frontend import: its step, like ours, is its code's (the composed one priced its
d = 256 rows 13-25% fast). Its tile and call parts are the slope and intercept of the calls at 1 to
:data:`CUDNN_TILES` Q tiles an SM (at SHORT_TILES K/V tiles) less SHORT_TILES steps: from two calls at 16 K/V tiles it
came out within the noise of their 70 us difference.

``calibration.forward.{step,tile_fixed,call_fixed}.cudnn.bf16-v128-128x128``: the same three parts of cuDNN's bf16
forward through torch SDPA's cuDNN backend at MLA prefill's widths, keys of 192 and values of 128 (the kernel
:data:`iosim.timing.mla.PREFILL_REFERENCE` names, its 128 x 128 tiles), where torch runs it: the composed step put
torch's MLA prefill 2-19% fast (docs/serving.md). Keyed by the keys' width (192) under
:func:`iosim.timing.fa3.value_key`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from iosim.calibrate import cudnn_fp8
from iosim.calibrate.backward_step import CALLS, REST_S, torch_or_none
from iosim.calibrate.forward_step import SHORT_TILES, TILES, _method, _report_parts, _timed
from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer

CUDNN = "cudnn"  # cuDNN's fused forward (torch SDPA's cudnn backend; fp8 through cudnn-frontend)
# Q tiles a block its tile part is fitted over (1 to this; two leave it within noise: 0 to 1.5 us on the H100 and H200)
CUDNN_TILES = 4


def cudnn_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``forward.step``, ``tile_fixed`` and ``call_fixed`` of cuDNN's fp8 forward at each head dim and of its
    bf16 forward at MLA prefill's widths (Hopper only; elsewhere said and skipped)."""
    if not b.hopper:
        print("forward: cuDNN skipped (its parts are measured on Hopper, where its description's tiles are)",
              flush=True)
        return
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    cudnn_fp8_part(b, report, seconds)
    cudnn_mla_part(b, report, seconds)


def cudnn_fp8_part(b: Bench, report: Callable[[Measured, str], None], seconds: Callable[[Any], float]) -> None:
    """``forward.step``, ``tile_fixed`` and ``call_fixed`` of ``cudnn`` (cuDNN's fused forward, fp8 e4m3 through
    cudnn-frontend, its fp8 output as the time record runs it) at each head dim of its description's fp8 tiles,
    measured as flash3_part measures ours (Hopper, with torch and cudnn-frontend; elsewhere said and skipped)."""
    try:
        import cudnn
        import torch
    except ImportError as exc:
        print(f"forward: cuDNN fp8 skipped (needs torch and nvidia-cudnn-frontend: {exc})", flush=True)
        return
    from iosim.timing import load_kernel

    desc, handle = load_kernel(CUDNN), cudnn_fp8.open_handle(torch, cudnn)
    for d in sorted(desc.fp8_tiles):
        tc = desc.tiles_for(d, "fp8")
        shapes = [(b.sms, n * tc.block_kv) for n in TILES] + [(m * b.sms, SHORT_TILES * tc.block_kv)
                                                                for m in range(1, CUDNN_TILES + 1)]
        times = _timed(f"forward.step.{CUDNN}.fp8.{d}", seconds,
                       [partial(_cudnn_call, torch, cudnn, handle, h, tc.block_q, nk, d) for h, nk in shapes])
        if times is None:
            continue
        what = (f"cuDNN's fused forward through cudnn-frontend (sdpa_fp8, e4m3 inputs quantized per tensor "
                f"beforehand, e4m3 output), no mask, {b.sms} query heads of Br = {tc.block_q} queries on one kv head "
                f"(a Q tile on each SM, K/V in L2; its description's Bc = {tc.block_kv}): {_method()}; by head dim")
        _report_parts(report, (CUDNN, "fp8", d), times, tc, what)
        torch.cuda.empty_cache()


def cudnn_mla_part(b: Bench, report: Callable[[Measured, str], None], seconds: Callable[[Any], float]) -> None:
    """``forward.step``, ``tile_fixed`` and ``call_fixed`` of ``cudnn`` at MLA prefill's widths (bf16, keys of 192,
    values of 128, through torch SDPA's cuDNN backend, GQA onto one kv head), measured as :func:`cudnn_fp8_part`
    measures its fp8 forward (Hopper, with torch; elsewhere said and skipped)."""
    from iosim.schedules.mla_decode import VALUE
    from iosim.timing.fa3 import value_key
    from iosim.timing.mla import PREFILL_REFERENCE as ref
    from iosim.timing.mla import prefill_reference

    torch = torch_or_none()
    if torch is None:
        print("forward: cuDNN at MLA's widths skipped (needs torch with CUDA)", flush=True)
        return
    d, tc = prefill_reference(1, 1).key_dim, ref  # the keys' width (192); the reference's tiles (Br, Bc)
    kind = value_key("bf16", VALUE, tc)
    shapes = [(b.sms, n * tc.block_kv) for n in TILES] + [(m * b.sms, SHORT_TILES * tc.block_kv)
                                                            for m in range(1, CUDNN_TILES + 1)]
    times = _timed(f"forward.step.{CUDNN}.{kind}.{d}", seconds,
                   [partial(_sdpa_call, torch, h, tc.block_q, nk, d, VALUE) for h, nk in shapes])
    if times is None:
        return
    what = (f"cuDNN's bf16 forward through torch SDPA's cuDNN backend ({ref.name}), queries and keys of {d} "
            f"values, values of {VALUE} (MLA prefill's), no mask, {b.sms} query heads of Br = {tc.block_q} queries "
            f"on one kv head (a Q tile on each SM, K/V in L2; Bc = {tc.block_kv}): {_method()}; by the keys' width")
    _report_parts(report, (CUDNN, kind, d), times, tc, what)
    torch.cuda.empty_cache()


def _sdpa_call(torch, heads: int, n: int, nk: int, d: int, dv: int) -> Callable[[], Any]:
    """torch SDPA's cuDNN backend on random bf16 inputs: ``heads`` query heads of ``n`` queries of ``d`` values on
    one kv head of ``nk`` keys (``d`` values) and values (``dv``), ready to time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, nk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, nk, dv, device="cuda", dtype=torch.bfloat16)

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return call


def _cudnn_call(torch, cudnn, handle, heads: int, n: int, nk: int, d: int) -> Callable[[], Any]:
    """cuDNN's fp8 forward on random inputs, ``heads`` query heads of ``n`` queries on one kv head of ``nk`` keys,
    quantized beforehand, ready to time (raises why where cuDNN builds no plan)."""
    q = torch.randn(1, n, heads, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, nk, 1, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    call, note = cudnn_fp8.prepare(torch, cudnn, handle, (q, k, v), False, out_types=("fp8",))
    if call is None:
        raise RuntimeError(f"cuDNN builds no fp8 plan here: {note}")
    return call
