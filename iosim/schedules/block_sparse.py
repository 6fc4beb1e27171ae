"""Block-sparse FlashAttention: Algorithm 5 of Dao et al., "FlashAttention" (2022), §3.3 and Proposition 4,
forward, without dropout: Algorithm 1 (``flash1``) with the zero blocks of a block mask skipped.

    given a block mask M̃ ∈ {0, 1}^(Tr × Tc) (one entry per Br × Bc tile of S)
    2  initialize O = 0, l = 0, m = -inf in HBM
    5  for j = 1..Tc:
    6      load K_j, V_j from HBM to on-chip SRAM              (every j, as the algorithm writes it)
    7      for i = 1..Tr:
    8          if M̃_ij ≠ 0:                                    a zero block costs no traffic and no FLOPs
    9-13           Algorithm 1 lines 8-13 on tile (i, j)

so the inner-loop traffic of Algorithm 1 is multiplied by the fraction s of non-zero blocks while the K/V
loads and the initialization stay: Θ(Nd + N²d²s/M) (Proposition 4). With a causal mask a block is visited
only if it is non-zero and holds a visible key. Query rows whose every block is zero keep O = 0.

The mask: a file (``.npy``, or text with one row of 0/1 per Q block) whose shape must be (Tr, Tc) for the
tiles, or drawn with exactly round(density·Tr·Tc) non-zero blocks placed uniformly at random by NumPy's
``default_rng(seed)``. A plain :class:`Tiles` (no mask) is dense: the counts are then flash1's.
Tiles default to Algorithm 4's line-2 rule (the same Bc = ceil(M/4d), Br = min(Bc, d) as Algorithm 1) with the
largest M whose *backward* working set fits, so that the forward and the backward (``block_sparse_bwd``) share
one tiling and one mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..blocks import block_rows, cdiv, n_kv_blocks_visible
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from . import flash1, flash1_bwd
from .base import Schedule, ScheduleError, Tiles

NAME = "block-sparse"
SUMMARY = "block-sparse FlashAttention (Alg. 5): Algorithm 1 with the zero blocks of a block mask skipped"
STATS = ("m", "l")


@dataclass(frozen=True)
class SparseTiles(Tiles):
    """Tiles plus the block mask (a tuple of rows of 0/1, Tr × Tc) and where it came from."""

    mask: tuple[tuple[int, ...], ...] = ()
    source: str = "dense"

    @property
    def density(self) -> float:
        m = block_mask(self)
        return float(m.mean()) if m is not None and m.size else 1.0

    def describe_options(self) -> dict:
        return {"density": self.density, "mask": self.source}


def block_mask(t: Tiles) -> np.ndarray | None:
    """The (Tr, Tc) boolean mask, or None for dense tiles."""
    m = getattr(t, "mask", ())
    return np.asarray(m, dtype=bool) if len(m) else None


def _load_mask(path) -> np.ndarray:
    path = Path(path)
    try:
        a = np.load(path, allow_pickle=False) if path.suffix == ".npy" else np.loadtxt(path, ndmin=2)
    except (OSError, ValueError) as err:
        raise ScheduleError(f"mask={str(path)!r}: cannot read a block mask ({err}); expected .npy or text rows of "
                            "0/1") from None
    return np.asarray(a)


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, density=None, mask=None,
               seed=None) -> SparseTiles:
    base = flash1_bwd.default_tiles(p, profile) if block_q is None or block_kv is None else None
    Br = block_q if block_q is not None else base.block_q
    Bc = block_kv if block_kv is not None else base.block_kv
    sram_elements = base.sram_elements if base is not None and block_q is None and block_kv is None else None
    Tr, Tc = cdiv(p.seq_len, Br), cdiv(p.kv_len, Bc)
    if mask is not None and (density is not None or seed is not None):
        raise ScheduleError("block-sparse: give mask, or density (with seed), not both")
    if mask is not None:
        src = "array" if not isinstance(mask, str | Path) else str(mask)
        m = _load_mask(mask) if isinstance(mask, str | Path) else np.asarray(mask)
        if m.shape != (Tr, Tc):
            raise ScheduleError(f"block-sparse: mask {src} has shape {m.shape}, but tiles block_q={Br}, block_kv={Bc} "
                                f"cut seq_len={p.seq_len} x kv_len={p.kv_len} into ({Tr}, {Tc}) blocks")
        if not np.isin(m, (0, 1)).all():
            raise ScheduleError(f"block-sparse: mask {src} must hold only 0 and 1")
    else:
        s = 1.0 if density is None else density
        if not isinstance(s, int | float) or isinstance(s, bool) or not 0 < s <= 1:
            raise ScheduleError(f"density={density!r}: expected a fraction of non-zero blocks in (0, 1]")
        nnz = max(1, round(s * Tr * Tc))
        m = np.zeros(Tr * Tc, dtype=bool)
        m[np.random.default_rng(0 if seed is None else seed).choice(Tr * Tc, size=nnz, replace=False)] = True
        m = m.reshape(Tr, Tc)
        src = f"drawn: density {s}, seed {0 if seed is None else seed}"
    return SparseTiles(Br, Bc, sram_elements, mask=tuple(tuple(int(v) for v in row) for row in m), source=src)


def default_tiles(p: AttentionProblem, profile) -> SparseTiles:
    return make_tiles(p, profile)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    mask = block_mask(t)

    with x.kernel("block_sparse_fwd", grid=1), x.thread_block():
        for i in range(Tr):  # line 2: O = 0, l = 0, m = -inf in HBM
            q = block_rows(i, Br, N)
            x.fill("O", q, 0.0)
            x.fill("l", q, 0.0)
            x.fill("m", q, float("-inf"))
        for j in x.order(range(Tc)):  # line 5
            k = block_rows(j, Bc, Nk)
            K_j = x.load("K", k)  # line 6
            V_j = x.load("V", k)
            for i in range(Tr):  # line 7
                if mask is not None and not mask[i, j]:
                    continue  # line 8: a zero block, skipped
                if j >= n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal):
                    continue  # causal: tile (i, j) entirely masked
                q = block_rows(i, Br, N)
                Q_i = x.load("Q", q)  # Alg. 1 line 8
                O_i = x.load("O", q)
                l_i = x.load("l", q)
                m_i = x.load("m", q)
                S_ij = x.scores(Q_i, K_j, q, k)  # line 9
                m_ij, P_ij, l_ij = x.block_stats(S_ij)  # line 10
                O_i, l_i, m_i = x.flash1_update(O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j)  # lines 11-12
                x.store("O", q, O_i)  # line 12
                x.store("l", q, l_i)  # line 13
                x.store("m", q, m_i)


shared_memory = flash1.shared_memory
working_set = flash1.working_set


def visited(p: AttentionProblem, t: Tiles) -> np.ndarray:
    """(Tr, Tc) boolean: the tiles the program visits (non-zero and, with causal, holding a visible key)."""
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc = cdiv(p.seq_len, Br), cdiv(p.kv_len, Bc)
    i = np.arange(Tr)
    n = np.asarray(n_kv_blocks_visible(i, Br, Bc, p.seq_len, p.kv_len, p.causal)).reshape(-1)
    vis = np.arange(Tc)[None, :] < n[:, None]
    mask = block_mask(t)
    return vis if mask is None else vis & mask


def visit_totals(p: AttentionProblem, t: Tiles) -> tuple[int, int, int]:
    """rv = Σ br_i, cv = Σ bc_j, A = Σ br_i·bc_j over the visited tiles (i, j)."""
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc = cdiv(p.seq_len, Br), cdiv(p.kv_len, Bc)
    br = np.minimum((np.arange(Tr) + 1) * Br, p.seq_len) - np.arange(Tr) * Br
    bc = np.minimum((np.arange(Tc) + 1) * Bc, p.kv_len) - np.arange(Tc) * Bc
    vis = visited(p, t)
    return int((br[:, None] * vis).sum()), int((bc[None, :] * vis).sum()), int((br[:, None] * bc * vis).sum())


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Algorithm 1's closed form (``flash1.closed_form``) over the visited tiles only: rv = Σ br_i,
    cv = Σ bc_j, A = Σ br_i·bc_j over visited (i, j). Dense and non-causal: rv = Tc·N, A = N·N_kv; with
    tiles that divide the sequences, every sum is the dense one times s = (non-zero blocks) / (Tr·Tc)."""
    if not isinstance(p, AttentionProblem):
        raise ScheduleError("block-sparse: its closed form runs one problem at a time (no array sweeps); "
                            "use simulate() per point")
    N, Nk, d, b, s = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    rv, cv, A = visit_totals(p, t)

    k = KernelCounts("block_sparse_fwd", grid=1)
    k.global_read.update(K=Nk * d * b, V=Nk * d * b,  # line 6: every K/V block
                         Q=rv * d * b, O=rv * d * b, l=rv * s, m=rv * s)  # per visited tile
    k.global_write.update(O=N * d * b + rv * d * b, l=N * s + rv * s, m=N * s + rv * s)  # line 2 + per tile
    k.flops.update(matmul=4 * A * d, exp=A + 2 * rv, other=4 * A + (8 + 4 * d) * rv)
    k.sram_write = 2 * Nk * d * b + rv * (2 * d * b + 4 * d + 24) + 8 * A
    k.sram_read = 2 * rv * d * b + 2 * cv * d * b + 8 * A + rv * (4 * d + 24)
    k.sram_peak = working_set(p, t)
    return Counts([k])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS,
                    make_tiles=make_tiles, options=("density", "mask", "seed"))
