"""Input at every edge: sizes past 64 bits refused with the field and the fix, questionable input warned once,
NaN propagated, profile numbers exact, aligned tables, and a first numba compile that says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from iosim import AttentionProblem, ProblemError, simulate
from iosim.cli.simulate import compile_notice
from iosim.gpu._cupy import GPUUnavailableError, require_cupy
from iosim.numeric import execute, reference
from iosim.problem import MAX_LEN, InputWarning
from iosim.schedules import ScheduleError

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}  # help text unwrapped up to click's 110 columns
    return subprocess.run([sys.executable, "-m", "iosim", *args], capture_output=True, text=True, timeout=300,
                          env=env)


# -- sizes too large to count: refused at the flag and at the API, naming the field, the value and the fix ----

@pytest.mark.parametrize("flag,value,names", [
    ("--seq-len", "9223372036854775808", ["seq_len=9223372036854775808", "at most 2,147,483,648"]),
    ("--heads", "1000000000000", ["heads=1000000000000", "use fewer heads"]),
    ("--batch", "1e20", ["batch=100000000000000000000", "a smaller batch"]),
    ("--batch", "1.5", ["--batch", "'1.5' is not a whole number"]),
    ("--head-dim", "1e99999999", ["--head-dim", "far larger than any size"]),
])
def test_huge_sizes_are_refused_in_one_line_with_exit_2(flag, value, names):
    args = ["simulate", "flash2", "--seq-len", "1024", flag, value] if flag != "--seq-len" else \
        ["simulate", "flash2", flag, value]
    out = run(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    for fragment in names:
        assert fragment in lines[0]


def test_the_api_refuses_what_cannot_be_counted_and_accepts_the_largest_length():
    with pytest.raises(ProblemError, match=r"kv_len=2147483649: at most"):
        AttentionProblem.make(seq_len=1, kv_len=MAX_LEN + 1)
    with pytest.raises(ProblemError, match=r"heads=536870912.*more than the 1,125,899,906,842,624 B"):
        AttentionProblem.make(seq_len=4096, heads=2**29)  # 2^51 B of Q, K, V, O
    assert AttentionProblem.make(seq_len=4096, heads=2**28).tensor_bytes == 2**50  # the largest taken
    assert AttentionProblem.make(seq_len=MAX_LEN, head_dim=1, dtype="fp8").tensor_bytes == 4 * MAX_LEN



@pytest.mark.parametrize("kw,message", [
    (dict(seq_len=0), r"^seq_len=0: Input should be greater than or equal to 1$"),
    (dict(seq_len=64, dtype="fp64"), r"^dtype='fp64': Input should be 'fp32', 'fp16', 'bf16' or 'fp8'$"),
    (dict(seq_len=64, heads=6, kv_heads=4), r"^heads=6 is not divisible by kv_heads=4"),
    (dict(seq_len=64, colour="red"), r"^colour: unknown field$"),
])
def test_constructing_a_bad_problem_raises_problem_error_naming_the_field(kw, message):
    """AttentionProblem(...) words its errors as AttentionProblem.make does: the exported ProblemError, a
    ValueError, not pydantic's ValidationError."""
    with pytest.raises(ProblemError, match=message) as info:
        AttentionProblem(**kw)
    assert type(info.value) is ProblemError and isinstance(info.value, ValueError)


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_scale_is_refused(scale):
    with pytest.raises(ProblemError, match=r"^scale=(-?inf|nan): .*finite"):
        AttentionProblem(seq_len=64, scale=scale)


def test_the_cli_refuses_scale_inf_instead_of_printing_invalid_json():
    out = run("simulate", "flash2", "--seq-len", "128", "--scale", "inf", "--no-l2", "--json")
    assert out.returncode == 2 and "Infinity" not in out.stdout
    assert "scale=inf" in out.stderr and "finite" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("field", ["batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim"])
@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_a_bool_is_not_a_size(field, value):
    kw = {"seq_len": 64, field: value}
    with pytest.raises(ProblemError, match=rf"^{field}={value!r}: expected a whole number, not a bool"):
        AttentionProblem(**kw)


def test_sizes_still_take_numpy_integers():
    assert AttentionProblem(seq_len=np.int64(64), heads=np.int32(2)).seq_len == 64

def test_the_l2_switch_takes_a_bool_only():
    p = AttentionProblem(seq_len=64)
    with pytest.raises(ScheduleError, match=r"l2='no': expected True or False"):
        simulate("flash2", p, l2="no")



@pytest.mark.parametrize("problem,got", [("seq_len=64", r"str 'seq_len=64'"), (None, "NoneType None"),
                                         (64, "int 64")])
def test_simulate_names_the_problem_it_expects(problem, got):
    with pytest.raises(TypeError, match=rf"^problem: expected an AttentionProblem \(or a dict of its fields\), "
                                        rf"got {got}"):
        simulate("flash2", problem)


def test_simulate_takes_a_dict_of_problem_fields_and_validates_it():
    r = simulate("flash2", {"seq_len": 256, "heads": 2})
    assert r.problem == AttentionProblem(seq_len=256, heads=2)
    with pytest.raises(ProblemError, match=r"^seq_len=0: "):
        simulate("flash2", {"seq_len": 0})


@pytest.mark.parametrize("call,error,message", [
    (dict(schedule="flash2", splits=4), ScheduleError,
     r"^flash2 takes no splits \(given splits=4\): only flash-decoding takes splits \(and, with "
     r"kernel='iosim-decode', kv_lens, page_size and kv_dtype\); only block-sparse density, mask and seed"),
    (dict(schedule="naive", block_q=16), ScheduleError, r"^naive: give both block_q and block_kv"),
    (dict(schedule="block-sparse", mask=np.ones((1, 1)), density=0.5), ScheduleError,
     r"^block-sparse: give mask, or density \(with seed\), not both"),
    (dict(schedule="flash2", tiles=(64, 64)), TypeError,
     r"^simulate\(\) got an unexpected keyword argument 'tiles'$"),
    (dict(schedule="flash2", foo=1), TypeError, r"^simulate\(\) got an unexpected keyword argument 'foo'"),
])
def test_python_callers_read_python_parameter_names(call, error, message):
    """Issue 30 item 12: "takes no --tiles" spoke the command line's flags to a Python caller."""
    with pytest.raises(error, match=message) as info:
        simulate(problem=AttentionProblem(seq_len=64), **call)
    assert " --" not in str(info.value).split("(on the command line")[0]

# -- questionable input: a warning with its reason and fix, printed once by the CLI ----------------------------

QUESTIONABLE = [
    (("flash3", dict(seq_len=4096), "a100-sxm4-80gb", {}), r"not a Hopper GPU"),
    (("flash2", dict(seq_len=1024, dtype="fp8"), None, {"pass_": "both"}), r"dtype=fp8 with the backward pass"),
    (("flash-decoding", dict(seq_len=1, kv_len=4096), None, {"splits": 100000}),
     r"splits=100000: .* 32 splits .* give at most 32"),
    (("naive", dict(seq_len=64, head_dim=3), None, {}), r"head_dim=3: .*multiple of 8 up to 256"),
    (("flash2", dict(seq_len=64, head_dim=1024), "h100-sxm5-80gb", {"block_q": 16, "block_kv": 16}),
     r"head_dim=1024"),
    (("flash2", dict(seq_len=65536, heads=1024), "a100-sxm4-40gb", {"l2": True}),
     r"68.72 GB, more than the 40 GB of GPU memory"),
]


@pytest.mark.parametrize("case,pattern", QUESTIONABLE)
def test_questionable_input_warns_with_the_reason(case, pattern):
    schedule, problem, profile, kw = case
    with pytest.warns(InputWarning, match=pattern):
        r = simulate(schedule, AttentionProblem(**problem), profile, **kw)
    if kw.get("l2"):  # too large for the GPU: no L2 model (a launch that cannot be resident), said in hbm_model
        assert r.hbm_model.startswith("none: the problem's Q, K, V and O take")
        assert r.traffic["hbm"] == r.traffic["global"]


def test_ordinary_input_raises_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate("flash3", AttentionProblem(seq_len=4096, heads=8, causal=True), "h100-sxm5-80gb")
        simulate("flash-decoding", AttentionProblem(seq_len=1, kv_len=8192, heads=8), splits=16)
        simulate("flash2", AttentionProblem(seq_len=4096, dtype="bf16"), pass_="both")


def test_the_cli_prints_each_warning_once_on_one_line():
    out = run("simulate", "flash3", "--seq-len", "1024", "--profile", "a100-sxm4-80gb", "--no-l2")
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if line.startswith("iosim: warning: ")]
    assert len(warned) == 1 and "not a Hopper GPU" in warned[0]
    assert "Traceback" not in out.stderr and "InputWarning" not in out.stderr


# -- NaN in, NaN out -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["naive", "flash1", "flash2", "flash3", "flash-decoding"])
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
def test_nan_in_the_inputs_reaches_every_row_that_attends_to_it(schedule, tensor):
    p = AttentionProblem(seq_len=48, kv_len=48, head_dim=16, causal=True, dtype="fp32")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 48, 1, 16)).astype(np.float32) for _ in range(3))
    row = 30  # a query row (q) or a key (k, v)
    {"q": q, "k": k, "v": v}[tensor][0, row, 0, 5] = np.nan
    seeing = [row] if tensor == "q" else list(range(row, 48))  # causal: rows >= 30 attend to key 30
    O, stats = execute(schedule, p, q, k, v)
    ref = reference(p, q, k, v)
    # a NaN in V[key, 5] reaches column 5 of those rows; a NaN in Q or K every column
    assert np.isnan(O[0, seeing, 0]).any(axis=1).all() and np.isnan(ref[0, seeing, 0]).any(axis=1).all()
    if tensor == "k":  # a NaN key hides nothing from rows that cannot see it
        assert np.isfinite(O[0, :row, 0]).all() and np.isfinite(ref[0, :row, 0]).all()
    for name, s in stats.items():
        if tensor != "v":  # V does not enter the statistics
            assert np.isnan(s[0, 0, seeing]).all(), name


# -- human output ----------------------------------------------------------------------------------------------

def test_the_kernel_table_stays_aligned_with_long_kernel_names():
    out = run("simulate", "flash-decoding", "--seq-len", "1", "--kv-len", "65536", "--heads", "32", "--no-l2")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if " grid " in line and "utilization" in line]
    assert len(rows) == 2 and len({len(r.split(" grid ")[0]) for r in rows}) == 1
    assert len({r.index("utilization") for r in rows}) == 1


def test_help_and_package_description_name_every_schedule_family():
    help_text = " ".join(run("--help").stdout.split())
    description = re.search(r'^description = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    for text in (help_text, description):
        assert "FlashAttention-1/2/3" in text and "Flash-Decoding" in text and "block-sparse" in text
        assert "(naive, FlashAttention-1/2)" not in text


def test_the_gpu_hint_names_an_install_that_works_from_a_clone(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    with pytest.raises(GPUUnavailableError) as err:
        require_cupy()
    assert "pip install '.[gpu]'" in str(err.value) and "iosim[gpu]" not in str(err.value)


# -- numba's first compile is announced, once ------------------------------------------------------------------

def test_a_numba_compile_is_announced_in_one_line(capsys):
    numba = pytest.importorskip("numba")

    @numba.njit(cache=False)
    def twice(x):
        return 2 * x

    with compile_notice():
        assert twice(21) == 42  # compiles now
        assert twice(1.5) == 3.0  # another signature: compiles again, said once only
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iosim: compiling") and "once per install" in lines[0]
    with compile_notice():
        twice(4)  # already compiled: nothing said
    assert capsys.readouterr().err == ""
