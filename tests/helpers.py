"""What several test files share: drawn problems, random inputs, comparisons of counts, benchmark scripts."""

from __future__ import annotations

import csv
import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from iosim import AttentionProblem
from iosim.cli import main
from iosim.schedules import Tiles


@st.composite
def problems_and_tiles(draw, tiled=True, max_len=300, head_dims=(8, 16, 32, 64, 128), max_tile=96):
    """A problem (grouped-query, ragged, causal or not, seq_len != kv_len) and tiles (1..max_tile each)."""
    kv_heads = draw(st.integers(1, 3))
    p = AttentionProblem(
        batch=draw(st.integers(1, 3)),
        heads=kv_heads * draw(st.integers(1, 3)),
        kv_heads=kv_heads,
        seq_len=draw(st.integers(1, max_len)),
        kv_len=draw(st.integers(1, max_len)),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(["fp16", "bf16", "fp32"])),
        causal=draw(st.booleans()),
    )
    t = Tiles(draw(st.integers(1, max_tile)), draw(st.integers(1, max_tile))) if tiled else Tiles(None, None)
    return p, t


def without_peak(counts):
    """Counts with zero entries and the on-chip peaks dropped: what a walk and a closed form must share
    (the walk's peak is what the buffers really held, the closed form's the allocation, an upper bound)."""
    c = counts.normalized()
    for k in c.kernels:
        k.sram_peak = None
    return c


def random_inputs(p: AttentionProblem, seed: int, scale: float = 1.0, grad: bool = False):
    """Fresh standard-normal q, k, v laid out (batch, seq, heads, head_dim); q scaled by ``scale``.
    With ``grad``, also dO (shaped like q) for the backward pass: (q, k, v, do)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((p.batch, p.seq_len, p.heads, p.head_dim)) * scale
    k = rng.standard_normal((p.batch, p.kv_len, p.kv_heads, p.head_dim))
    v = rng.standard_normal((p.batch, p.kv_len, p.kv_heads, p.head_dim))
    return (q, k, v, rng.standard_normal(q.shape)) if grad else (q, k, v)


def rel_err(x, ref) -> float:
    """Relative Frobenius error."""
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def load_benchmark(name: str):
    """The module of benchmarks/<name>.py (the benchmark scripts are not a package; they import the scripts beside
    them, as when run from their folder, so that folder goes on sys.path)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # a dataclass with postponed annotations looks its module up there
    spec.loader.exec_module(mod)
    return mod


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``iosim ARGS`` in this process: (exit code, stdout, stderr)."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


class FakeNcuCsv:
    """ncu's ``--csv`` page written by hand for the measure tests: ``launch`` adds one kernel's metrics (one row each,
    launches numbered in order), ``text`` is the page as ncu prints it after connecting."""

    def __init__(self):
        self._buf = io.StringIO()
        self._w = csv.writer(self._buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        self._w.writerow(["ID", "Kernel Name", "Grid Size", "Block Size", "Metric Name", "Metric Unit", "Metric Value"])
        self._id = 0

    def launch(self, name: str, grid: str, metrics: dict) -> None:
        for m, v in metrics.items():
            self._w.writerow([self._id, name, grid, "(256, 1, 1)", m, "", v])
        self._id += 1

    def text(self) -> str:
        return "==PROF== Connected\n" + self._buf.getvalue()


def composed_flash2_profile(name: str = "h100-sxm5-80gb"):
    """Built-in profile ``name`` without iosim-flash2's measured steps (calibration.forward.resident_step): the fa2
    model then composes every step, the dense instantiation's as the window and varlen ones'."""
    import yaml

    from iosim.hardware.gpu import PROFILES_DIR, profile_from_dict

    data = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
    data["calibration"]["forward"].pop("resident_step")
    return profile_from_dict(data, f"{name}, composed flash2 steps")
