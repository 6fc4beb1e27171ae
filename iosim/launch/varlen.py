"""Launch geometry of flash_fwd.cu's varlen kernel (``flash_fwd_kernel<..., Local, Varlen = true>``): packed
sequences with cumulative lengths, and sliding windows (on packed sequences or on the dense batch), as plain data.

Grid (ceil(max_seqlen_q / Br), heads, batch), FlashAttention-2's varlen grid: block (x, h, b) takes Q tile x of
sequence b (from its last tile where causal or windowed: those see the most keys) and exits at once where
sequence b has fewer tiles. :func:`empty_blocks` counts those exits. Each has nothing to load or compute; its cost
is a block launch and two reads of cu_seqlens (L2 hits), against a real tile's K/V loop.

Names follow the math: ``block_q`` = Br, ``block_kv`` = Bc, ``head_dim`` = d.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..blocks import cdiv
from .forward import FLASH_DEFAULT_TILES, FLASH_TILES

# (block_q, block_kv) the varlen kernel is compiled for, per head dim: FLASH_TILES less the instantiations that
# spill on sm_80 (ptxas, nvcc 13.0): d = 32 at 64 x 64 (4 B). With a window (Local) also d = 128 at 128 x 32 (20 B
# at 255 registers: the window's two bounds); 64 x 64 there, which also visits fewer masked keys per Q tile.
FLASH_VARLEN_TILES: dict[int, tuple[tuple[int, int], ...]] = {32: ((128, 64),), 64: FLASH_TILES[64],
                                                              128: FLASH_TILES[128], 256: FLASH_TILES[256]}
FLASH_LOCAL_TILES: dict[int, tuple[tuple[int, int], ...]] = {32: ((128, 64),), 64: FLASH_TILES[64],
                                                             128: ((64, 64),), 256: FLASH_TILES[256]}

# The paged kernel's one tile per head dim (chunked prefill, varlen queries against a paged KV cache): the windowed
# kernel's, as at d = 128 the table lookups spill 128 x 32 on sm_80 and sm_90 too (8-44 B at 255 registers).
FLASH_PAGED_TILES: dict[int, tuple[int, int]] = {d: tiles[0] if d != 128 else (64, 64)
                                                 for d, tiles in FLASH_LOCAL_TILES.items()}

UNBOUNDED = 2**31 - 1  # a window bound the kernel reads as none (it clamps each bound to the sequence's lengths)


class Mask(NamedTuple):
    """Which keys query i of a sequence (n queries, n_k keys, off = n_k - n) sees: ``causal``: j <= i + off;
    ``window`` (left, right), None for an unbounded side: i + off - left <= j <= i + off + right. A causal window is
    ``window=(left, 0)`` with ``causal`` False: the kernel's Local mode. Made by :func:`mask_of`."""

    causal: bool
    window: tuple[int | None, int | None] | None

    @property
    def local(self) -> bool:
        return self.window is not None

    def kernel_window(self) -> tuple[int, int]:
        """(window_left, window_right) as the kernel takes them (:data:`UNBOUNDED` for None; 0, 0 where not local)."""
        if self.window is None:
            return 0, 0
        return tuple(UNBOUNDED if w is None else int(w) for w in self.window)  # type: ignore[return-value]


def mask_of(causal: bool, window: tuple[int | None, int | None] | None) -> Mask:
    """The kernel's mask for a checked (causal, window) (:func:`iosim.gpu.inputs.check_window` normalized it: a
    causal call's window has right 0): no window, or one unbounded on both sides, is the plain or causal mask; a
    window (None, 0) is the causal mask; any other is Local."""
    if window is None or window == (None, None):
        return Mask(causal, None)
    if window == (None, 0):
        return Mask(True, None)
    return Mask(False, tuple(window))  # type: ignore[arg-type]


def varlen_tiles(head_dim: int, local: bool) -> tuple[tuple[int, int], ...]:
    """The (block_q, block_kv) the varlen kernel takes at ``head_dim`` (with a window: ``local``)."""
    return (FLASH_LOCAL_TILES if local else FLASH_VARLEN_TILES)[head_dim]


def varlen_default_tiles(head_dim: int, local: bool) -> tuple[int, int]:
    """The dense kernel's default tile where the varlen kernel has it, else its first."""
    tiles = varlen_tiles(head_dim, local)
    return FLASH_DEFAULT_TILES[head_dim] if FLASH_DEFAULT_TILES[head_dim] in tiles else tiles[0]


def varlen_grid(max_seqlen_q: int, heads: int, batch: int, block_q: int) -> tuple[int, int, int]:
    """(ceil(max_seqlen_q / Br), heads, batch): one block per Q tile of the longest sequence, head and sequence."""
    return cdiv(max(1, max_seqlen_q), block_q), heads, batch


def empty_blocks(seqlens_q: Sequence[int], max_seqlen_q: int, heads: int, block_q: int) -> int:
    """Blocks of :func:`varlen_grid` past their sequence's last Q tile (they exit at once)."""
    per_head = cdiv(max(1, max_seqlen_q), block_q) * len(seqlens_q) - sum(cdiv(int(n), block_q) for n in seqlens_q)
    return per_head * heads
