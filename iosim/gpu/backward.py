"""FlashAttention-2's backward pass on the GPU with iosim's kernels (kernels/flash_bwd.cu).

    >>> o, lse = gpu.attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = gpu.attention_backward(q, k, v, o, do, lse, causal=True)
    >>> opts = gpu.BackwardOptions(schedule="flash3", deterministic=True)  # Hopper's kernel, no atomic dQ
    >>> dq, dk, dv = gpu.attention_backward(q, k, v, o, do, lse, causal=True, options=opts)
    >>> gpu.last_launch()                      # the backward's kernels, grids, shared memory, tiles

Three kernels (Algorithm 2 of FlashAttention-2 as its kernels run it; counted by iosim/schedules/flash2_bwd.py as
``simulate("flash2", p, pass_="backward", gqa="grouped")`` at the tiles of :data:`iosim.launch.FLASH_BWD_TILES`):
Delta = rowsum(dO ∘ O) with the fp32 dQ accumulator cleared; the K/V-outer main kernel (dK, dV in registers, summed
over a grouped-query head's query heads; dQ added into the fp32 accumulator by L2 reductions); dQ converted to the
input dtype. ``BackwardOptions(deterministic=True)`` drops the reductions, whose order varies from run to run, for a
Q-outer kernel that recomputes S, P, dP and dS and writes dQ once: bit-identical results, two more GEMMs per (Q, K/V)
block pair.
Launch geometry and the shared-memory budget are in :mod:`iosim.launch.backward` (``FLASH_BWD_*``).
"""

from __future__ import annotations

from typing import Any

from iosim import launch
from iosim.gpu import build, flash3_bwd_host
from iosim.gpu._cupy import require_cupy
from iosim.gpu.attention import KernelLaunch, LaunchRecord, _Call, _record
from iosim.gpu.compiled import _kernel, _smem_limit
from iosim.gpu.inputs import (
    AttentionInputError,
    AttentionTypeError,
    BackwardOptions,
    SharedMemoryError,
    dtype_name,
    options_of,
    torch_of,
    torch_view,
    validate,
)

_LOG2E = 1.4426950408889634


def _as_view(cp: Any, x: Any, name: str) -> Any:
    """``x`` as a CuPy array: a CuPy array as is, a CUDA torch tensor viewed without copying (grad or not)."""
    if isinstance(x, cp.ndarray):
        return x
    torch = torch_of(x)
    view = torch_view(cp, x.detach() if torch is not None else x)
    if view is None:
        raise AttentionTypeError(f"{name}: got {type(x).__name__}; expected a CuPy array or a dense CUDA torch "
                                 "tensor of float16, bfloat16 (o, do) or float32 (lse)")
    return view


def _check_like(x: Any, name: str, shape: tuple[int, ...], dtype: str, device: int) -> None:
    if tuple(x.shape) != shape or dtype_name(x.dtype) != dtype or not x.flags.c_contiguous:
        raise AttentionInputError(f"{name}: {tuple(x.shape)} {x.dtype} (contiguous={x.flags.c_contiguous}); "
                                  f"expected a contiguous {shape} {dtype} array")
    if x.device.id != device:
        raise AttentionInputError(f"{name}: on device {x.device.id}; expected device {device}")
    if x.data.ptr % 16:
        raise AttentionInputError(f"{name}: data pointer {x.data.ptr:#x} is not 16-byte aligned")


def _flash2_main(c: Any, do: Any, lse: Any, delta: Any, acc: Any, dk: Any, dv: Any, limit: int):
    """(instance, grid, block, shared memory, arguments, tiles) of flash_bwd_kernel (mma.sync, any sm_80+)."""
    cp, i32 = c.cp, c.cp.int32
    B, N, H, D = (int(s) for s in c.q.shape)
    Nk, Hk = int(c.k.shape[1]), int(c.k.shape[2])
    Br, Bc = launch.FLASH_BWD_TILES[D]
    itemsize = build.ITEMSIZE[c.dtype]
    smem = launch.flash_bwd_smem_bytes(D, Br, Bc, itemsize)
    if smem > limit:
        raise SharedMemoryError(f"flash2 backward at head_dim={D}: needs {smem} B of shared memory per block "
                                f"({launch.flash_bwd_smem_terms(D, Br, Bc, itemsize)}); this device allows {limit} B")
    args = (c.q, c.k, c.v, do, lse, delta, acc if acc is not None else cp.uint64(0), dk, dv, i32(N), i32(Nk), i32(H),
            i32(Hk), cp.float32(c.scale), cp.float32(c.scale * _LOG2E))
    inst = build.FlashBwdInstance("main", c.dtype, D, Br, Bc, c.causal)
    return inst, (-(-Nk // Bc), Hk, B), (launch.FLASH_BWD_THREADS, 1, 1), smem, args, {"block_q": Br, "block_kv": Bc}


def _launch(c: Any, o: Any, do: Any, lse: Any, grads: tuple[Any, Any, Any], deterministic: bool, schedule: str):
    """Launch the backward's kernels for the checked call ``c`` (q, k, v, dtype, scale, causal): preprocess, the
    schedule's main kernel, then the dQ conversion (or the deterministic dQ kernel); returns the launches and the
    tiles, as :class:`iosim.gpu.LaunchRecord` holds them."""
    cp, i32 = c.cp, c.cp.int32
    B, N, H, D = (int(s) for s in c.q.shape)
    dq, dk, dv = grads
    delta = cp.empty((B, H, N), dtype=cp.float32)
    acc = None if deterministic else cp.empty((B, N, H, D), dtype=cp.float32)
    main = flash3_bwd_host.main_kernel if schedule == "flash3" else _flash2_main
    minst, mgrid, mblock, smem, margs, tiles = main(c, do, lse, delta, acc, dk, dv, _smem_limit(cp))
    rows, T = B * N * H, launch.FLASH_BWD_ROW_THREADS
    insts = [build.FlashBwdInstance("preprocess", c.dtype, D), minst]
    grids, blocks, smems = [(-(-rows * D // 8 // T), 1, 1), mgrid], [(T, 1, 1), mblock], [0, smem]
    args = [(o, do, delta, acc if acc is not None else cp.uint64(0), i32(N), i32(H), cp.int64(rows)), margs]
    if deterministic:
        bkv = launch.FLASH_BWD_DQ_BLOCK_KV[D]
        insts.append(build.FlashBwdInstance("dq", c.dtype, D, 64, bkv, c.causal))
        grids.append((-(-N // 64), H, B))
        blocks.append((launch.FLASH_BWD_DQ_THREADS, 1, 1))
        smems.append(launch.flash_bwd_dq_smem_bytes(D, bkv, build.ITEMSIZE[c.dtype]))
        args.append((c.q, c.k, c.v, do, lse, delta, dq, i32(N), i32(int(c.k.shape[1])), i32(H),
                     i32(int(c.k.shape[2])), cp.float32(c.scale), cp.float32(c.scale * _LOG2E)))
    else:
        chunks = rows * D // 8
        insts.append(build.FlashBwdInstance("convert", c.dtype))
        grids.append((-(-chunks // T), 1, 1))
        blocks.append((T, 1, 1))
        smems.append(0)
        args.append((acc, dq, cp.int64(chunks)))
    for inst, grid, block, m, a in zip(insts, grids, blocks, smems, args, strict=True):
        _kernel(cp, inst, m)(grid, block, a, shared_mem=m)
    return tuple(KernelLaunch(i.name_expression, g, b, m)
                 for i, g, b, m in zip(insts, grids, blocks, smems, strict=True)), tiles


def attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, causal: bool = False,
                       options: BackwardOptions | None = None) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) of attention given dO = dL/dO, with iosim's backward kernels.

    q, k, v: as :func:`iosim.gpu.attention` took them; o, lse: what it returned (``return_lse=True``; any forward
    schedule); do: like o. causal: as in the forward. dK and dV of a grouped-query kv head are the sums over its
    query heads. options: :class:`iosim.gpu.BackwardOptions`: the ``schedule`` ("flash2", kernels/flash_bwd.cu,
    mma.sync, the default; or "flash3", the FlashAttention-3 design, kernels/flash3_bwd.cu: TMA, wgmma, warp
    specialization, dQ by TMA bulk reduce-adds; Hopper (sm_90) only, head_dim 64 or 128, raising
    :class:`iosim.gpu.HopperRequiredError` elsewhere), the forward's ``scale``, ``deterministic`` (no atomic
    reductions: repeated calls give identical bits) and preallocated ``out`` = (dq, dk, dv). Returns arrays like q,
    k, v (torch tensors where q is one; the kernels run on torch's current stream).
    """
    cp = require_cupy()
    opts = options_of(options, BackwardOptions)
    schedule, deterministic, out = opts.schedule, opts.deterministic, opts.out
    if not isinstance(deterministic, bool):
        raise AttentionTypeError(f"deterministic={deterministic!r}: expected True or False")
    if schedule not in ("flash2", "flash3"):
        raise AttentionInputError(f"schedule={schedule!r}: the backward runs 'flash2' or 'flash3'")
    a = validate(cp, q, k, v, schedule, causal, opts.scale)
    B, N, H, D = (int(s) for s in a.q.shape)
    o_, do_, lse_ = _as_view(cp, o, "o"), _as_view(cp, do, "do"), _as_view(cp, lse, "lse")
    for name, x in (("o", o_), ("do", do_)):
        _check_like(x, name, (B, N, H, D), a.dtype, a.device)
    _check_like(lse_, "lse", (B, H, N), "float32", a.device)
    with cp.cuda.Device(a.device), a.stream():
        if out is None:
            (dq_ret, dq), (dk_ret, dk), (dv_ret, dv) = (a.empty(tuple(x.shape)) for x in (a.q, a.k, a.v))
        else:
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                raise AttentionTypeError(f"out: got {type(out).__name__}; expected a tuple (dq, dk, dv)")
            dq_ret, dk_ret, dv_ret = out
            dq, dk, dv = (_as_view(cp, x, n) for x, n in zip(out, ("dq", "dk", "dv")))
            for name, x, like in (("dq", dq, a.q), ("dk", dk, a.k), ("dv", dv, a.v)):
                _check_like(x, name, tuple(like.shape), a.dtype, a.device)
        c = _Call(cp, a.q, a.k, a.v, None, None, a.dtype, a.scale, causal)
        launches, tiles = _launch(c, o_, do_, lse_, (dq, dk, dv), deterministic, schedule)
    name = f"{schedule}_bwd" + ("_deterministic" if deterministic else "")
    _record(LaunchRecord(name, B, N, int(a.k.shape[1]), H, int(a.k.shape[2]), D, a.dtype, causal, tiles, launches))
    return dq_ret, dk_ret, dv_ret
