"""Launch geometry of iosim's Flash-Decoding kernel (``kernels/flash_decode.cu``): rows per block, the K/V ring, shared
memory, blocks per SM, bytes in flight, and the split heuristic, as plain data and arithmetic.

:mod:`iosim.gpu.flash_decode` launches the kernel from these numbers; a time model can read the same ones (no CuPy
here). Names follow the math: ``rows`` = M = G·L packed query rows of one kv head (G = heads / kv_heads query heads,
L = new tokens per sequence), ``chunk`` = keys per split, ``d`` = head dim.

The occupancy split rule (:func:`decode_split`; where the GPU's profile has the kernel's calibration the kernel
launches the time model's fastest count instead, :mod:`iosim.timing.decode_split`, and this rule is the fallback):

1. A launch has ``units`` = batch · kv_heads · row_blocks thread blocks before splitting; the GPU holds SMs ·
   (blocks per SM) of them at once (:func:`decode_blocks_per_sm`: shared memory, registers, threads; fewer where
   the cache's rows are short and spread out, :func:`decode_blocks_cap`). The split
   rule counts at most ``FILL_BLOCKS_PER_SM`` (2) of those an SM: ``slots`` = :func:`split_slots`.
2. Decode is DRAM-bound: every K/V byte is read once and a block does M FLOPs per byte. DRAM stays busy as long as
   enough bytes are in flight, and two resident blocks an SM have several times what it needs
   (:func:`decode_bytes_in_flight`), so the goal is one wave of them: the keys of all sequences
   (kv_heads · row_blocks · Σ n_b) are cut into chunks of ceil(work / target) keys, target = ``SPLIT_FILL`` (80%)
   of the slots, what FlashAttention-2's ``num_splits_heuristic`` deems a full grid: splits = ceil(longest /
   chunk). (Why two an SM and not all an SM holds: an fp8 cache's blocks fit three an SM at d = 128; filling the
   three took 2 splits at batch 64 and 3 at batch 32, where 1 and 2 run 15-25% faster on the H100, the same kernel
   at those counts: 94.9-96.6% of the DRAM read rate against 72-77%, ``bench_decode.py --splits``, 2026-11-27.)
   With equal lengths a grid that fills the slots unsplit stays unsplit (more splits would only add
   partial-output traffic); with ragged ones a long sequence is split even then, so it does not straggle.
3. A split holds at least ``MIN_SPLIT_TOKENS`` keys (256): splits <= longest // 256. A block's fixed cost (its Q
   load, the ring's first DRAM latency, the warps' merge, the partial write; about 2 us) then stays under ~15% of
   its streaming time at its share of the bandwidth (d = 128: 256 keys = 128 KB, ~11 us at 3 TB/s over 264 blocks).
4. At most ``MAX_SPLITS``. The chunk is then evened out over the longest sequence (a multiple of 16 keys), so its
   splits are equal. Shorter sequences use their first ceil(n_b / chunk) splits; the other blocks exit at once.
   One split: the kernel writes O itself and the combine kernel does not run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..blocks import cdiv
from ..hardware.gpu import Profile
from ..schedules import decode_layout as tiling
from .model import resident_blocks

# the kernel's tiling is the simulator's (iosim.schedules.decode_layout), written once
DECODE_WARPS = tiling.WARPS  # warps per block; they split the keys of a split (each its own tiles, ring and state)
DECODE_THREADS = tiling.THREADS
DECODE_TILE = tiling.TILE_KEYS  # keys per warp tile: a page size must be a multiple of it, so no tile crosses a page
DECODE_HEAD_DIMS: tuple[int, ...] = tiling.HEAD_DIMS
MAX_QUERY_TOKENS = tiling.MAX_QUERY_TOKENS  # new tokens per sequence (speculative decoding, small chunks)
STRIPE_ROWS = tiling.STRIPE_ROWS  # mma.sync m16n8k16: rows of one stripe

SPLIT_FILL = 0.8  # fraction of the resident slots a grid must fill to count as full (FlashAttention-2's 80%)
FILL_BLOCKS_PER_SM = 2  # resident blocks an SM that count for the fill (module docstring, step 1)
MIN_SPLIT_TOKENS = 256  # keys per split at least: the block's fixed cost against its streaming time
MAX_SPLITS = tiling.MAX_SPLITS  # splits at most (FlashAttention-2's cap): bounds the partial outputs


def combine_unroll(head_dim: int) -> int:
    """Splits the combine kernel merges a round, their loads in flight together (kCombineUnroll in
    kernels/flash_decode.cu): 8, or 4 at d = 256."""
    return 4 if head_dim >= 256 else 8

# registers per thread (ptxas, nvcc 13.0, the larger of sm_80 and sm_90, fp16 and bf16 alike; a fallback where CuPy
# gives no count): (d, stripes) -> registers; python -m iosim.gpu.compile_check prints them. The combine kernel: 56-71.
DECODE_REGISTERS: dict[tuple[int, int], int] = {(64, 1): 114, (64, 2): 157, (128, 1): 164, (128, 2): 235,
                                                (256, 1): 230}
DECODE_STRIPES: tuple[tuple[int, int], ...] = tuple(DECODE_REGISTERS)  # the (d, stripes) the library compiles
# the same for an fp8 (e4m3) cache (nvcc 13.0, the larger of sm_80 and sm_90, fp16 and bf16 alike)
DECODE_REGISTERS_FP8: dict[tuple[int, int], int] = {(64, 1): 122, (64, 2): 161, (128, 1): 159, (128, 2): 238,
                                                    (256, 1): 234}


class DecodeGeometryError(ValueError):
    """A decode shape the kernel does not take (head dim, query tokens), or a split count out of range."""


def decode_stages(head_dim: int) -> int:
    """Depth of each warp's K/V ring (mirrors decode_stages() in kernels/flash_decode.cu): tiles of 16 keys in
    flight per warp while it computes one are ``stages - 1``; d = 256 keeps 2 so a block fits an A100's 163 KB."""
    return tiling.stages(head_dim)


def decode_stripes(rows: int, head_dim: int) -> int:
    """16-row stripes per block: 2 where more than 16 rows (G·L) and d <= 128 (O stays in registers), else 1."""
    return tiling.stripes(rows, head_dim)


def decode_row_blocks(rows: int, head_dim: int) -> int:
    """Blocks along the packed rows (grid.x): each re-reads the kv head's K/V, mostly from L2 (launched side by
    side); 1 up to 32 rows at d <= 128, 16 at d = 256."""
    return tiling.row_blocks(rows, head_dim)


def decode_smem_terms(head_dim: int, stripes: int, itemsize: int = 2, kv_itemsize: int | None = None) -> dict[str, int]:
    """Dynamic shared memory of one split-kernel block, term by term, in bytes (``kv_itemsize``: the cache's, 1 for
    fp8; None: ``itemsize``). The warps' merge area (fp32 O, m and l of every warp, :func:`decode_merge_bytes`) reuses
    the ring once the loop is done."""
    d, kv = head_dim, kv_itemsize or itemsize
    terms = {
        # Q_i: 16·stripes packed rows x d, loaded once; every warp reads all of it
        "Q_i": STRIPE_ROWS * stripes * d * itemsize,
        # each warp's ring of decode_stages(d) slots of one K tile and one V tile (16 keys x d), in the cache's dtype
        "K_j, V_j": DECODE_WARPS * decode_stages(d) * 2 * DECODE_TILE * d * kv,
    }
    if kv != itemsize:  # fp8: each warp's V tile turned to fp16 (ldmatrix.trans reads it; K's fragments come from
        # the ring); and a bf16 Q_i's row factors (one 128-byte line: up to 32 rows of fp32)
        terms["V_j (fp16)"] = DECODE_WARPS * DECODE_TILE * d * itemsize
        terms["Q_i row scales"] = tiling.ROW_SCALE_BYTES
    return terms


def decode_smem_bytes(head_dim: int, stripes: int, itemsize: int = 2, kv_itemsize: int | None = None) -> int:
    return sum(decode_smem_terms(head_dim, stripes, itemsize, kv_itemsize).values())


def decode_merge_bytes(head_dim: int, stripes: int) -> int:
    """The merge area over Q_i and the ring: each warp's O (rows x (d + 8) fp32, padded against bank conflicts), m
    and l."""
    return DECODE_WARPS * STRIPE_ROWS * stripes * (head_dim + 8 + 2) * 4


def decode_blocks_per_sm(smem_bytes: int, registers: int, smem_per_sm: int, regs_per_sm: int = 65536,
                         threads_per_sm: int = 2048, max_blocks: int = 32, reserved_per_block: int = 1024) -> int:
    """Split-kernel blocks one SM holds at once: the tightest of shared memory (each block also costs the
    runtime's reserved 1 KB), registers (allocated per warp in units of 256) and threads."""
    regs_per_warp = cdiv(registers * 32, 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * DECODE_WARPS)
    by_smem = smem_per_sm // (smem_bytes + reserved_per_block)
    return max(0, min(by_regs, by_smem, threads_per_sm // DECODE_THREADS, max_blocks))


# Blocks an SM an instantiation is held to where its cache's rows are short and spread out: an fp8 cache at d = 64
# (64-byte rows) whose kv head's rows lie among SPREAD_KV_HEADS or more heads' (a row every 256 bytes or more, the
# (..., kv_heads, d) layout of every cache). Four such blocks fit an SM, but there a warp's tile took 1.31-1.56 us
# against 0.93 at three (H200, 2026-11-29, decode.tile's call over DRAM with 4 to 32 kv heads interleaved; one or
# two heads: 1.19 at four): four moved 6-25% fewer bytes an SM than three; docs/kernels.md, "Three blocks an SM".
SPREAD_ROWS_CAP: dict[tuple[int, int], int] = {(64, 1): 3}  # (d, stripes) of an fp8 cache -> blocks an SM at most
SPREAD_KV_HEADS = 4


def decode_blocks_cap(head_dim: int, stripes: int, itemsize: int, kv_itemsize: int | None, kv_heads: int) -> int | None:
    """Blocks an SM the split kernel is held to for this layout (:data:`SPREAD_ROWS_CAP`), or None (what fits)."""
    fp8 = kv_itemsize is not None and kv_itemsize < itemsize
    return SPREAD_ROWS_CAP.get((head_dim, stripes)) if fp8 and kv_heads >= SPREAD_KV_HEADS else None


def decode_launch_smem(head_dim: int, stripes: int, itemsize: int, kv_itemsize: int | None, kv_heads: int,
                       smem_per_sm: int, reserved_per_block: int = 1024) -> int:
    """Dynamic shared memory a split-kernel launch asks for: what a block uses (:func:`decode_smem_bytes`), or, where
    the layout is held to fewer blocks an SM (:func:`decode_blocks_cap`), enough more that no more of them fit an
    SM of ``smem_per_sm`` bytes (each block also costs the runtime's reserved 1 KB)."""
    need = decode_smem_bytes(head_dim, stripes, itemsize, kv_itemsize)
    cap = decode_blocks_cap(head_dim, stripes, itemsize, kv_itemsize, kv_heads)
    if cap is None:
        return need
    return max(need, smem_per_sm // (cap + 1) - reserved_per_block + 1)


def decode_slots(profile: Profile, head_dim: int, stripes: int, itemsize: int, registers: int,
                 kv_itemsize: int | None = None, kv_heads: int = 1) -> int:
    """Split-kernel blocks the GPU of ``profile`` holds at once (:func:`iosim.launch.model.resident_blocks`: the
    same limits as :func:`decode_blocks_per_sm`, from the profile instead of the device's attributes), at the
    shared memory the launch asks for with ``kv_heads`` kv heads (:func:`decode_launch_smem`)."""
    smem = decode_launch_smem(head_dim, stripes, itemsize, kv_itemsize, kv_heads, int(profile.require("smem.per_sm")))
    return resident_blocks(profile, DECODE_THREADS, smem, registers)[0]


def decode_bytes_in_flight(head_dim: int, blocks_per_sm: int, itemsize: int = 2) -> int:
    """K/V bytes one SM keeps requested from memory in the loop's steady state (``itemsize``: the cache's): each warp
    has ``stages - 1`` tiles in flight while it computes one. Little's law wants bandwidth x latency / SMs: at 3.07
    TB/s (the H100's measured DRAM read) and ~800 ns under load, 18.6 KB; the H200 (4.48 TB/s) 27 KB."""
    tile = 2 * DECODE_TILE * head_dim * itemsize
    return blocks_per_sm * DECODE_WARPS * (decode_stages(head_dim) - 1) * tile


def split_slots(sms: int, blocks_per_sm: int) -> int:
    """The slots the split heuristic fills: SMs · min(blocks an SM holds, FILL_BLOCKS_PER_SM) (at least one an SM)."""
    return sms * max(1, min(blocks_per_sm, FILL_BLOCKS_PER_SM))


@dataclass(frozen=True)
class SplitChoice:
    """How the keys of each sequence are cut: ``splits`` (grid.y) splits of ``chunk`` keys (a multiple of 16)."""

    splits: int
    chunk: int

    def splits_of(self, kv_len: int) -> int:
        """Splits a sequence of ``kv_len`` keys writes (the rest of grid.y exits at once)."""
        return cdiv(kv_len, self.chunk)


def decode_split(kv_lens: Sequence[int], blocks_per_seq: int, slots: int, splits: int | None = None) -> SplitChoice:
    """The split heuristic (module docstring) for sequences of ``kv_lens`` keys, ``blocks_per_seq`` = kv_heads ·
    row_blocks blocks per sequence and split, ``slots`` = blocks the GPU holds at once; ``splits`` forces the count
    (1 to MAX_SPLITS; fewer where the longest sequence has fewer tiles of 16 keys)."""
    lens = [int(n) for n in kv_lens]
    longest = max(lens, default=0)
    if splits is not None and not (isinstance(splits, int) and not isinstance(splits, bool)
                                   and 1 <= splits <= MAX_SPLITS):
        raise DecodeGeometryError(f"splits={splits!r}: expected None or an integer from 1 to {MAX_SPLITS}")
    if longest <= 0:
        return SplitChoice(1, DECODE_TILE)
    if splits is None:
        target = max(1, math.floor(SPLIT_FILL * slots))  # blocks that count as a full grid
        chunk = cdiv(blocks_per_seq * sum(lens), target)  # keys per block that spread the work over the target
        splits = min(MAX_SPLITS, cdiv(longest, chunk), max(1, longest // MIN_SPLIT_TOKENS))
    return SplitChoice(*tiling.even_split(longest, splits))  # even splits of whole tiles


def decode_grid(batch: int, kv_heads: int, rows: int, head_dim: int, splits: int) -> tuple[int, int, int]:
    """The split kernel's grid: (row blocks, splits, batch · kv_heads); row blocks vary fastest, so the blocks that
    share one kv head's K/V run side by side."""
    return decode_row_blocks(rows, head_dim), splits, batch * kv_heads


def combine_grid(batch: int, q_len: int, heads: int) -> tuple[int, int, int]:
    """The combine kernel's grid: one warp per output row (b, token, head), DECODE_WARPS rows per block."""
    return cdiv(batch * q_len * heads, DECODE_WARPS), 1, 1


def decode_partial_bytes(q_len: int, heads: int, head_dim: int, split: SplitChoice, kv_lens: Sequence[int]) -> int:
    """fp32 partial O and lse the split kernel writes (and the combine kernel reads) where splits > 1, else 0."""
    if split.splits == 1:
        return 0
    written = sum(split.splits_of(int(n)) for n in kv_lens)  # splits that hold keys, over the batch
    return written * q_len * heads * (head_dim + 1) * 4
