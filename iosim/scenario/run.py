"""Running a scenario: every case simulated, the profiles' rates kept for the figures. Quiet: progress goes
only through the optional callback. Cases that several scenarios share are simulated once."""

from __future__ import annotations

import copy
import itertools
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from ..hardware.gpu import Profile, ProfileError, get_profile
from .cases import Case, CaseResult, expand, run_case
from .schema import Scenario


@dataclass
class ScenarioRun:
    scenario: Scenario
    cases: list[CaseResult] = field(default_factory=list)
    profiles: dict = field(default_factory=dict)  # name -> the rates the roofline needs

    @property
    def records(self) -> list[dict]:
        return [c.record for c in self.cases]


def profile_summary(p: Profile) -> dict:
    """What a figure needs from a profile, saved with the results so ``iosim plot`` needs no profile files."""

    def val(path):
        try:
            return p.require(path)
        except ProfileError:
            return None

    return {
        "name": p.name, "display_name": p.display_name,
        "dram_bandwidth": val("dram.bandwidth"), "l2_bandwidth": val("l2.bandwidth"),
        "matmul": {dt: (val("compute.fp32") if dt == "fp32" else val(f"compute.tensor.{dt}"))
                   for dt in ("fp16", "bf16", "fp32")},
        "fp32": val("compute.fp32"), "smem_per_block": p.smem.per_block.value,
    }


def run_scenario(scn: Scenario, progress: Callable[[int, int], None] | None = None) -> ScenarioRun:
    """Simulate every case of ``scn`` (closed forms). Quiet; ``progress(done, total)`` is called per case."""
    return run_scenarios([scn], progress)[0]


def run_scenarios(scns: list[Scenario], progress: Callable[[int, int], None] | None = None,
                  workers: int = 1) -> list[ScenarioRun]:
    """Simulate every case of every scenario, a case that several share (the same profile, schedule,
    problem, tiles, pass and L2 model) once, on ``workers`` processes; the results are the same either way.
    ``progress(done, total)`` counts cases, shared ones as often as they appear."""
    jobs = [[(case, _settings(scn)) for case in expand(scn)] for scn in scns]
    shared: dict[tuple, list[tuple[Case, tuple]]] = {}
    for case, settings in itertools.chain.from_iterable(jobs):
        shared.setdefault(_key(case, settings), []).append((case, settings))
    total, done, first = sum(map(len, jobs)), 0, {}
    for key, result in _simulate({k: v[0] for k, v in shared.items()}, workers):
        first[key] = result
        done += len(shared[key])
        if progress is not None:
            progress(done, total)
    runs = []
    for scn, scn_jobs in zip(scns, jobs):
        run = ScenarioRun(scn, [_numbered(first[_key(c, st)], c) for c, st in scn_jobs])
        for name in scn.profiles:
            p = get_profile(name)
            run.profiles[p.name] = profile_summary(p)
        runs.append(run)
    return runs


def _settings(scn: Scenario) -> tuple:
    """What ``run_case`` takes besides the case: overfill allowed, pass, L2 model, time-model kernels, warm."""
    return (scn.tiles != "default" and scn.tiles.allow_overfill, scn.pass_, scn.l2_model,
            tuple(sorted(scn.kernel.items())), scn.warm)


def _key(case: Case, settings: tuple) -> tuple:
    return (case.profile, case.schedule, tuple(sorted(case.problem.items())), tuple(sorted(case.tiles.items())),
            *settings)


def _run_job(job: tuple[Case, tuple]) -> CaseResult:
    case, settings = job
    return run_case(case, *settings)


def _simulate(distinct: dict[tuple, tuple[Case, tuple]], workers: int) -> Iterator[tuple[tuple, CaseResult]]:
    """(key, result) per distinct case: in order on this process, or as they finish on a pool of processes
    (forked where the platform can, so that the workers start with iosim already imported)."""
    if workers <= 1 or len(distinct) < 2:
        for key, job in distinct.items():
            yield key, _run_job(job)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        longest_first = sorted(distinct.items(), key=lambda kv: _cost(*kv[1]), reverse=True)
        futures = {pool.submit(_run_job, job): key for key, job in longest_first}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def _cost(case: Case, settings: tuple) -> tuple:
    """A rough order of work, to start the long cases first: the L2 model's trace, then the problem's size."""
    p = case.problem
    return (settings[2], p["batch"] * p["heads"] * p["seq_len"] * (p["kv_len"] or p["seq_len"]))


def _numbered(result: CaseResult, case: Case) -> CaseResult:
    """``result`` as the result of ``case``: the same where it is its own, else a copy with its number."""
    if result.case is case:
        return result
    record = copy.deepcopy(result.record)
    record["case"] = case.index
    return CaseResult(case, record, copy.deepcopy(result.result))
