"""Block-sparse FlashAttention backward: FlashAttention-1's Algorithm 4 with the zero blocks of the forward's
block mask skipped (Dao et al. 2022, §3.3: "the backward pass ... skips zero blocks" as Algorithm 5 does).

Every line of Algorithm 4 (``flash1_bwd``) is kept; a tile (i, j) with M̃_ij = 0 loads nothing and computes
nothing, so dK_j, dV_j of a column with no non-zero block are written as zeros (line 24) and dQ_i of a row with no
non-zero block keeps its line-5 initialization. Traffic: Θ(Nd + N²d²s/M), as the forward.

The forward and the backward share one tiling and one mask: the default tiles are Algorithm 4's line-2 rule
with the largest M whose *backward* working set fits (``block_sparse.make_tiles``), so ``--pass both`` draws
or reads a single mask.
"""

from __future__ import annotations

from ..counts import Counts
from ..problem import AttentionProblem
from . import block_sparse, flash1_bwd
from .base import Schedule, Tiles

NAME = "block-sparse"
SUMMARY = "block-sparse FlashAttention backward: Algorithm 4 with the zero blocks skipped"

make_tiles = block_sparse.make_tiles
default_tiles = block_sparse.default_tiles
shared_memory = flash1_bwd.shared_memory
working_set = flash1_bwd.working_set


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    flash1_bwd.tile_program(x, p, t, "block_sparse_bwd", mask=block_sparse.block_mask(t))


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Algorithm 4's closed form over the visited tiles only (non-zero, and visible under the causal mask)."""
    rv, cv, A = block_sparse.visit_totals(p, t)
    return flash1_bwd.counts_from_visits(p, t, rv, cv, A, "block_sparse_bwd")


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory,
                    pass_="backward", make_tiles=make_tiles, options=("density", "mask", "seed"))
