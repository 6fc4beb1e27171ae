"""The tile configuration, and the record by which the registry knows a schedule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields


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

    def describe_options(self) -> dict:
        """The schedule's own options these tiles carry (splits, a block mask), for JSON and the CLI."""
        return {}


@dataclass(frozen=True, eq=False)
class ScheduleOptions:
    """The options some schedules' tiles take, None = not given: flash-decoding's ``splits`` (K/V splits), and with
    iosim's decode kernel ``kv_lens`` (keys of each sequence), ``page_size`` (tokens per page of a paged cache) and
    ``kv_dtype`` (the cache's dtype where it is not the problem's: "fp8", e4m3 with a scale per kv head);
    block-sparse's ``density`` (fraction of non-zero blocks of a drawn mask), ``mask`` (a .npy or text file, or an
    array: one row of 0/1 per Q block) and ``seed`` (of the drawn mask); flash2 backward's ``gqa`` ("expand", as
    FlashAttention-2, or "grouped", as iosim's kernel); flash2's ``window`` (left, right) and ``seqlens`` (packed
    sequences); fp8-quantize's ``incoherent`` (Q and K rotated before they are quantized). ``simulate`` takes them as its own keyword parameters; a schedule given one it does not take refuses it
    (:func:`iosim.schedules.resolve_tiles`). ``tiling`` is not a keyword: ``simulate`` sets it from the kernel
    (flash-decoding: "iosim" for ``kernel="iosim-decode"``, whose tile program is iosim's decode kernel's,
    :mod:`iosim.schedules.paged_decoding`)."""

    splits: int | None = None
    density: float | None = None
    mask: object = None
    seed: int | None = None
    gqa: str | None = None
    kv_lens: object = None
    page_size: int | None = None
    kv_dtype: str | None = None
    tiling: str | None = None
    window: tuple | None = None
    seqlens: tuple | None = None
    incoherent: bool | None = None

    def given(self) -> dict:
        """The options given (not None), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def only(self, names) -> ScheduleOptions:
        """These options with all but ``names`` dropped."""
        return ScheduleOptions(**{k: v for k, v in self.given().items() if k in names})


@dataclass(frozen=True)
class Schedule:
    """One pass of one schedule, as the registry holds it: its tile program, closed form and tile-fit rule.

    ``program(x, problem, tiles)`` runs the tile program of one unit (one query head, or one key/value head with
    its group of query heads when ``unit == "kv_head"``) on an interpreter ``x``; ``closed_form(problem, tiles)``
    returns the same counts as a formula. ``working_set`` is the on-chip bytes one thread block allocates (None:
    untiled), of which ``shared_memory`` is in shared memory (None: all of it) and the rest in registers.
    ``make_tiles`` builds tiles from the schedule's own ``options`` (flash-decoding's splits, block-sparse's mask,
    flash2 backward's gqa); ``tile_unit(tiles)``, where given, lets such an option choose the unit (gqa="grouped"
    runs one program per kv head).
    ``time_model`` names the time model of the forward pass: "roofline", or "hopper" (FA3's pipeline).
    ``dram(problem, tiles, profile)``, where given, is a closed form of each kernel's DRAM (read, write) bytes for tiles the
    L2 model does not walk (None from it: no closed form for these tiles); a unit "call" is the whole problem, run
    once (iosim's decode kernel over a ragged batch: sequences differ). ``dram_model`` says what that closed form
    assumes (the result's ``hbm_model``).
    """

    name: str
    summary: str
    program: Callable
    closed_form: Callable
    default_tiles: Callable
    working_set: Callable
    shared_memory: Callable | None = None
    pass_: str = "forward"
    stats: tuple[str, ...] = ()
    unit: str = "head"
    make_tiles: Callable | None = None
    options: tuple[str, ...] = ()
    time_model: str = "roofline"
    tile_unit: Callable | None = None
    dram: Callable | None = None
    dram_model: str = ""

    @property
    def label(self) -> str:
        return self.name if self.pass_ == "forward" else f"{self.name} backward"

    def on_chip(self, problem, tiles: Tiles) -> tuple[int, int] | None:
        """(shared-memory bytes, register bytes) one thread block needs, or None when the schedule is untiled."""
        total = self.working_set(problem, tiles)
        if total is None:
            return None
        smem = total if self.shared_memory is None else self.shared_memory(problem, tiles)
        return int(smem), int(total - smem)

    def unit_of(self, tiles: Tiles | None = None) -> str:
        """What one program run covers with ``tiles``: "head" (a query head), "kv_head" (one with its group) or
        "call" (the whole problem)."""
        return self.unit if tiles is None or self.tile_unit is None else self.tile_unit(tiles)

    def units(self, problem, tiles: Tiles | None = None) -> int:
        """How many times the one-unit program runs for the whole problem."""
        unit = self.unit_of(tiles)
        if unit == "call":
            return 1
        return problem.batch * problem.kv_heads if unit == "kv_head" else problem.n_heads_total
