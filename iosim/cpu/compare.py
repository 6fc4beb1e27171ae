"""Tiled against naive on this CPU, measured, beside the CPU model's prediction and the seeds' claim.

One function measures (:func:`measure_pair`: same inputs, one process, naive and tiled calls alternated; the
fastest call of each, since other processes on a shared machine only ever add time, and the median of the
per-pair ratios beside it); :func:`ratio_rows` adds the model's predicted times from a CPU
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
from iosim.cpu_model import simulate_cpu
from iosim.cpu_profile import CpuProfile
from iosim.problem import AttentionProblem

SEEDS_CLAIM = 2.0  # the seeds: tiling gives about 2x on CPUs (blocks kept in L2/L3; llama.cpp's path)


@dataclass(frozen=True)
class RatioRow:
    seq_len: int
    head_dim: int
    causal: bool
    naive_ms: float | None  # fastest call; None: naive's N x N matrix does not fit in memory (refused)
    tiled_ms: float  # fastest call
    ratio: float | None  # naive_ms / tiled_ms
    ratio_median: float | None  # median of the per-pair naive / tiled ratios
    naive_pred_ms: float | None
    tiled_pred_ms: float | None
    naive_gb: float  # one head's S, GB (10^9 B)
    naive_fits: bool
    seeds_claim: float = SEEDS_CLAIM


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def reps_for(seq_len: int) -> int:
    """More repetitions where a call is short: 7 up to N = 8192, 3 up to 32768, else 1."""
    return 7 if seq_len <= 8192 else 3 if seq_len <= 32768 else 1


def measure_pair(seq_len: int, head_dim: int, *, causal: bool = False, reps: int | None = None,
                 run_naive: bool = True, seed: int = 0, idle: bool = True) -> tuple[float | None, float, float | None]:
    """(naive s, tiled s, median per-pair ratio) for one fp32 head, times the fastest of ``reps`` calls; naive
    None where it does not fit or is skipped. ``idle``: wait for other processes to go quiet before each pair."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, seq_len, 1, head_dim), dtype=np.float32) for _ in range(3))
    reps = reps or reps_for(seq_len)
    fits = run_naive and naive_bytes(seq_len, seq_len) <= available_memory()
    attention(q[:, :64], k[:, :64], v[:, :64], causal=causal)  # compile or load the kernel before timing
    naive_t, tiled_t, ratios = [], [], []
    for _ in range(reps):
        if idle:
            wait_for_idle(timeout_s=30.0)
        tt = _timed(lambda: attention(q, k, v, causal=causal))
        tiled_t.append(tt)
        if fits:
            tn = _timed(lambda: attention(q, k, v, causal=causal, schedule="naive"))
            naive_t.append(tn)
            ratios.append(tn / tt)
    return (min(naive_t) if fits else None), min(tiled_t), (statistics.median(ratios) if fits else None)


def ratio_rows(seq_lens, head_dim: int, profile: CpuProfile | None = None, *, causal: bool = False,
               naive_max: int | None = None) -> list[RatioRow]:
    """Measured naive and tiled times per N, with the model's predictions on ``profile`` (None: no prediction).

    ``naive_max``: skip naive above this N (it still reports whether naive would fit)."""
    rows = []
    for n in seq_lens:
        gb = naive_bytes(n, n) / 1e9
        fits = naive_bytes(n, n) <= available_memory()
        run_naive = fits and (naive_max is None or n <= naive_max)
        tn, tt, ratio_median = measure_pair(n, head_dim, causal=causal, run_naive=run_naive)
        pred = {}
        if profile is not None:
            p = AttentionProblem(seq_len=n, head_dim=head_dim, dtype="fp32", causal=causal)
            for s in ("naive", "flash2"):
                t = simulate_cpu(s, p, profile).time.predicted_s
                pred[s] = None if t is None else 1e3 * t
        rows.append(RatioRow(n, head_dim, causal, None if tn is None else 1e3 * tn, 1e3 * tt,
                             None if tn is None else tn / tt, ratio_median, pred.get("naive"), pred.get("flash2"),
                             gb, fits))
    return rows


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
