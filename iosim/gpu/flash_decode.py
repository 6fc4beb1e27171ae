"""Flash-Decoding on the GPU with iosim's kernels (``kernels/flash_decode.cu``): 1 to 16 new tokens per sequence
against a contiguous or paged KV cache, per-sequence lengths, grouped-query heads packed so each K/V byte is read
once per kv head, the keys split across thread blocks and merged by their log-sum-exp.

    >>> from iosim import gpu
    >>> o, lse = gpu.decode(q, k_cache, v_cache, seqlens_k=lens)                    # contiguous (B, N_max, H_kv, d)
    >>> o, lse = gpu.decode(q, k_pages, v_pages, seqlens_k=lens, block_table=bt)    # paged (pages, page, H_kv, d)
    >>> plan = gpu.plan_decode(q, k_pages, v_pages, seqlens_k=lens, block_table=bt)  # check and upload once ...
    >>> o, lse = plan.run(q, k_pages, v_pages)                                       # ... run many times (layers)
    >>> kq, vq = gpu.quantize_kv_fp8(k_pages), gpu.quantize_kv_fp8(v_pages)           # an fp8 (e4m3) cache:
    >>> o, lse = gpu.decode(q, kq, vq, seqlens_k=lens, block_table=bt)                # QuantizedKV(values, scale)

A plan holds the checked lengths and block table on the device, the split choice and (several splits) the split
kernel's partial outputs; building one reads the lengths and table on the host (one small synchronizing copy where
they are on the GPU). ``run`` checks only shapes,
dtypes and layout and never synchronizes. An fp8 cache (:class:`~iosim.gpu.decode_inputs.QuantizedKV` pairs of e4m3
values and a scale per kv head) halves the bytes decode streams: the kernel converts e4m3 to fp16 exactly (K's mma
fragments straight from its shared-memory ring, V through a per-warp fp16 tile), multiplies in fp16 and folds the
scales into the softmax scale and the output. Geometry and the occupancy rule: :mod:`iosim.launch.decode`; the
argument checks: :mod:`iosim.gpu.decode_inputs`; the split count: :mod:`iosim.timing.decode_split` (the time
model's fastest on the GPU's profile).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from iosim.gpu import build
from iosim.gpu._cupy import GPUUnavailableError, require_cupy
from iosim.gpu.attention import KernelLaunch
from iosim.gpu.build_decode import DecodeInstance
from iosim.gpu.compiled import _kernel, _smem_limit
from iosim.gpu.decode_inputs import (
    DecodeShapes,
    QuantizedKV,
    check_block_table,
    check_kv_scales,
    check_seqlens,
    check_shapes,
    host_ints,
    host_scales,
)
from iosim.gpu.driver import launch_dependent
from iosim.gpu.inputs import (
    AttentionInputError,
    SharedMemoryError,
    _as_cupy,
    _check_array,
    check_scale,
    dtype_name,
    output_array,
    torch_of,
    torch_stream,
)
from iosim.hardware.gpu import Profile, get_profile, profiles_fitting
from iosim.launch import decode as geo
from iosim.problem import AttentionProblem
from iosim.timing.decode_split import kernel_split
from iosim.timing.kernels import load_kernel

_LOG2E = 1.4426950408889634
# Tests set this to fill the split kernel's partial outputs with NaN before each launch, so a partial the combine
# kernel reads but no block wrote fails the comparison instead of passing on stale memory.
POISON_PARTIALS = False
# The combine as a programmatic dependent launch of the split kernel where the GPU has it (sm_90+): its blocks start
# on the SMs the split kernel's last blocks free and wait there for its partials (kernels/flash_decode.cu, v7).
DEPENDENT_COMBINE = True


class Decoded(NamedTuple):
    """What :func:`decode` returns: O like q (batch, q_len, heads, head_dim) and lse (batch, heads, q_len) fp32,
    natural log (-inf, with O = 0, for a row that sees no key)."""

    o: Any
    lse: Any


@dataclass(frozen=True)
class DecodePlan:
    """One batch layout, checked and on the device: run it on any q, k, v of these shapes (every layer of a model).
    With several splits it holds the split kernel's partial outputs, so its calls allocate nothing and a CUDA graph
    can capture them; run one plan on one stream at a time (calls on two streams at once: a plan each)."""

    shapes: DecodeShapes
    split: geo.SplitChoice
    scale: float
    kv_lens: tuple[int, ...]  # host copy of seqlens_k
    seqlens: Any  # CuPy int32 (batch,)
    table: Any  # CuPy int32 (batch, max_pages), or None for a contiguous cache
    launches: tuple[KernelLaunch, ...]  # the split kernel, then the combine kernel where splits > 1
    device: int
    split_rule: str = "occupancy"  # how the splits were chosen: "forced", "time model (<profile>)" or "occupancy"
    dependent_combine: bool = False  # sm_90+: the combine is a programmatic dependent launch of the split kernel
    partials: tuple[Any, Any] | None = None  # splits > 1: the split kernel's fp32 (o_part, lse_part), the plan's own

    @property
    def splits(self) -> int:
        return self.split.splits

    def run(self, q: Any, k_cache: Any, v_cache: Any, out: tuple[Any, Any] | None = None) -> Decoded:
        """O and lse for q against the cache; ``out``: an optional (o, lse) pair of preallocated outputs (either
        may be None), CuPy arrays or CUDA torch tensors, every element overwritten and returned as given. torch in,
        torch out: the kernels then run on torch's current stream. An fp8 cache's scales come with each call's
        QuantizedKV pairs (another layer's may differ): float32 (kv_heads,) device arrays are read as they are
        (shape, dtype and device checked, values not: plan_decode checked the plan's); a number is copied to the
        device once (cached); host arrays are checked and copied to the device every call."""
        cp = require_cupy()
        qc, kc, vc, raw = _as_inputs(cp, q, k_cache, v_cache)
        self._check_same(qc, kc, vc)
        scales = self._scales(cp, *raw)
        torch = torch_of(q)
        s = self.shapes
        with cp.cuda.Device(self.device), (torch_stream(cp, torch, self.device) if torch else nullcontext()):
            o_ret, o = output_array(cp, torch, out[0] if out else None, (s.batch, s.q_len, s.heads, s.head_dim),
                                    (qc.dtype, q.dtype if torch else None), "out: o", self.device)
            lse_ret, lse = output_array(cp, torch, out[1] if out else None, (s.batch, s.heads, s.q_len),
                                        (cp.float32, torch.float32 if torch else None), "out: lse", self.device)
            self._launch(cp, qc, kc, vc, o, lse, scales)
        return Decoded(o_ret, lse_ret)

    def _scales(self, cp: Any, k_scale: Any, v_scale: Any) -> tuple[Any, Any] | None:
        """An fp8 cache's scales as device float32 (kv_heads,) arrays; None for a cache in q's dtype."""
        s = self.shapes
        if not s.fp8_cache or k_scale is None or v_scale is None:
            check_kv_scales(k_scale, v_scale, s)  # says which is missing or misplaced
            return None
        out = []
        for x, name in ((k_scale, "k_cache.scale"), (v_scale, "v_cache.scale")):
            if isinstance(x, (int, float)) and not isinstance(x, bool):  # one number: its device copy, made once
                out.append(_number_scales(cp, self.device, s.kv_heads, float(host_scales(x, name, s.kv_heads)[0])))
                continue
            if not (hasattr(x, "__cuda_array_interface__") or getattr(x, "is_cuda", False)):
                with cp.cuda.Device(self.device):
                    out.append(cp.asarray(host_scales(x, name, s.kv_heads)))
                continue
            xc = _as_cupy(cp, x, name)
            if xc.shape != (s.kv_heads,) or xc.dtype != cp.float32 or xc.device.id != self.device:
                raise AttentionInputError(f"{name}: {xc.dtype} {tuple(xc.shape)} on device {xc.device.id}; expected "
                                          f"float32 ({s.kv_heads},) on device {self.device}")
            out.append(cp.ascontiguousarray(xc))
        return out[0], out[1]

    def _check_same(self, q: Any, k: Any, v: Any) -> None:
        for x, name, dims in ((q, "q", "(batch, q_len, heads, head_dim)"), (k, "k_cache", "4 dims"),
                              (v, "v_cache", "4 dims")):
            _check_array(x, name, dims)
        s = self.shapes
        table_shape = (s.batch, s.max_pages) if s.paged else None
        want = check_shapes(q.shape, k.shape, v.shape, _dtype_names(q, k, v), table_shape)
        if want != s:
            raise AttentionInputError(f"q, k_cache: shapes {tuple(q.shape)}, {tuple(k.shape)}, {want.dtype}, give "
                                      f"{want}; expected the plan's {s} (plan_decode again for another layout)")
        devs = {x.device.id for x in (q, k, v)}
        if devs != {self.device}:
            raise AttentionInputError(f"q, k_cache, v_cache are on devices {sorted(devs)}; expected device "
                                      f"{self.device}, the plan's")

    def _launch(self, cp: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, scales: tuple[Any, Any] | None) -> None:
        partials = self._partials(cp)
        self._launch_split(cp, q, k, v, o, lse, scales, partials)
        if self.split.splits > 1:
            launch_combine(self, *partials, o, lse, dependent=self.dependent_combine)

    def _partials(self, cp: Any) -> tuple[Any, Any]:
        """The split kernel's fp32 partial outputs (o_part (rows, splits, d), lse_part (rows, splits)): the plan's
        own, allocated with it, so a call allocates nothing (CUDA graphs can capture it); null pointers where one
        split writes O and lse itself."""
        if self.partials is None:
            return cp.uint64(0), cp.uint64(0)
        if POISON_PARTIALS:
            for x in self.partials:
                x.fill(float("nan"))
        return self.partials

    def _launch_split(self, cp: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, scales: tuple[Any, Any] | None,
                      partials: tuple[Any, Any]) -> None:
        s, sp, i32 = self.shapes, self.split, cp.int32
        main = self.launches[0]
        o_part, lse_part = partials
        null = cp.uint64(0)
        table = self.table if self.table is not None else null
        k_scale, v_scale = scales if scales is not None else (null, null)
        fn = _kernel(cp, _split_instance(s), main.smem_bytes)
        fn(main.grid, main.block, (q, k, v, o, lse, o_part, lse_part, self.seqlens, table, k_scale, v_scale,
                                   i32(s.q_len), i32(s.heads), i32(s.kv_heads), i32(s.page_size), i32(s.max_pages),
                                   i32(sp.chunk), i32(sp.splits), cp.float32(self.scale * _LOG2E)),
           shared_mem=main.smem_bytes)


def split_kernel_alone(plan: DecodePlan, q: Any, k_cache: Any, v_cache: Any) -> Callable[[], None]:
    """A launch of the plan's split kernel alone (CuPy arrays, a 16-bit cache; into the plan's partials and outputs
    allocated here once), ready to time: :mod:`iosim.calibrate.decode_tile` takes it from the whole call to find the
    combine's part."""
    cp = require_cupy()
    s = plan.shapes
    o = cp.empty((s.batch, s.q_len, s.heads, s.head_dim), dtype=q.dtype)
    lse = cp.empty((s.batch, s.heads, s.q_len), dtype=cp.float32)
    partials = plan._partials(cp)
    return lambda: plan._launch_split(cp, q, k_cache, v_cache, o, lse, None, partials)


def launch_combine(plan: DecodePlan, o_part: Any, lse_part: Any, o: Any, lse: Any, dependent: bool = False) -> None:
    """The plan's combine kernel on CuPy partials (o_part (rows, splits, d) and lse_part (rows, splits), float32;
    rows = batch · q_len · heads) into o and lse: what :meth:`DecodePlan.run` launches after the split kernel,
    ``dependent``: as its programmatic dependent (sm_90+, :func:`iosim.gpu.driver.launch_dependent`), else a plain
    launch."""
    cp = require_cupy()
    s, sp, i32 = plan.shapes, plan.split, cp.int32
    comb = plan.launches[1]
    fn = _kernel(cp, DecodeInstance("combine", s.head_dim, s.dtype), 0)
    args = (o_part, lse_part, plan.seqlens, o, lse, i32(s.batch * s.q_len * s.heads), i32(s.q_len), i32(s.heads),
            i32(sp.chunk), i32(sp.splits))
    if dependent:
        launch_dependent(fn, comb.grid, comb.block, args, cp.cuda.get_current_stream().ptr)
    else:
        fn(comb.grid, comb.block, args)


_NUMBER_SCALES: dict[tuple[int, int, float], Any] = {}  # (device, kv_heads, scale) -> float32 (kv_heads,) on it


def _number_scales(cp: Any, device: int, heads: int, value: float) -> Any:
    """A scale given as one number, as the device array the kernel reads, copied once: a copy every call cost about
    3.4 us a scale on an H100 (a decode call is 10-400 us). Never written: the kernel only reads it."""
    key = (device, heads, value)
    if key not in _NUMBER_SCALES:
        if len(_NUMBER_SCALES) >= 256:  # a model's layers use a few; forget them all rather than grow
            _NUMBER_SCALES.clear()
        with cp.cuda.Device(device):
            a = cp.asarray(np.full((heads,), value, dtype=np.float32))
            cp.cuda.get_current_stream().synchronize()  # written before a run on another stream (torch's) reads it
            _NUMBER_SCALES[key] = a
    return _NUMBER_SCALES[key]


def _split_instance(s: DecodeShapes) -> DecodeInstance:
    return DecodeInstance("split", s.head_dim, s.dtype, s.stripes, s.fp8_cache)


def _as_inputs(cp: Any, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, tuple[Any, Any]]:
    """q, k, v as CuPy arrays (a torch float8_e4m3fn cache as its uint8 bits: CuPy has no fp8 dtype), and the
    (k, v) scales of QuantizedKV caches (None for a plain array)."""
    def cache(x: Any) -> Any:
        torch = torch_of(x)
        return x.view(torch.uint8) if torch is not None and x.dtype == torch.float8_e4m3fn else x

    (k, ks), (v, vs) = ((x.values, x.scale) if isinstance(x, QuantizedKV) else (x, None) for x in (k, v))
    return _as_cupy(cp, q, "q"), _as_cupy(cp, cache(k), "k_cache"), _as_cupy(cp, cache(v), "v_cache"), (ks, vs)


def _dtype_names(*xs: Any) -> tuple[str, ...]:
    return tuple(dtype_name(x.dtype) for x in xs)


def plan_decode(q: Any, k_cache: Any, v_cache: Any, *, seqlens_k: Any = None, block_table: Any = None,
                scale: float | None = None, splits: int | None = None,
                profile: str | Profile | None = None) -> DecodePlan:
    """Check a decode call's layout, lengths and an fp8 cache's scales, choose the splits, upload the lengths and
    block table: the arguments of :func:`decode` without the output, and ``profile``: the GPU's profile whose time
    model chooses the splits (a built-in name, a file or a Profile; default: the built-in profile whose name fits the
    device's). Choosing the splits by the time model takes 1-10 ms of host time (up to ~0.2 s for thousands of ragged
    blocks): make the plan once per batch layout."""
    cp = require_cupy()
    qc, kc, vc, raw = _as_inputs(cp, q, k_cache, v_cache)
    table_host = host_ints(block_table, "block_table") if block_table is not None else None
    s = check_shapes(qc.shape, kc.shape, vc.shape, _dtype_names(qc, kc, vc),
                     table_host.shape if table_host is not None else None)
    lens = check_seqlens(host_ints(seqlens_k, "seqlens_k") if seqlens_k is not None else None, s)
    table_host = check_block_table(table_host, lens, s) if s.paged else None
    check_kv_scales(*raw, s)
    scale = check_scale(scale, s.head_dim)
    devs = {x.device.id for x in (qc, kc, vc)}
    if len(devs) != 1:
        raise AttentionInputError(f"q, k_cache, v_cache are on devices {sorted(devs)}; expected all on one device")
    device = devs.pop()
    with cp.cuda.Device(device):
        attrs = cp.cuda.Device(device).attributes
        cc = int(cp.cuda.Device(device).compute_capability)
        if cc < 80:
            raise GPUUnavailableError(f"iosim.gpu.decode needs compute capability 8.0 or newer (cp.async, bf16 "
                                      f"mma.sync); device {device} is {cc / 10:.1f}")
        itemsize = build.ITEMSIZE[s.dtype]
        kv_itemsize = 1 if s.fp8_cache else itemsize
        smem = geo.decode_launch_smem(s.head_dim, s.stripes, itemsize, kv_itemsize, s.kv_heads,
                                      int(attrs["MaxSharedMemoryPerMultiprocessor"]))  # more where held to fewer
        if smem > _smem_limit(cp):
            terms = geo.decode_smem_terms(s.head_dim, s.stripes, itemsize, kv_itemsize)
            raise SharedMemoryError(f"decode at head_dim={s.head_dim}: needs {smem} B of shared memory per block "
                                    f"({', '.join(f'{n} {b} B' for n, b in terms.items())}); this device allows "
                                    f"{_smem_limit(cp)} B")
        fn = _kernel(cp, _split_instance(s), smem)  # compiled (cached) now
        table_regs = geo.DECODE_REGISTERS_FP8 if s.fp8_cache else geo.DECODE_REGISTERS
        regs = int(getattr(fn, "num_regs", 0) or table_regs[(s.head_dim, s.stripes)])
        per_sm = geo.decode_blocks_per_sm(smem, regs, int(attrs["MaxSharedMemoryPerMultiprocessor"]),
                                          int(attrs.get("MaxRegistersPerMultiprocessor", 65536)))
        slots = geo.split_slots(int(attrs["MultiProcessorCount"]), per_sm)
        try:
            fitting = _profile_of(device) if profile is None and splits is None else None
            split, rule = _split(s, lens, slots, splits, get_profile(profile) if profile is not None else fitting)
        except geo.DecodeGeometryError as exc:
            raise AttentionInputError(str(exc)) from None
        seqlens = cp.asarray(lens)
        table = cp.asarray(table_host) if table_host is not None else None
        partials = None
        if split.splits > 1:
            rows = s.batch * s.q_len * s.heads
            partials = (cp.empty((rows, split.splits, s.head_dim), dtype=cp.float32),
                        cp.empty((rows, split.splits), dtype=cp.float32))
        cp.cuda.get_current_stream().synchronize()  # the uploads are done before a run on another stream reads them
    launches = [KernelLaunch(_split_instance(s).name_expression,
                             geo.decode_grid(s.batch, s.kv_heads, s.rows, s.head_dim, split.splits),
                             (geo.DECODE_THREADS, 1, 1), smem)]
    if split.splits > 1:
        launches.append(KernelLaunch(DecodeInstance("combine", s.head_dim, s.dtype).name_expression,
                                     geo.combine_grid(s.batch, s.q_len, s.heads), (geo.DECODE_THREADS, 1, 1), 0))
    return DecodePlan(s, split, scale, tuple(int(n) for n in lens), seqlens, table, tuple(launches), device, rule,
                      dependent_combine=cc >= 90 and DEPENDENT_COMBINE, partials=partials)


@cache
def _profile_of(device: int) -> Profile | None:
    """The built-in profile whose name fits this device's (None where none or several do)."""
    cp = require_cupy()
    name = cp.cuda.runtime.getDeviceProperties(device)["name"]
    fits = profiles_fitting(name.decode() if isinstance(name, bytes) else str(name))
    return get_profile(fits[0]) if len(fits) == 1 else None


def _split(s: DecodeShapes, lens, slots: int, splits: int | None, profile: Profile | None) -> tuple[geo.SplitChoice, str]:
    """The split the kernel launches and how it was chosen (:func:`iosim.timing.decode_split.kernel_split` on
    ``profile``; without one, a forced count or the occupancy rule on the device's ``slots``)."""
    if profile is None:
        blocks = s.kv_heads * geo.decode_row_blocks(s.rows, s.head_dim)
        return geo.decode_split(lens, blocks, slots, splits), "forced" if splits is not None else "occupancy"
    problem = AttentionProblem(batch=s.batch, heads=s.heads, kv_heads=s.kv_heads, seq_len=s.q_len, kv_len=s.capacity,
                               head_dim=s.head_dim, dtype={"float16": "fp16", "bfloat16": "bf16"}[s.dtype],
                               causal=s.q_len > 1)
    split, rule = kernel_split(problem, profile, load_kernel("iosim-decode"), slots, list(lens),
                               s.page_size if s.paged else None, "fp8" if s.fp8_cache else None, splits)
    return split, f"{rule} ({profile.name})" if rule == "time model" else rule


def decode(q: Any, k_cache: Any, v_cache: Any, *, seqlens_k: Any = None, block_table: Any = None,
           scale: float | None = None, splits: int | None = None, out: tuple[Any, Any] | None = None) -> Decoded:
    """Attention of 1 to 16 new tokens per sequence against a KV cache, on the GPU with iosim's Flash-Decoding
    kernels; returns ``Decoded(o, lse)``.

    q: (batch, q_len, heads, head_dim), q_len 1 to 16, head_dim 64, 128 or 256, float16 or bfloat16. Query token i
    of sequence b is at position n_b - q_len + i and sees keys 0 .. n_b - q_len + i (bottom-right causal): the
    cache already holds the new tokens' keys and values.
    k_cache, v_cache: contiguous (batch, max_len, kv_heads, head_dim), or paged (num_pages, page_size, kv_heads,
    head_dim) with ``block_table``; heads a multiple of kv_heads (query head h reads kv head h // (heads // kv_heads)).
    In q's dtype, or fp8: each a ``QuantizedKV(values, scale)``, e4m3 values (torch float8_e4m3fn, or uint8 arrays of
    e4m3 bits) and fp32 scales per kv head (a number, or (kv_heads,) floats; K = scale[h] · e4m3), as
    :func:`iosim.gpu.quantize_kv_fp8` returns.
    seqlens_k: keys per sequence (batch,), integers 0 to the cache's capacity; a list, NumPy, CuPy or torch array.
    None with a contiguous cache: every sequence is max_len long.
    block_table: (batch, max_pages) integers: token t of sequence b is slot t % page_size of page
    block_table[b, t // page_size]; pages in any order; page_size a multiple of 16; entries past a sequence's last
    page are never read.
    scale: default 1/sqrt(head_dim). splits: force the number of K/V splits (1 to 128; default: the count the time
    model predicts fastest on the built-in profile whose name fits the GPU's, :func:`iosim.timing.decode_split
    .kernel_split`; where none fits, or it lacks the decode kernel's calibration, the occupancy rule of
    :func:`iosim.launch.decode.decode_split`; :func:`plan_decode` takes a profile of your own). out: an optional
    (o, lse) pair of preallocated outputs.
    CuPy arrays or CUDA torch tensors (torch in, torch out, on torch's current stream). Each call checks the lengths
    and table on the host; to run one layout many times, :func:`plan_decode` once and ``plan.run`` each time.
    """
    plan = plan_decode(q, k_cache, v_cache, seqlens_k=seqlens_k, block_table=block_table, scale=scale, splits=splits)
    return plan.run(q, k_cache, v_cache, out)
