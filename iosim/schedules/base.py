"""What every schedule module provides, and the tile configuration."""

from __future__ import annotations

from dataclasses import dataclass


class ScheduleError(ValueError):
    """A schedule cannot run as asked (unknown name, bad tiles, tiles that do not fit SRAM)."""


@dataclass(frozen=True)
class Tiles:
    """Tile sizes: ``block_q`` = Br (query rows per tile), ``block_kv`` = Bc (key/value rows per tile).

    ``None`` for both means "not tiled" (the naive schedule's Algorithm 0, counted as the paper does: each
    GEMM reads its operands once). ``sram_elements`` records M where a default was derived from it
    (FlashAttention-1's rule).
    """

    block_q: int | None
    block_kv: int | None
    sram_elements: int | None = None

    def __post_init__(self):
        for name in ("block_q", "block_kv"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ScheduleError(f"{name}={v!r}: a tile size must be a positive integer")
        if (self.block_q is None) != (self.block_kv is None):
            raise ScheduleError("block_q and block_kv must be given together (or neither)")
