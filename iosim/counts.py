"""What the counter and the closed forms produce: exact integer bytes and FLOPs, per kernel and in total.

Boundaries (docs/concepts.md, The three boundaries): ``global`` = every load and store the schedule issues (SM <-> L2, the
papers' "HBM accesses"); ``hbm`` = what reaches DRAM (equal to ``global`` until an L2 model is applied);
``sram`` = bytes written into and read out of on-chip memory (shared memory / registers).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TENSORS = ("Q", "K", "V", "O", "S", "P", "m", "l", "lse",
           # backward pass (docs/schedules/backward.md): gradients, the stored dS and dP of standard attention,
           # D = rowsum(dO∘O), and FlashAttention-2's fp32 dQ accumulator (atomic adds)
           "dO", "dQ", "dK", "dV", "dS", "dP", "D", "dQacc",
           # split-KV decoding (docs/schedules/flash-decoding.md): fp32 partial outputs and logsumexps per split;
           # iosim's decode kernel also reads each sequence's key count and, from a paged cache, its block table
           "Opart", "lsepart", "seqlens_k", "block_table",
           # packed sequences (flash2's varlen kernel): each sequence's first query and key row, and the next's
           "cu_seqlens_q", "cu_seqlens_k",
           # fp8 block quantization (iosim's fp8 flash3 kernel and its quantize kernel, issue 27): one fp32 scale
           # per block of rows of Q, K and V (docs/schedules/flash3.md)
           "q_scale", "k_scale", "v_scale")
SCALE_TENSORS = frozenset({"q_scale", "k_scale", "v_scale"})  # one fp32 value per block: row r is block r
FP32_TENSORS = frozenset({"m", "l", "lse", "D", "dQacc", "Opart", "lsepart"}) | SCALE_TENSORS  # fp32 whatever the dtype
INDEX_TENSORS = frozenset({"seqlens_k", "block_table", "cu_seqlens_q", "cu_seqlens_k"})  # int32 (4 B) whatever the dtype
ROW_TENSORS = frozenset({"m", "l", "lse", "D", "lsepart"}) | INDEX_TENSORS  # one value per row
MATRIX_TENSORS = frozenset({"S", "P", "dS", "dP"})  # rows x keys; every other tensor is rows x head_dim
FLOP_KINDS = ("matmul", "exp", "other")


@dataclass
class KernelCounts:
    """Counts of one kernel launch of a schedule, summed over its whole grid (all batches and heads).

    ``global_read[t]`` / ``global_write[t]``: bytes of tensor ``t`` loaded from / stored to global memory.
    ``sram_peak``: the most on-chip bytes one thread block holds at once (None where not modeled).
    ``grid``: thread blocks launched; ``block_sram`` is what one of them needs (for occupancy).
    """

    name: str
    grid: int = 0
    global_read: Counter = field(default_factory=Counter)
    global_write: Counter = field(default_factory=Counter)
    sram_read: int = 0
    sram_write: int = 0
    flops: Counter = field(default_factory=Counter)
    sram_peak: int | None = None

    def scaled(self, factor: int) -> KernelCounts:
        """These counts for ``factor`` identical heads."""
        return KernelCounts(
            name=self.name,
            grid=self.grid * factor,
            global_read=Counter({k: v * factor for k, v in self.global_read.items()}),
            global_write=Counter({k: v * factor for k, v in self.global_write.items()}),
            sram_read=self.sram_read * factor,
            sram_write=self.sram_write * factor,
            flops=Counter({k: v * factor for k, v in self.flops.items()}),
            sram_peak=self.sram_peak,
        )

    def normalized(self) -> KernelCounts:
        """Drop zero entries, so that two counts compare equal whatever zeros they carry."""
        return KernelCounts(
            name=self.name,
            grid=self.grid,
            global_read=Counter({k: v for k, v in self.global_read.items() if v}),
            global_write=Counter({k: v for k, v in self.global_write.items() if v}),
            sram_read=self.sram_read,
            sram_write=self.sram_write,
            flops=Counter({k: v for k, v in self.flops.items() if v}),
            sram_peak=self.sram_peak,
        )

    @property
    def global_read_bytes(self) -> int:
        return sum(self.global_read.values())

    @property
    def global_write_bytes(self) -> int:
        return sum(self.global_write.values())

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())


@dataclass
class Counts:
    """All kernels of one schedule on one problem."""

    kernels: list[KernelCounts]

    def normalized(self) -> Counts:
        return Counts([k.normalized() for k in self.kernels])

    def _sum(self, attr: str) -> Counter:
        total: Counter = Counter()
        for k in self.kernels:
            total.update(getattr(k, attr))
        return total

    @property
    def global_read(self) -> Counter:
        return self._sum("global_read")

    @property
    def global_write(self) -> Counter:
        return self._sum("global_write")

    @property
    def flops(self) -> Counter:
        return self._sum("flops")

    @property
    def global_read_bytes(self) -> int:
        return sum(k.global_read_bytes for k in self.kernels)

    @property
    def global_write_bytes(self) -> int:
        return sum(k.global_write_bytes for k in self.kernels)

    @property
    def global_bytes(self) -> int:
        return self.global_read_bytes + self.global_write_bytes

    @property
    def sram_read_bytes(self) -> int:
        return sum(k.sram_read for k in self.kernels)

    @property
    def sram_write_bytes(self) -> int:
        return sum(k.sram_write for k in self.kernels)

    @property
    def total_flops(self) -> int:
        return sum(k.total_flops for k in self.kernels)

    @property
    def sram_peak(self) -> int | None:
        peaks = [k.sram_peak for k in self.kernels if k.sram_peak is not None]
        return max(peaks) if peaks else None
