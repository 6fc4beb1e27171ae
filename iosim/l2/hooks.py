"""Hooks for iosim.simulate: put the model's hbm bytes into a Result, or say why it does not apply.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

from dataclasses import fields, replace

from ..problem import AttentionProblem
from ..profile import Profile
from ._common import L2ModelError
from .cache import simulate_l2


def _unsupported(result) -> str | None:
    """Why the L2 model cannot take this result (None if it can)."""
    if getattr(result, "pass_", "forward") != "forward":
        return f"pass {result.pass_!r}: the L2 model knows the forward kernels' launches only"
    if result.schedule not in ("naive", "flash1", "flash2"):
        return f"schedule {result.schedule!r}: no launch geometry known to the L2 model"
    if result.schedule != "flash2":  # traced by the Python tracer: bound its length
        p, t = result.problem, result.tiles
        tile_rows = min(t.block_q or p.seq_len, t.block_kv or p.kv_len)
        per_head = (result.counts.global_read_bytes + result.counts.global_write_bytes) // p.n_heads_total
        est = per_head // max(1, tile_rows * p.head_dim * p.elem_bytes) + p.seq_len
        if est > MAX_TRACED_ACCESSES:
            return (
                f"{result.schedule}: about {est:,} tile accesses per head, too many for the Python tracer "
                f"(limit {MAX_TRACED_ACCESSES:,})"
            )
    return None


MAX_TRACED_ACCESSES = 1_000_000  # about 2.5 s of Python tracing


def _with_model(result, text: str, **changes):
    names = {f.name for f in fields(result)}
    if "hbm_model" in names:
        return replace(result, hbm_model=text, **changes)
    new = replace(result, **changes)
    new.hbm_model = text
    return new


def apply_l2(
    result, *, capacity: int | None = None, dedupe: bool = True, miss_curve=None, strict: bool = False
):
    """A copy of an :class:`iosim.simulate.Result` whose ``hbm`` bytes (and predicted time) come from the L2 model.

    Where the model does not apply (backward pass, a schedule without a known launch, a trace too long for the
    Python tracer) the result is returned with ``hbm`` = ``global`` and ``hbm_model`` saying why (``strict``:
    raise :class:`L2ModelError` instead). ``hbm_model`` is set as a field when ``Result`` has one, else as an
    attribute; ``l2`` (the :class:`L2Result`) as an attribute."""
    from ..roofline import predict

    reason = _unsupported(result)
    if reason:
        if strict:
            raise L2ModelError(reason)
        return _with_model(result, f"none: {reason}; hbm = global (two-level view)")
    l2 = simulate_l2(
        result.schedule,
        result.problem,
        result.tiles,
        result.profile,
        capacity=capacity,
        dedupe=dedupe,
        miss_curve=miss_curve,
    )
    if len(l2.kernels) != len(result.counts.kernels):
        raise L2ModelError(
            f"{result.schedule}: the L2 model saw {len(l2.kernels)} kernels, the counts "
            f"{len(result.counts.kernels)}"
        )
    hbm_read = [k.dram_read for k in l2.kernels]
    hbm_write = [k.dram_write for k in l2.kernels]
    time = predict(
        result.counts,
        [r + w for r, w in zip(hbm_read, hbm_write, strict=True)],
        result.problem.dtype,
        result.profile,
    )
    text = (
        f"l2-lru: {l2.describe()}; L2 flushed before each kernel, dirty lines left at the end not written "
        "(Nsight Compute's conditions); iosim.l2"
    )
    new = _with_model(result, text, hbm_read=hbm_read, hbm_write=hbm_write, time=time)
    new.l2 = l2  # the model's details (per-tensor misses, residency, dirty bytes left at the end)
    return new


def simulate_hbm(schedule: str, problem: AttentionProblem, profile: str | Profile | None = None, **kw):
    """``iosim.simulate.simulate`` followed by :func:`apply_l2` (keywords ``capacity``, ``dedupe``, ``miss_curve``,
    ``strict`` go to the L2 model, the rest to ``simulate``)."""
    import inspect

    from ..simulate import simulate

    l2kw = {k: kw.pop(k) for k in ("capacity", "dedupe", "miss_curve", "strict") if k in kw}
    if "l2" in inspect.signature(simulate).parameters:
        kw.setdefault("l2", False)  # applied once, below, with the keywords given here
    return apply_l2(simulate(schedule, problem, profile, **kw), **l2kw)
