"""Tiled against naive on this CPU, measured, beside the CPU model's prediction and the seeds' claim.

One function measures (:func:`measure_pair`: same inputs, one process, naive and tiled calls alternated; warm
calls, as on the GPU: each timed naive call right after an untimed one; the fastest call of each, since other
processes on a shared machine only ever add time, and the median of the per-pair ratios beside it; naive's first
call, on cold memory, apart on request); :func:`ratio_rows` adds the model's predicted times from a CPU
profile (``iosim profiles detect``'s, so rates measured on this machine apart from attention). The benchmark
(``benchmarks/bench_cpu.py``) and the report scenario "Attention on a CPU" both call :func:`ratio_rows`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from iosim.cpu import _blas
from iosim.cpu.attention import attention, available_memory, naive_bytes
from iosim.cpu.detect import detect_profile
from iosim.cpu.host import model_name, usable_cpus, wait_for_idle
from iosim.hardware.cpu import CpuProfile
from iosim.problem import AttentionProblem
from iosim.simulate_cpu import simulate_cpu

SEEDS_CLAIM = 2.0  # the seeds: tiling gives about 2x on CPUs (blocks kept in L2/L3; llama.cpp's path)


@dataclass(frozen=True)
class RatioRow:
    seq_len: int
    head_dim: int
    causal: bool
    naive_ms: float | None  # fastest warm call; None: naive's N x N matrix does not fit in memory (refused)
    tiled_ms: float  # fastest call
    ratio: float | None  # naive_ms / tiled_ms
    ratio_median: float | None  # median of the per-pair naive / tiled ratios
    naive_pred_ms: float | None
    tiled_pred_ms: float | None
    naive_gb: float  # one head's S, GB (10^9 B)
    naive_fits: bool
    naive_first_ms: float | None = None  # naive's first call at this N, on cold memory (measured with a pause)
    naive_first_pred_ms: float | None = None  # the model's first_call_s
    seeds_claim: float = SEEDS_CLAIM


@dataclass(frozen=True)
class PairTimes:
    """Seconds: naive's fastest warm call (None: not run), tiled's fastest call, the median per-pair ratio,
    and naive's first call at this N (None unless asked for with ``first_call_pause_s``)."""

    naive_s: float | None
    tiled_s: float
    ratio_median: float | None
    naive_first_s: float | None = None


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def reps_for(seq_len: int) -> int:
    """More repetitions where a call is short: 7 up to N = 8192, 3 up to 32768, else 2 (one 10 s call on a shared
    machine is too easily slowed by another job)."""
    return 7 if seq_len <= 8192 else 3 if seq_len <= 32768 else 2


def measure_pair(seq_len: int, head_dim: int, *, causal: bool = False, reps: int | None = None,
                 run_naive: bool = True, seed: int = 0, idle: bool = True,
                 first_call_pause_s: float | None = None) -> PairTimes:
    """Naive and tiled times for one fp32 head, warm calls, the fastest of ``reps`` pairs.

    Each pair: (wait for other processes to go quiet, when ``idle``) the tiled call, then an untimed naive
    call and the timed one right after it, so that the timed call's S lands on the memory the untimed one just
    freed (the steady state of repeated calls; memory idle for seconds can be far slower to touch first: on a
    VM that backs guest memory lazily, the hypervisor maps it again). ``first_call_pause_s``: sleep that long
    before the first pair's untimed naive call and report its time as the first call (on cold memory)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, seq_len, 1, head_dim), dtype=np.float32) for _ in range(3))
    reps = reps or reps_for(seq_len)
    fits = run_naive and naive_bytes(seq_len, seq_len) <= available_memory()
    attention(q[:, :64], k[:, :64], v[:, :64], causal=causal)  # compile or load the kernel before timing
    naive_t, tiled_t, ratios, first = [], [], [], None
    for rep in range(reps):
        if idle:
            wait_for_idle(timeout_s=30.0)
        tt = _timed(lambda: attention(q, k, v, causal=causal))
        tiled_t.append(tt)
        if fits:
            if rep == 0 and first_call_pause_s is not None:
                time.sleep(first_call_pause_s)
            t_warmup = _timed(lambda: attention(q, k, v, causal=causal, schedule="naive"))
            if rep == 0 and first_call_pause_s is not None:
                first = t_warmup
            tn = _timed(lambda: attention(q, k, v, causal=causal, schedule="naive"))
            naive_t.append(tn)
            ratios.append(tn / tt)
    return PairTimes(min(naive_t) if fits else None, min(tiled_t), statistics.median(ratios) if fits else None,
                     first)


def ratio_rows(seq_lens, head_dim: int, profile: CpuProfile | None = None, *, causal: bool = False,
               naive_max: int | None = None, first_call_pause_s: float | None = None) -> list[RatioRow]:
    """Measured naive and tiled times per N, with the model's predictions on ``profile`` (None: no prediction).

    ``naive_max``: skip naive above this N (it still reports whether naive would fit). ``first_call_pause_s``:
    also measure naive's first call at each N after that pause (:func:`measure_pair`)."""
    rows = []
    for n in seq_lens:
        gb = naive_bytes(n, n) / 1e9
        fits = naive_bytes(n, n) <= available_memory()
        run_naive = fits and (naive_max is None or n <= naive_max)
        m = measure_pair(n, head_dim, causal=causal, run_naive=run_naive, first_call_pause_s=first_call_pause_s)
        pred: dict[str, float | None] = {}
        if profile is not None:
            p = AttentionProblem(seq_len=n, head_dim=head_dim, dtype="fp32", causal=causal)
            for s in ("naive", "flash2"):
                t = simulate_cpu(s, p, profile).time
                pred[s] = _ms(t.predicted_s)
                if s == "naive":
                    pred["first"] = _ms(t.first_call_s)
        rows.append(RatioRow(
            seq_len=n, head_dim=head_dim, causal=causal, naive_ms=_ms(m.naive_s), tiled_ms=1e3 * m.tiled_s,
            ratio=None if m.naive_s is None else m.naive_s / m.tiled_s, ratio_median=m.ratio_median,
            naive_pred_ms=pred.get("naive"), tiled_pred_ms=pred.get("flash2"), naive_gb=gb, naive_fits=fits,
            naive_first_ms=_ms(m.naive_first_s), naive_first_pred_ms=pred.get("first")))
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def rows_as_dicts(rows: list[RatioRow]) -> list[dict]:
    return [asdict(r) for r in rows]


SCENARIO_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)


def scenario_data(seq_lens=SCENARIO_SEQ_LENS, head_dims=(64,), profile: CpuProfile | None = None) -> dict:
    """The report scenario "Attention on a CPU": measured naive/tiled ratio vs N on this machine, the model's
    predicted ratio on ``profile`` (default: this machine, detected now), and the seeds' ~2x claim."""
    profile = profile if profile is not None else detect_profile()
    rows = [r for d in head_dims for r in ratio_rows(seq_lens, d, profile)]
    return {"machine": model_name(), "logical_cpus": usable_cpus(), "gemm": _blas.describe(),
            "profile": profile.name, "seeds_claim": SEEDS_CLAIM, "rows": rows_as_dicts(rows)}
