"""What to measure: one small description per kind of kernel call.

    Attention("flash2", seq_len=4096, heads=32)           # our schedules: flash2, naive (and flash3 where built)
    Attention("sdpa-flash", seq_len=4096, heads=32)       # torch SDPA's backends: sdpa-flash, sdpa-cudnn
    Attention("flash2-bwd", seq_len=4096, heads=32)       # backward passes: flash2-bwd, sdpa-flash-bwd, sdpa-cudnn-bwd
    Attention("flash3-fp8", seq_len=4096, heads=32, dtype="fp8")  # our fp8 forward alone; fp8-quantize: its inputs
    ReadProbe(64 << 20)                                   # calibration: a buffer read twice (l2probe)
    WriteProbe(8 << 20, read_bytes=32 << 20, shared=True) # calibration: written, then other data read (l2write)

A run is plain data: it goes to the worker process (which runs it under Nsight Compute) as JSON and comes back in
the record, ``to_dict``/``from_dict`` with its ``kind`` as the tag. The probes' kernels are in ``kernels/probes.cu``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..launch import FLASH3_FP8_TILES

OUR_KERNELS = ("flash2", "naive", "flash3")  # iosim.gpu.attention's schedules
TORCH_KERNELS = ("sdpa-flash", "sdpa-cudnn")  # torch.nn.functional.scaled_dot_product_attention backends
# backward passes, the forward run outside the profiled range: iosim.gpu.attention_backward (flash2's kernels, the
# design gqa="grouped"), and torch SDPA's flash and cuDNN backends' backward (torch.autograd.grad of the SDPA call)
BACKWARD_KINDS = ("flash2-bwd", "sdpa-flash-bwd", "sdpa-cudnn-bwd")
# fp8 (e4m3, Hopper, issue 27), dtype "fp8": flash3-fp8 is iosim's fp8 forward alone, its inputs (bf16 draws) quantized
# by iosim.gpu.quantize_fp8 before the run's range; fp8-quantize is those three quantize launches (Q, K, V^T)
FP8_KINDS = ("flash3-fp8", "fp8-quantize")
FP8_HEAD_DIMS = tuple(FLASH3_FP8_TILES)  # the fp8 kernels' instantiations
ATTENTION_KINDS = OUR_KERNELS + TORCH_KERNELS + BACKWARD_KINDS + FP8_KINDS
PROBE_KINDS = ("l2probe", "l2write")


class MeasureError(RuntimeError):
    """Measurement cannot run (no GPU, no ncu, counters not permitted, ncu failed, a bad run); the message says which."""


@dataclass(frozen=True)
class Attention:
    """One attention call: ``kind`` one of :data:`ATTENTION_KINDS` (a forward call, or the backward call of
    :data:`BACKWARD_KINDS`, its forward made beforehand, outside the profiled range; or an fp8 kind of
    :data:`FP8_KINDS`, dtype "fp8"); Q (batch, seq_len, heads, head_dim), K and V (batch, kv_len, kv_heads,
    head_dim); ``block_q``/``block_kv`` (flash2 only) pick the tiles; ``window`` (left, right), flash2 and flash3
    only: a sliding window, as ``iosim.gpu.AttentionOptions(window=...)`` takes it (None on a side: no bound);
    ``seqlens`` ((queries, keys), ...), flash2 and flash3: packed sequences run by ``iosim.gpu.attention_varlen``, batch 1
    whose seq_len and kv_len are their totals; ``page_size`` (flash2, with seqlens): the keys in a paged cache of
    pages that many tokens long, each sequence's pages in a seeded random order (chunked prefill)."""

    kind: str
    seq_len: int = 1024
    heads: int = 1
    kv_heads: int | None = None
    batch: int = 1
    kv_len: int | None = None
    head_dim: int = 128
    dtype: str = "fp16"
    causal: bool = False
    block_q: int | None = None
    block_kv: int | None = None
    window: tuple[int | None, int | None] | None = None
    seqlens: tuple[tuple[int, int], ...] | None = None
    page_size: int | None = None

    def __post_init__(self):
        if self.kind not in ATTENTION_KINDS:
            raise MeasureError(f"kind={self.kind!r}: expected one of {', '.join(ATTENTION_KINDS + PROBE_KINDS)}")
        self._check_dtype()
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kv_len is None:
            object.__setattr__(self, "kv_len", self.seq_len)
        for name in ("seq_len", "heads", "kv_heads", "batch", "kv_len", "head_dim"):
            if getattr(self, name) < 1:
                raise MeasureError(f"{name}={getattr(self, name)}: expected a positive integer")
        if self.heads % self.kv_heads:
            raise MeasureError(f"heads={self.heads}, kv_heads={self.kv_heads}: heads must be a multiple of kv_heads")
        if (self.block_q, self.block_kv) != (None, None) and self.kind != "flash2":
            raise MeasureError(f"block_q/block_kv for kind={self.kind!r}: only flash2's tiles can be chosen")
        if self.window is not None:
            if self.kind not in ("flash2", "flash3") or len(self.window) != 2:
                raise MeasureError(f"window={self.window!r} for kind={self.kind!r}: a (left, right) window is "
                                   "flash2's and flash3's")
            object.__setattr__(self, "window", tuple(self.window))  # a list from JSON
        if self.seqlens is not None:
            pairs = tuple((int(q), int(k)) for q, k in self.seqlens)  # lists from JSON
            object.__setattr__(self, "seqlens", pairs)
            totals = (sum(q for q, _ in pairs), sum(k for _, k in pairs))
            if self.kind not in ("flash2", "flash3") or self.batch != 1 or totals != (self.seq_len, self.kv_len):
                raise MeasureError(f"seqlens for kind={self.kind!r}, batch={self.batch}, seq_len={self.seq_len}, "
                                   f"kv_len={self.kv_len}: packed sequences are flash2's and flash3's, a batch of 1 "
                                   f"whose lengths are their totals {totals}")
        if self.page_size is not None and (self.kind != "flash2" or self.seqlens is None or self.page_size < 1):
            raise MeasureError(f"page_size={self.page_size} for kind={self.kind!r}: a paged cache is flash2's, with "
                               "seqlens (chunked prefill), pages of >= 1 token")

    def _check_dtype(self) -> None:
        """fp16 or bf16, except the fp8 kinds: "fp8" and one of the fp8 kernels' head dims."""
        if self.kind in FP8_KINDS:
            if self.dtype != "fp8" or self.head_dim not in FP8_HEAD_DIMS:
                raise MeasureError(f"kind={self.kind!r}, dtype={self.dtype!r}, head_dim={self.head_dim}: the fp8 "
                                   f"kinds take dtype='fp8' and head_dim in {FP8_HEAD_DIMS}")
        elif self.dtype not in ("fp16", "bf16"):
            raise MeasureError(f"dtype={self.dtype!r}: expected fp16 or bf16 (the GPU kernels' dtypes; fp8: kinds "
                               f"{', '.join(FP8_KINDS)})")


@dataclass(frozen=True)
class ReadProbe:
    """``l2probe``: ``nbytes`` read twice through L2 by a grid of ``blocks_per_sm`` blocks of ``threads`` threads per
    SM. The second pass reads from DRAM what L2 did not keep; what it writes is the dirty lines present at start."""

    nbytes: int
    blocks_per_sm: int = 8
    threads: int = 256
    kind: str = "l2probe"

    def __post_init__(self):
        if self.nbytes < 16 or self.nbytes % 16:
            raise MeasureError(f"nbytes={self.nbytes}: expected a positive multiple of 16 (float4 loads)")
        if self.blocks_per_sm < 1 or self.threads not in (32, 64, 128, 256, 512, 1024):
            raise MeasureError(f"blocks_per_sm={self.blocks_per_sm}, threads={self.threads}: expected >= 1 block "
                               "per SM of 32-1024 threads, a power of two")


@dataclass(frozen=True)
class WriteProbe:
    """``l2write``, one block of 256 threads per SM: ``nbytes`` written (dirty lines), then ``read_bytes`` of other
    data read, each line by one SM or, ``shared``, by every SM; ``interleave``: written and read side by side, each
    thread reading its next 16 B and writing its next 16 B in one step (as flash2 reads Q and writes O). The DRAM
    writes are the dirty bytes the reads pushed out of L2."""

    nbytes: int
    read_bytes: int = 0
    shared: bool = False
    interleave: bool = False
    kind: str = "l2write"

    def __post_init__(self):
        for name in ("nbytes", "read_bytes"):
            v = getattr(self, name)
            if v < 0 or v % 16:
                raise MeasureError(f"{name}={v}: expected a multiple of 16 bytes, >= 0 (float4 accesses)")
        if self.interleave and self.shared:
            raise MeasureError("interleave with shared: the interleaved probe reads each line by one SM")

    @property
    def mode(self) -> int:
        """The kernel's ``mode`` argument (kernels/probes.cu)."""
        return 2 if self.interleave else int(self.shared)


Run = Attention | ReadProbe | WriteProbe


def to_dict(run: Run) -> dict:
    return asdict(run)


def from_dict(d: dict) -> Run:
    """A run from its dict (``kind`` first); unknown fields are an error that names them."""
    kind = d.get("kind")
    cls = ReadProbe if kind == "l2probe" else WriteProbe if kind == "l2write" else Attention
    known = {f.name for f in fields(cls)}
    extra = sorted(set(d) - known)
    if extra:
        raise MeasureError(f"{kind!r} run: unknown field(s) {', '.join(extra)}; expected {', '.join(sorted(known))}")
    return cls(**d)
