"""A scenario's cases (profile x problem x schedule x tiles), each simulated into one flat record: what the
CSV holds and the plots read."""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import cdiv
from ..hardware.gpu import Profile, ProfileError, get_profile, profile_from_dict
from ..problem import AttentionProblem
from ..result import Result
from ..schedules import ScheduleError, get_schedule, resolve_tiles
from ..simulate import simulate
from ..timing import KernelError
from .saved import RECORD_FIELDS
from .schema import Scenario

BOUNDARIES = ("global", "hbm", "sram")


@dataclass
class Case:
    """One simulation: a profile, a schedule, a problem and tiles."""

    index: int
    profile: str
    schedule: str
    problem: dict
    tiles: dict  # block_q, block_kv, sram_elements (None = the schedule's default)


def expand(scn: Scenario) -> list[Case]:
    """Every case of a scenario, in a stable order: profile, problem, schedule, tiles."""
    tiles = [{"block_q": None, "block_kv": None, "sram_elements": None}] if scn.tiles == "default" \
        else scn.tiles.expand()
    cases: list[Case] = []
    for prof in scn.profiles:
        for block in scn.problems:
            for kw in block.expand():
                for sched in scn.schedules:
                    for t in tiles:
                        cases.append(Case(len(cases), prof, sched, kw, dict(t)))
    return cases


def tiles_from_sram(schedule: str, M: int, d: int) -> tuple[int, int]:
    """FlashAttention-1 Algorithm 1 line 1: Bc = ceil(M/4d), Br = min(Bc, d). flash2's loop order is the other
    way round (the Q block stays on chip while K/V stream), so its roles swap: Br = ceil(M/4d), Bc = min(Br, d)."""
    big = max(1, cdiv(M, 4 * d))
    small = min(big, d)
    return (big, small) if schedule == "flash2" else (small, big)


def compulsory_bytes(p: AttentionProblem) -> int:
    """Q, K, V read once and O written once: the least any exact schedule moves (the seeds' '4.2 MB')."""
    b, d = p.elem_bytes, p.head_dim
    return b * d * (2 * p.batch * p.heads * p.seq_len + 2 * p.batch * p.kv_heads * p.kv_len)


def _with_room(profile: Profile, need: int) -> Profile:
    """The same profile with room on chip (shared memory per block and per SM, registers per SM) for ``need``
    bytes: a hypothetical GPU, for tiles or SRAM sizes the real one cannot hold."""
    data = profile.model_dump()
    note = f"hypothetical: raised by iosim to fit {need:,} B"
    smem, regs = data["memory"][2], data["memory"][3]
    smem["per_block"] = {"value": max(need, smem["per_block"]["value"] or 0), "source": note}
    smem["per_sm"] = {"value": max(need, smem["per_sm"]["value"] or 0), "source": note}
    regs["per_sm"] = {"value": max(need, regs["per_sm"]["value"] or 0), "source": note}
    return profile_from_dict(data, f"{profile.name} (hypothetical on-chip memory)")


def _working_set(schedule: str, problem: AttentionProblem, tiles, pass_: str) -> int:
    passes = ["forward", "backward"] if pass_ == "both" else [pass_]
    return max(int(get_schedule(schedule, ps).working_set(problem, tiles) or 0) for ps in passes)


@dataclass
class CaseResult:
    case: Case | None
    record: dict  # flat: what the CSV holds and the plots read
    result: dict | None  # Result.to_json(), or None where the case could not run


def run_case(case: Case, allow_overfill: bool = False, pass_: str = "forward", l2_model: bool = False,
             kernels: tuple[tuple[str, str], ...] = (), warm: bool = False) -> CaseResult:
    """Simulate one case. Tiles that do not fit the profile are an error in the record, unless overfill is
    allowed or the tiles come from a hypothetical SRAM size: then they run on a copy of the profile with room
    for them, and the record says ``fits: false``. ``kernels``: (schedule, time-model kernel) pairs; ``warm``:
    back-to-back calls (iosim.timing)."""
    profile = get_profile(case.profile)
    problem = AttentionProblem.make(**case.problem)
    M = case.tiles["sram_elements"]
    bq, bkv = case.tiles["block_q"], case.tiles["block_kv"]
    if M is not None and case.schedule != "naive":
        bq, bkv = tiles_from_sram(case.schedule, M, problem.head_dim)
    kwargs: dict = {"block_q": bq, "block_kv": bkv, "pass_": pass_, "l2": l2_model,
                    "kernel": dict(kernels).get(case.schedule), "warm": warm}
    fits, note = True, None
    try:
        try:
            r = simulate(case.schedule, problem, profile, **kwargs)
        except ScheduleError as exc:
            if not ((allow_overfill or M is not None) and " need " in str(exc)):
                raise
            fits, note = False, " ".join(str(exc).split())
            tiles = resolve_tiles(case.schedule, problem, profile, bq, bkv)
            roomy = _with_room(profile, _working_set(case.schedule, problem, tiles, pass_))
            r = simulate(case.schedule, problem, roomy, **kwargs)
    except (ScheduleError, ProfileError, KernelError) as exc:
        rec = _record(case, problem, None, profile)
        rec.update(fits=False, error=" ".join(str(exc).split()), **{"pass": pass_})
        return CaseResult(case, rec, None)
    rec = _record(case, problem, r, profile)
    rec.update(fits=fits, note=note, sram_elements=M if M is not None else r.tiles.sram_elements,
               hbm_model="l2" if l2_model else "none", **{"pass": pass_})
    return CaseResult(case, rec, r.to_json())


def _record(case: Case, p: AttentionProblem, r: Result | None, profile: Profile) -> dict:
    rec: dict = {k: None for k in RECORD_FIELDS}
    rec.update(case=case.index, profile=profile.name, schedule=case.schedule, **{"pass": "forward"})
    rec.update({k: getattr(p, k) for k in ("batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
                                            "dtype", "causal")})
    rec["compulsory_bytes"] = compulsory_bytes(p)
    rec["matrix_bytes"] = p.seq_len * p.kv_len * p.elem_bytes  # one N x N_kv matrix (S or P) of one head
    rec["linear_bytes"] = p.elem_bytes * p.head_dim * 2 * (p.seq_len + p.kv_len)  # Q, K, V, O of one head
    if r is None:
        return rec
    j = r.to_json()
    rec.update(block_q=r.tiles.block_q, block_kv=r.tiles.block_kv, sram_elements=r.tiles.sram_elements)
    for b in BOUNDARIES:
        rd, wr = j["traffic"][b]["read_bytes"], j["traffic"][b]["write_bytes"]
        rec.update({f"{b}_read_bytes": rd, f"{b}_write_bytes": wr, f"{b}_bytes": rd + wr})
    rec["global_over_compulsory"] = rec["global_bytes"] / rec["compulsory_bytes"]
    rec["hbm_over_compulsory"] = rec["hbm_bytes"] / rec["compulsory_bytes"]
    for k, v in j["flops"].items():
        rec[f"flops_{k}"] = v
    rec["conventional_flops"] = j.get("conventional_flops")
    rec["predicted_s"] = j["time"]["predicted_s"]
    rec["bound"] = j["time"]["bound"]
    # whose time it is: the kernel the time model assumed ("roofline": the peak bound alone) and on what its rates
    # were measured ("uncalibrated": datasheet numbers); the figures and tables say both
    rec["time_kernel"] = j["time"].get("kernel")
    rec["time_calibration"] = j["time"].get("calibration")
    rec["roofline_s"] = j["time"].get("roofline_s")
    rec["arithmetic_intensity"] = j["time"]["arithmetic_intensity"]
    if rec["predicted_s"]:
        rec["attained_flops_per_s"] = rec["flops_total"] / rec["predicted_s"]
    rec["energy_j"] = j["time"].get("energy_j")
    c = j["time"].get("clock")
    if c:  # the clock of the call predicted_s means (a share of each phase's)
        rec["clock_hz"] = sum(s * f for s, f in zip(c["shares"], (c["start_hz"], c["fast_hz"], c["steady_hz"]),
                                                    strict=True))
    rec["sram_peak_bytes"] = j.get("sram_peak_bytes")
    rec["by_tensor"] = j["by_tensor"]  # not a CSV column: written long-form to by_tensor.csv
    return rec
