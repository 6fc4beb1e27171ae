"""The result of a simulation and its public JSON contract (docs/json.md).

Bytes and FLOPs are exact integers for the whole problem; ``traffic`` names the three boundaries (``global``,
``hbm``, ``sram``) as everywhere in iosim.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._version import __version__
from .counts import TENSORS, Counts
from .l2 import L2Result
from .problem import AttentionProblem
from .profile import Profile
from .roofline import TimeEstimate
from .schedules import Tiles, get_schedule

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
        """The public JSON contract (docs/json.md). Bytes and FLOPs are integers for the whole problem."""
        c, p = self.counts, self.problem
        reads, writes = c.global_read, c.global_write
        flops = {k: int(c.flops[k]) for k in ("matmul", "exp", "other")}
        flops["total"] = sum(flops.values())
        hbm_total = sum(self.hbm_read) + sum(self.hbm_write)
        return {
            "iosim_version": __version__,
            "schedule": self.schedule,
            "profile": self.profile.name,
            "problem": p.model_dump(),
            "tiles": {"block_q": self.tiles.block_q, "block_kv": self.tiles.block_kv,
                      "sram_elements": self.tiles.sram_elements},
            "traffic": self.traffic,
            "hbm_model": self.hbm_model,
            "by_tensor": {
                t: {"global_read_bytes": int(reads[t]), "global_write_bytes": int(writes[t])}
                for t in TENSORS if reads[t] or writes[t]
            },
            "flops": flops,
            "conventional_flops": p.conventional_flops() * CONVENTIONAL_PASS_FACTOR[self.pass_] // 2,
            "sram_peak_bytes": self.sram_peak_bytes,
            "sram_shared_bytes": self.on_chip[0] if self.on_chip else None,
            "sram_register_bytes": self.on_chip[1] if self.on_chip else None,
            "sram_budget_bytes": self.sram_budget,
            "register_budget_bytes": self.profile.registers.per_sm.value,
            "time": {
                "predicted_s": self.time.predicted_s,
                "roofline_s": self.time.roofline_s,
                "bound": self.time.bound,
                "kernel": self.time.kernel,
                "calibration": self.time.calibration,
                "warm": self.warm,
                "hbm": self.time_hbm,
                "arithmetic_intensity": flops["total"] / hbm_total if hbm_total else None,
                "unmodeled": self.time.unmodeled,
                "kernels": [
                    {"name": k.name, "grid": k.grid, "utilization": k.utilization,
                     "predicted_s": k.predicted_s, "bound": k.bound, "resource_s": k.resources}
                    for k in self.time.kernels
                ],
            },
            "kernels": [
                {"name": k.name, "grid": k.grid,
                 "global_read_bytes": k.global_read_bytes, "global_write_bytes": k.global_write_bytes,
                 "hbm_read_bytes": hr, "hbm_write_bytes": hw,
                 "sram_read_bytes": k.sram_read, "sram_write_bytes": k.sram_write,
                 "flops": {f: int(k.flops[f]) for f in ("matmul", "exp", "other")}}
                for k, hr, hw in zip(c.kernels, self.hbm_read, self.hbm_write, strict=True)
            ],
            "method": self.method,
            "pass": self.pass_,
            "tiles_by_pass": {
                ps: {"block_q": t.block_q, "block_kv": t.block_kv, "sram_elements": t.sram_elements,
                     **t.describe_options()}
                for ps, t in (self.tiles_by_pass or {self.pass_: self.tiles}).items()
            },
        }
