"""The fp8 part of the time record without a GPU (benchmarks/time_record_fp8.py, time_judge.py): its shapes, each row
predicted as the judge will predict it, the measuring loop on stand-ins (checked before timed; a cuDNN that cannot
run leaves its row untimed with the reason), the judge keeping a kernel's fp8 rows a group of their own, and the
uncertainty bands keeping fp8 and bf16 residuals apart. Measured times here are made-up numbers: these tests check
the plumbing, not the model's accuracy (that is what the GPU record is for)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import load_benchmark

from iosim import AttentionProblem
from iosim.launch import FLASH3_FP8_TILES
from iosim.schedules.flash3_fp8 import Fp8LayoutTiles
from iosim.timing import uncertainty

H100 = "h100-sxm5-80gb"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tf8():
    return load_benchmark("time_record_fp8")


@pytest.fixture(scope="module")
def judge(tf8):
    return load_benchmark("time_judge")


def test_the_sweep_covers_the_briefs_classes_in_16_to_24_shapes(tf8):
    shapes = tf8.sweep()
    tf8.check_shapes(shapes)
    assert 16 <= len(shapes) <= 24
    assert {s.head_dim for s in shapes} == {64, 128, 256} and {s.causal for s in shapes} == {False, True}
    assert min(s.seq_len for s in shapes) <= 1024 and max(s.seq_len for s in shapes) >= 16384
    assert any(s.heads != s.kv_heads for s in shapes)  # grouped-query
    assert any(s.seq_len % 128 for s in shapes)  # a ragged length: partial Q and K/V tiles


@pytest.mark.parametrize("bad", [dict(kv_len=2048), dict(dtype="bf16"), dict(head_dim=96), dict(kv_heads=3)])
def test_a_shape_the_measurement_cannot_take_fails_with_its_name(tf8, bad):
    s = tf8.Shape(**{**dict(batch=1, heads=4, kv_heads=4, seq_len=1024, kv_len=1024, head_dim=128, dtype="fp8"),
                     **bad})
    with pytest.raises(ValueError, match=s.key):
        tf8.check_shapes([s])


def test_every_row_predicts_with_the_kernels_fp8_tiles_and_output_dtype(tf8, judge):
    """Ours at d = 128 takes its fp8 tiles (128 x 192, the layout with bf16 O); cuDNN its fp8 kernels' tiles (128 x
    256 at d = 128: iosim/timing/kernels/cudnn.yaml) and O counted in fp8, what cuDNN's FP8 forward writes on Hopper
    (the rows' o_dtype)."""
    for s in tf8.sweep():
        for kernel in tf8.KERNELS:
            pred, bq, bkv, _ = judge.predict_row(tf8.judge_row(s, kernel), H100)
            assert pred > 0 and (kernel == "cudnn" or (bq, bkv) == FLASH3_FP8_TILES[s.head_dim])
    s = next(s for s in tf8.sweep() if s.head_dim == 128 and not s.causal and s.heads == s.kv_heads)
    ours, peer = (judge.simulate_row(tf8.judge_row(s, k), H100) for k in tf8.KERNELS)
    assert ours.tiles == Fp8LayoutTiles(128, 192) and (peer.tiles.block_q, peer.tiles.block_kv) == (128, 256)
    o_elements = s.batch * s.heads * s.seq_len * s.head_dim
    assert ours.counts.global_write["O"] == 2 * o_elements and tf8.O_DTYPE["iosim-flash3"] == "bf16"
    assert peer.counts.global_write["O"] == 1 * o_elements and tf8.O_DTYPE["cudnn"] == "fp8"


class _T:
    """A stand-in tensor: its shape, and repeat_interleave along the heads."""

    def __init__(self, shape):
        self.shape = shape

    def repeat_interleave(self, n, dim):
        return _T(tuple(x * n if i == dim else x for i, x in enumerate(self.shape)))


def _stand_ins(err: float):
    gen = SimpleNamespace(manual_seed=lambda s: gen)
    torch = SimpleNamespace(bfloat16="bf16", Generator=lambda device: gen, randn=lambda *shape, **kw: _T(shape),
                            cuda=SimpleNamespace(synchronize=lambda: None))
    calls = []
    gpu = SimpleNamespace(fp8_blocks=lambda d: (128, 192), quantize_fp8=lambda x, **kw: calls.append(kw) or x,
                          attention=lambda *a, **kw: calls.append(kw))
    bench = SimpleNamespace(FP8_TOL=0.10, sample_rows=lambda n: [0, n - 1],
                            reference_rows=lambda torch, qkv, rows, causal: ("ref", [x.shape for x in qkv]),
                            fp8_poisoned=lambda torch, fp8, causal, attend: ("o", ""),
                            errors=lambda torch, o, ref, rows: (err, err))
    return torch, gpu, bench, calls


def test_the_loop_checks_then_times_ours_and_keeps_cudnns_reason(tf8, monkeypatch):
    monkeypatch.setattr(tf8, "time_call", lambda fn, reps, launches: (1.25, [{"name": "k"}], 0.5))
    torch, gpu, bench, calls = _stand_ins(0.05)
    s = tf8.Shape(2, 32, 8, 1024, 1024, 128, "fp8", True)
    peer = (None, None, "cudnn-fp8: not supported here: no cudnn-frontend")
    ours, cudnn = tf8.measure_shape(torch, gpu, bench, peer, s, 20, None)
    assert calls == [{"block": 128}, {"block": 192}, {"block": 192, "transpose": True}]  # quantized before timing
    assert (ours["kernel"], ours["dtype"], ours["check"], ours["measured_ms"]) == ("iosim-flash3", "fp8", "ok", 1.25)
    assert ours["o_dtype"] == "bf16" and "quantized beforehand" in ours["timed"]
    assert (cudnn["kernel"], cudnn["measured_ms"], cudnn["why"]) == ("cudnn", None, peer[2])
    assert "check" not in cudnn


def test_a_failed_check_is_recorded_and_not_timed(tf8, monkeypatch):
    monkeypatch.setattr(tf8, "time_call", lambda *a, **k: pytest.fail("a failed check must not be timed"))
    torch, gpu, bench, _ = _stand_ins(0.5)
    s = tf8.Shape(1, 4, 4, 1024, 1024, 64, "fp8")
    (ours,) = tf8.measure_shape(torch, gpu, bench, (None, None, ""), s, 20, ["iosim-flash3"])
    assert (ours["check"], ours["measured_ms"]) == ("FAIL", None)


def test_the_reference_repeats_grouped_kv_heads(tf8):
    torch, _, bench, _ = _stand_ins(0.0)
    s = tf8.Shape(2, 32, 8, 1024, 1024, 128, "fp8")
    rows, (_, shapes) = tf8._reference(torch, bench, s, tf8._inputs(torch, s))
    assert rows == [0, 1023] and shapes == [(2, 1024, 32, 128)] * 3


@pytest.mark.parametrize("argv", [["--device", "h100"], ["--device", "h100", "--measure", "--dry-run"],
                                  ["--device", "h100", "--dry-run", "--reps", "0"], ["--device", "a100", "--dry-run"]])
def test_arguments_are_checked(tf8, argv):
    with pytest.raises(SystemExit) as e:
        tf8.main(argv)
    assert e.value.code == 2


# ------------------------------------------------------------------------------------------------------------------
# the judge: fp8 rows as their own groups


def _write_record(folder, with_fp8: bool):
    real = json.loads((ROOT / "data/validation/h100-time.json").read_text())
    head = {k: v for k, v in real.items() if k != "rows"}
    bf16 = [r for r in real["rows"] if r["kernel"] == "cudnn"][:6]
    (folder / "h100-time.json").write_text(json.dumps({**head, "rows": bf16}))
    if with_fp8:
        fp8 = [{"batch": 4, "heads": 16, "kv_heads": 16, "seq_len": n, "kv_len": n, "head_dim": 128, "dtype": "fp8",
                "causal": False, "kernel": k, "measured_ms": ms} for n in (2048, 4096) for k, ms in
               (("iosim-flash3", 9.0), ("cudnn", 9.0))]  # made-up times, far off: the fp8 groups are OUTSIDE
        fp8.append({**fp8[0], "kernel": "cudnn", "measured_ms": None, "why": "not supported here"})
        (folder / "h100-time-fp8.json").write_text(json.dumps({**head, "rows": fp8}))
    return folder / "h100-time.json"


def _verdicts(text: str) -> dict[str, str]:
    lines = text.split("rows outside")[0].splitlines()
    return {ln.rsplit(" ", 1)[0].split("  ")[0].strip(): ln for ln in lines if ln.endswith(("within", "OUTSIDE"))}


def test_fp8_rows_are_their_own_groups_and_leave_the_bf16_verdict_as_it_was(judge, tmp_path, capsys):
    (tmp_path / "docs/validation").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    judge.judge_record("h100", _write_record(data, False), H100, tmp_path)
    alone = _verdicts(capsys.readouterr().out)
    code = judge.judge_record("h100", _write_record(data, True), H100, tmp_path)
    both = _verdicts(capsys.readouterr().out)
    assert set(alone) == {"cudnn"} and set(both) == {"cudnn", "iosim-flash3 fp8", "cudnn fp8"}
    assert both["cudnn"] == alone["cudnn"]  # the bf16 rows' line, unchanged
    assert both["cudnn fp8"].split()[2] == "2" and "(5%, 15%)" in both["cudnn fp8"] and code == 1
    with (tmp_path / "docs/validation/h100-time.csv").open() as f:
        rows = list(csv.DictReader(f))
    fp8 = [r for r in rows if r["dtype"] == "fp8"]
    assert sorted(r["kernel"] for r in fp8) == ["cudnn", "cudnn", "iosim-flash3", "iosim-flash3"]  # untimed: no row
    assert {(r["block_q"], r["block_kv"]) for r in fp8 if r["kernel"] == "iosim-flash3"} == {("128", "192")}


def test_the_uncertainty_band_keeps_fp8_and_bf16_residuals_apart(tmp_path):
    cols = ["kernel", "profile", "seq_len", "kv_len", "causal", "dtype", "predicted_s", "measured_s"]
    rows = [["cudnn", H100, 4096, 4096, "false", "bf16", 1.0, 1.0 + i / 100] for i in range(6)]
    rows += [["cudnn", H100, 4096, 4096, "false", "fp8", 1.0, 1.5 + i / 100] for i in range(5)]
    with (tmp_path / "h100-time.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
    folder = str(tmp_path)
    bf16 = uncertainty.band("cudnn", H100, AttentionProblem(seq_len=4096, dtype="bf16"), 1.0, folder)
    fp8 = uncertainty.band("cudnn", H100, AttentionProblem(seq_len=4096, dtype="fp8"), 1.0, folder)
    assert (bf16.rows, bf16.group) == (6, "cudnn, non-causal") and bf16.high_s < 1.1
    assert (fp8.rows, fp8.group) == (5, "cudnn fp8, non-causal") and fp8.low_s > 1.5
    no_dtype = SimpleNamespace(seq_len=4096, kv_len=4096, causal=False)  # a caller that gives no dtype: the kernel's
    assert uncertainty.band("cudnn", H100, no_dtype, 1.0, folder).rows == 6
