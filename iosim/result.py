"""The result of a simulation and its public JSON contract (docs/json.md).

Bytes and FLOPs are exact integers for the whole problem; ``traffic`` names the three boundaries (``global``,
``hbm``, ``sram``) as everywhere in iosim. :class:`ResultJSON` is the contract as a typed model: ``Result.to_json()``
is its ``model_dump``, ``iosim run`` saves one per case in ``results.json`` and ``iosim plot`` validates them on
reading; its JSON Schema is ``docs/schema/result.schema.json`` (``iosim schema result``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ._version import __version__
from .counts import TENSORS, Counts
from .hardware.gpu import Profile
from .l2 import L2Result
from .problem import AttentionProblem
from .schedules import Tiles, get_schedule
from .timing.estimate import TimeEstimate

# the field's throughput convention (FA2/FA3 benchmarks): backward = 2.5 x forward; as twice the factor
CONVENTIONAL_PASS_FACTOR = {"forward": 2, "backward": 5, "both": 7}


@dataclass
class Result:
    schedule: str
    profile: Profile
    problem: AttentionProblem
    tiles: Tiles
    counts: Counts
    hbm_read: list[int]
    hbm_write: list[int]
    time: TimeEstimate
    method: str
    sram_budget: int
    pass_: str = "forward"  # "forward", "backward" or "both" (forward kernels first)
    tiles_by_pass: dict[str, Tiles] | None = None  # each pass's tiles; ``tiles`` is the first pass's
    hbm_model: str = "none: hbm = global (two-level view)"  # which view hbm is: the L2 model's, or why not
    l2: L2Result | None = None  # the L2 model's details (per-tensor misses, residency, dirty bytes left at the end)
    kernel: object = None  # the kernel description the time model assumed (iosim.timing.KernelDesc), or None
    warm: bool = False  # time of back-to-back calls on the same inputs (tensors that fit stay in L2)
    run: str | float = "record"  # which call of a run the time means (iosim.timing.clock)

    @property
    def on_chip(self) -> tuple[int, int] | None:
        """(shared-memory bytes, register bytes) a thread block allocates; None for untiled naive. With
        both passes, those of the pass whose thread blocks need more."""
        if self.tiles.block_q is None:
            return None
        by_pass = self.tiles_by_pass or {"forward": self.tiles}
        need = [get_schedule(self.schedule, ps).on_chip(self.problem, t) for ps, t in by_pass.items()]
        return max((n for n in need if n is not None), key=sum, default=None)

    @property
    def traffic(self) -> dict:
        c = self.counts
        return {
            "global": {"read_bytes": c.global_read_bytes, "write_bytes": c.global_write_bytes},
            "hbm": {"read_bytes": sum(self.hbm_read), "write_bytes": sum(self.hbm_write)},
            "sram": {"read_bytes": c.sram_read_bytes, "write_bytes": c.sram_write_bytes},
        }

    @property
    def time_hbm(self) -> dict:
        """The DRAM bytes the predicted time prices: ``traffic["hbm"]`` (a cold L2, as Nsight Compute measures),
        or none where warm calls keep the inputs in L2 (``warm=True`` and a kernel model: :mod:`iosim.timing`)."""
        if self.time.dram_free:
            return {"read_bytes": 0, "write_bytes": 0}
        return {"read_bytes": sum(self.hbm_read), "write_bytes": sum(self.hbm_write)}

    @property
    def sram_peak_bytes(self) -> int | None:
        """On-chip bytes one thread block allocates (None for untiled naive: a library GEMM's business)."""
        if self.tiles.block_q is None:
            return None
        return self.counts.sram_peak

    def to_json(self) -> dict:
        """The public JSON contract (docs/json.md) as a dict. Bytes and FLOPs are integers for the whole problem."""
        return self.to_model().to_json()

    def to_model(self) -> ResultJSON:
        """The public JSON contract as its typed model (:class:`ResultJSON`)."""
        c, p = self.counts, self.problem
        reads, writes = c.global_read, c.global_write
        flops = {k: int(c.flops[k]) for k in ("matmul", "exp", "other")}
        total_flops = sum(flops.values())
        hbm_total = sum(self.hbm_read) + sum(self.hbm_write)
        on_chip = self.on_chip
        t = self.time
        return ResultJSON(
            iosim_version=__version__, schedule=self.schedule, profile=self.profile.name, problem=p,
            tiles=_tiles_json(self.tiles), traffic=Traffic.model_validate(self.traffic),
            hbm_model=self.hbm_model,
            by_tensor={tn: TensorBytes(global_read_bytes=int(reads[tn]), global_write_bytes=int(writes[tn]))
                       for tn in TENSORS if reads[tn] or writes[tn]},
            flops=FlopsWithTotal(**flops, total=total_flops),
            conventional_flops=p.conventional_flops() * CONVENTIONAL_PASS_FACTOR[self.pass_] // 2,
            sram_peak_bytes=self.sram_peak_bytes,
            sram_shared_bytes=on_chip[0] if on_chip else None,
            sram_register_bytes=on_chip[1] if on_chip else None,
            sram_budget_bytes=self.sram_budget, register_budget_bytes=self.profile.registers.per_sm.value,
            time=TimeJSON(
                predicted_s=t.predicted_s, roofline_s=t.roofline_s, bound=t.bound, kernel=t.kernel,
                calibration=t.calibration, warm=self.warm, hbm=ByteCount(**self.time_hbm),
                arithmetic_intensity=total_flops / hbm_total if hbm_total else None, unmodeled=t.unmodeled,
                kernels=[KernelTimeJSON(name=k.name, grid=k.grid, utilization=k.utilization,
                                        predicted_s=k.predicted_s, bound=k.bound, resource_s=k.resources)
                         for k in t.kernels],
                uncertainty=UncertaintyJSON(**vars(t.uncertainty)) if t.uncertainty else None, energy_j=t.energy_j,
                clock=ClockJSON(**{**vars(t.clock), "shares": list(t.clock.shares)}) if t.clock else None),
            kernels=[KernelCountsJSON(name=k.name, grid=k.grid, global_read_bytes=k.global_read_bytes,
                                      global_write_bytes=k.global_write_bytes, hbm_read_bytes=hr,
                                      hbm_write_bytes=hw, sram_read_bytes=k.sram_read,
                                      sram_write_bytes=k.sram_write,
                                      flops=Flops(**{f: int(k.flops[f]) for f in ("matmul", "exp", "other")}))
                     for k, hr, hw in zip(c.kernels, self.hbm_read, self.hbm_write, strict=True)],
            method=self.method, pass_=self.pass_,
            tiles_by_pass={ps: PassTilesJSON(**_tiles_json(tl).model_dump(), **tl.describe_options())
                           for ps, tl in (self.tiles_by_pass or {self.pass_: self.tiles}).items()},
        )


def _tiles_json(t: Tiles) -> TilesJSON:
    return TilesJSON(block_q=t.block_q, block_kv=t.block_kv, sram_elements=t.sram_elements)


# -- the JSON contract as a typed model ---------------------------------------------------------------------


class _Contract(BaseModel):
    """Fields in the order the JSON writes them; unknown keys are an error (a misspelled key is not data)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ByteCount(_Contract):
    read_bytes: int
    write_bytes: int


class Traffic(_Contract):
    """Bytes at each boundary: ``global`` (SM <-> L2), ``hbm`` (L2 <-> DRAM), ``sram`` (on chip)."""

    global_: ByteCount = Field(alias="global")
    hbm: ByteCount
    sram: ByteCount


class TensorBytes(_Contract):
    global_read_bytes: int
    global_write_bytes: int


class Flops(_Contract):
    matmul: int
    exp: int
    other: int


class FlopsWithTotal(Flops):
    total: int


class TilesJSON(_Contract):
    block_q: int | None = Field(description="Br; null for untiled naive")
    block_kv: int | None = Field(description="Bc; null for untiled naive")
    sram_elements: int | None = Field(description="M (elements) where the tiles were derived from it")


class PassTilesJSON(TilesJSON):
    """A pass's tiles with the schedule's own options; an option the schedule does not take is left out."""

    splits: int | None = Field(None, description="flash-decoding: K/V splits")
    chunk: int | None = Field(None, description="flash-decoding with iosim-decode: keys per split")
    page_size: int | None = Field(None, description="flash-decoding with iosim-decode: tokens per page of a paged "
                                  "cache (null: contiguous)")
    kv_lens: list[int] | None = Field(None, description="flash-decoding with iosim-decode: keys of each sequence")
    kv_dtype: Literal["fp8"] | None = Field(None, description="flash-decoding with iosim-decode: the cache's dtype "
                                            "where it is not the problem's (fp8: e4m3, a scale per kv head)")
    density: float | None = Field(None, description="block-sparse: fraction of non-zero blocks")
    mask: str | None = Field(None, description="block-sparse: where the block mask came from")
    gqa: Literal["expand", "grouped"] | None = Field(None, description="flash2 backward: grouped-query design")
    window: list[int | None] | None = Field(None, description="flash2: sliding window [left, right], null for no "
                                                               "bound on a side")
    seqlens: list[list[int]] | None = Field(None, description="flash2: packed sequences, [queries, keys] each")
    layout: str | None = Field(None, description="flash3 at fp8 with iosim-flash3: the operand layout its kernel "
                               "reads (iosim's: V^T padded to 16 keys, block scales, O in bf16)")

    @model_serializer(mode="wrap")
    def _options_given(self, handler):
        data = handler(self)
        return {k: v for k, v in data.items() if k in TilesJSON.model_fields or k in self.model_fields_set}


class KernelTimeJSON(_Contract):
    name: str
    grid: int
    utilization: float = Field(description="fraction of the chip its waves keep busy")
    predicted_s: float
    bound: str
    resource_s: dict[str, float] = Field(description="time per resource at full-chip rate, seconds")


class UncertaintyJSON(_Contract):
    """The band of measured time around ``predicted_s`` on recorded kernels like this one (docs/timing.md)."""

    low_s: float | None = Field(description="predicted_s times the 10th percentile of measured ÷ predicted in the "
                                "group; null: no record")
    high_s: float | None = Field(description="predicted_s times the 90th percentile; null: no record")
    group: str = Field(description="'<kernel>, <regime>' (decode, causal, non-causal), '<kernel>, all regimes' "
                       "(too few rows in the regime) or 'no record'")
    rows: int = Field(description="time-record rows in the group")
    device: str = Field(description="the record's profile, 'pooled: <profiles>' for a profile with no record of "
                        "its own, or empty (no record)")


class ClockJSON(_Contract):
    """The clocks of a prediction under the board's power limiter (iosim.timing.clock, docs/timing.md)."""

    run: str = Field(description="which call of a run of back-to-back calls predicted_s means: 'record' (the "
                     "time records' median of 20 calls after 2), 'single' (one call from rest), 'steady', or "
                     "'<seconds> s' (the mean call of a run that long)")
    start_hz: float = Field(description="the SM clock before the limiter acts")
    fast_hz: float = Field(description="the clock from engage_s on, at most the fast loop's power")
    steady_hz: float = Field(description="the clock from settle_s on, at most the board's limit (= fast_hz where "
                             "settle_s is null)")
    engage_s: float = Field(description="seconds from rest until the fast loop acts")
    settle_s: float | None = Field(description="seconds from rest until the call's averaged power reaches the "
                                   "board's limit; null: it never does")
    shares: list[float] = Field(min_length=3, max_length=3, description="share of the calls run means at "
                                "start_hz, fast_hz, steady_hz")
    watts: float = Field(description="the call's board power at start_hz")
    joules: float = Field(description="the call's energy under run (= energy_j)")


class TimeJSON(_Contract):
    predicted_s: float
    roofline_s: float | None
    bound: str
    kernel: str
    calibration: str
    warm: bool
    hbm: ByteCount = Field(description="the DRAM bytes predicted_s prices")
    arithmetic_intensity: float | None = Field(description="total FLOPs per traffic.hbm byte")
    unmodeled: dict[str, str]
    kernels: list[KernelTimeJSON]
    energy_j: float | None = Field(
        None, description="joules of one call (iosim.timing.energy) at the clock clock.run means, from the "
        "profile's calibration.power; null where the profile has none")
    clock: ClockJSON | None = Field(
        None, description="the SM clocks the call runs at under the board's power limiter (iosim.timing.clock); "
        "null where the profile's calibration.power has no limiter, or for the roofline")
    uncertainty: UncertaintyJSON | None = Field(
        None, description="the time records' band around predicted_s (iosim.timing.uncertainty); absent from "
        "results saved before it")


class KernelCountsJSON(_Contract):
    name: str
    grid: int
    global_read_bytes: int
    global_write_bytes: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    sram_read_bytes: int
    sram_write_bytes: int
    flops: Flops


class ResultJSON(_Contract):
    """One simulation as JSON (docs/json.md): ``iosim simulate --json``, ``Result.to_json()``, and each entry of
    ``results`` in an ``iosim run`` folder's results.json. Write it with :meth:`to_json` (the key order and
    values of the contract)."""

    iosim_version: str
    schedule: str
    profile: str
    problem: AttentionProblem
    tiles: TilesJSON
    traffic: Traffic
    hbm_model: str
    by_tensor: dict[str, TensorBytes] = Field(description=f"per tensor ({', '.join(TENSORS)}) it touches")
    flops: FlopsWithTotal
    conventional_flops: int
    sram_peak_bytes: int | None
    sram_shared_bytes: int | None
    sram_register_bytes: int | None
    sram_budget_bytes: int
    register_budget_bytes: int | None
    time: TimeJSON
    kernels: list[KernelCountsJSON]
    method: Literal["closed", "walk"]
    pass_: Literal["forward", "backward", "both"] = Field(alias="pass")
    tiles_by_pass: dict[str, PassTilesJSON]

    def to_json(self) -> dict:
        """The contract as a dict of plain values (``json.dumps`` writes it)."""
        return self.model_dump(by_alias=True)
