"""Run a schedule on a problem and a profile: tiles, the fit check, counts, time, and the JSON contract.

    >>> from iosim import AttentionProblem, simulate
    >>> r = simulate("naive", AttentionProblem(seq_len=4096, head_dim=128))
    >>> r.traffic["global"]["read_bytes"] + r.traffic["global"]["write_bytes"]
    138412032
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import __version__
from .counts import TENSORS, Counts
from .machine import Counter
from .problem import AttentionProblem
from .profile import Profile, get_profile
from .roofline import TimeEstimate, predict
from .schedules import PASSES, ScheduleError, Tiles, get_module, unit_count
from .schedules.backward import group_sum

Method = Literal["closed", "walk"]
Pass = Literal["forward", "backward", "both"]
# the field's throughput convention (FA2/FA3 benchmarks): backward = 2.5 x forward; as twice the factor
CONVENTIONAL_PASS_FACTOR = {"forward": 2, "backward": 5, "both": 7}


def resolve_tiles(schedule: str, problem: AttentionProblem, profile: Profile,
                  block_q: int | None = None, block_kv: int | None = None, *, pass_: str = "forward",
                  **options) -> Tiles:
    """Explicit tiles if given (both, or one of them with the default for the other), else the default.

    ``options`` (``splits``, ``density``, ``mask``, ``seed``; None = not given) go to schedules that take
    them (a module with ``make_tiles``); giving one to any other schedule is an error."""
    mod = get_module(schedule, pass_)
    options = {k: v for k, v in options.items() if v is not None}
    if hasattr(mod, "make_tiles"):
        return mod.make_tiles(problem, profile, block_q, block_kv, **options)
    if options:
        raise ScheduleError(f"{schedule}: takes no {', '.join('--' + k for k in options)} "
                            f"(only flash-decoding takes --splits, only block-sparse --density/--mask/--seed)")
    if block_q is None and block_kv is None:
        return mod.default_tiles(problem, profile)
    if schedule == "naive" and (block_q is None or block_kv is None):
        raise ScheduleError("naive: give both --block-q and --block-kv to tile its GEMMs, or neither")
    default = mod.default_tiles(problem, profile)
    return Tiles(block_q if block_q is not None else default.block_q,
                 block_kv if block_kv is not None else default.block_kv)


def _on_chip(schedule: str, problem: AttentionProblem, tiles: Tiles,
             pass_: str = "forward") -> tuple[int, int] | None:
    """(shared-memory bytes, register bytes) one thread block needs, or None when the schedule is untiled."""
    mod = get_module(schedule, pass_)
    total = mod.working_set(problem, tiles)
    if total is None:
        return None
    smem = mod.shared_memory(problem, tiles) if hasattr(mod, "shared_memory") else total
    return int(smem), int(total - smem)


def fits(schedule: str, problem: AttentionProblem, tiles: Tiles, profile: Profile, pass_: str = "forward") -> bool:
    try:
        check_fit(schedule, problem, tiles, profile, pass_)
    except ScheduleError:
        return False
    return True


def shrink_to_fit(schedule: str, problem: AttentionProblem, block_q: int, block_kv: int, profile: Profile,
                  pass_: str = "forward") -> Tiles:
    """A kernel's preferred tiles, halved until they fit the profile: Bc first while it is at least half of
    Br, then Br, down to 16 (what FlashAttention's launchers do across GPUs with less shared memory)."""
    Br, Bc = block_q, block_kv
    while not fits(schedule, problem, Tiles(Br, Bc), profile, pass_) and (Bc > 16 or Br > 16):
        if Bc > 16 and Bc >= Br // 2:
            Bc //= 2
        else:
            Br //= 2
    return Tiles(Br, Bc)


def check_fit(schedule: str, problem: AttentionProblem, tiles: Tiles, profile: Profile,
              pass_: str = "forward") -> int | None:
    """Raise ScheduleError if a thread block's tiles exceed the shared memory one block may use, or its
    register-resident part (accumulator, scores, statistics) exceeds the register file (one block may use
    all of an SM's registers). Returns the whole on-chip working set in bytes."""
    need = _on_chip(schedule, problem, tiles, pass_)
    if need is None:
        return None
    smem, regs = need
    where = (f"{schedule}{' backward' if pass_ == 'backward' else ''}: tiles block_q={tiles.block_q}, block_kv={tiles.block_kv} at head_dim="
             f"{problem.head_dim}, {problem.dtype}")
    have_smem = int(profile.require("smem.per_block"))
    if smem > have_smem:
        raise ScheduleError(f"{where} need {smem:,} B of shared memory per thread block, but {profile.name} has "
                            f"{have_smem:,} B; use smaller tiles")
    have_regs = profile.registers.per_sm.value
    if have_regs is not None and regs > have_regs:
        raise ScheduleError(f"{where} need {regs:,} B of registers per thread block (fp32 accumulator, scores "
                            f"and statistics), but {profile.name} has {have_regs:,} B per SM; use smaller tiles")
    return smem + regs


def closed(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from the schedule's closed form (of one pass: forward or backward)."""
    mod = get_module(schedule, pass_)
    per_head = mod.closed_form(problem, tiles)
    for k in per_head.kernels:  # closed forms also run on arrays (iosim.sweep); a scalar problem gets ints
        k.sram_peak = None if k.sram_peak is None else int(k.sram_peak)
    n = unit_count(mod, problem)
    return Counts([k.scaled(n) for k in per_head.kernels] + (group_sum(problem) if pass_ == "backward" else []))


def walk(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from interpreting the tile program of one head (every head is alike;
    one key/value head with its query heads for a schedule whose unit is the kv head)."""
    mod = get_module(schedule, pass_)
    x = Counter(problem)
    mod.program(x, problem, tiles)
    n = unit_count(mod, problem)
    return Counts([k.scaled(n) for k in x.kernels] + (group_sum(problem) if pass_ == "backward" else []))


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
    hbm_model: str = "none: hbm = global (two-level view)"  # set by iosim.l2.apply_l2

    @property
    def on_chip(self) -> tuple[int, int] | None:
        """(shared-memory bytes, register bytes) a thread block allocates; None for untiled naive. With
        both passes, those of the pass whose thread blocks need more."""
        if self.tiles.block_q is None:
            return None
        by_pass = self.tiles_by_pass or {"forward": self.tiles}
        need = [_on_chip(self.schedule, self.problem, t, ps) for ps, t in by_pass.items()]
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
                "bound": self.time.bound,
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
                     **(t.describe_options() if hasattr(t, "describe_options") else {})}
                for ps, t in (self.tiles_by_pass or {self.pass_: self.tiles}).items()
            },
        }


def simulate(schedule: str, problem: AttentionProblem, profile: str | Profile | None = None, *,
             block_q: int | None = None, block_kv: int | None = None, method: Method = "closed",
             pass_: Pass = "forward", splits: int | None = None, density: float | None = None,
             mask=None, seed: int | None = None, l2: bool = False) -> Result:
    """Count and time ``schedule`` on ``problem`` for ``profile`` (default h100-sxm5-80gb).

    ``pass_``: "forward" (default), "backward" (the backward pass, which consumes the forward's O and
    statistics) or "both" (forward kernels, then backward kernels). Each pass uses its own default tiles
    unless ``block_q``/``block_kv`` are given. ``splits`` (flash-decoding), ``density``, ``mask`` (a file or
    an array), ``seed`` (block-sparse) go to the schedules that take them. ``l2=True`` takes ``hbm`` from the
    L2 model (:mod:`iosim.l2`; the CLI's default) where it applies; ``hbm_model`` says which view a result is."""
    prof = get_profile(profile)
    if pass_ not in PASSES:
        raise ScheduleError(f"pass={pass_!r}: expected one of {', '.join(PASSES)}")
    if method not in ("closed", "walk"):
        raise ScheduleError(f"method={method!r}: expected 'closed' or 'walk'")
    passes = ["forward", "backward"] if pass_ == "both" else [pass_]
    options = dict(splits=splits, density=density, mask=mask, seed=seed)
    tiles_by_pass, kernels = {}, []
    for ps in passes:
        tiles = resolve_tiles(schedule, problem, prof, block_q, block_kv, pass_=ps, **options)
        check_fit(schedule, problem, tiles, prof, ps)
        tiles_by_pass[ps] = tiles
        kernels += (closed if method == "closed" else walk)(schedule, problem, tiles, ps).kernels
    counts = Counts(kernels)
    hbm_read = [k.global_read_bytes for k in counts.kernels]  # no L2 model: hbm = global
    hbm_write = [k.global_write_bytes for k in counts.kernels]
    hbm = [r + w for r, w in zip(hbm_read, hbm_write, strict=True)]
    mod = get_module(schedule, passes[0])
    if pass_ == "forward" and hasattr(mod, "time_model"):  # a schedule with its own time model (flash3: iosim.hopper)
        time = mod.time_model(counts, hbm, problem, tiles_by_pass["forward"], prof)
    else:
        time = predict(counts, hbm, problem.dtype, prof)
    result = Result(schedule, prof, problem, tiles_by_pass[passes[0]], counts, hbm_read, hbm_write, time, method,
                    int(prof.require("smem.per_block")), pass_, tiles_by_pass)
    if l2:  # hbm from the L2 model where it applies; elsewhere hbm = global, and hbm_model says why
        from .l2 import apply_l2

        result = apply_l2(result)
    return result
