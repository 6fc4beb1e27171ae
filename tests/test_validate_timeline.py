"""benchmarks/validate_timeline.py's problem specs (the device script; its GPU side runs on the GPU machine)."""

from __future__ import annotations

import sys
import types

import pytest
from helpers import load_benchmark


@pytest.fixture
def vt(monkeypatch):
    # the script imports CuPy at the top; the spec parsing needs none of it
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    return load_benchmark("validate_timeline")


@pytest.mark.parametrize(
    "spec, fields, name",
    [
        ("131072:32", (131072, 32, 32, 128, False, "fp16"), "N131072_H32_d128"),  # the older timelines' names
        ("4096:32/8", (4096, 32, 8, 128, False, "fp16"), "N4096_H32-8_d128"),
        ("4096:32:d64:causal", (4096, 32, 32, 64, True, "fp16"), "N4096_H32_d64_causal"),
        ("16384:32:bf16", (16384, 32, 32, 128, False, "bf16"), "N16384_H32_d128_bf16"),
    ],
)
def test_specs_name_their_problems(vt, spec, fields, name):
    c = vt.parse_spec(spec)
    keys = ("seq_len", "heads", "kv_heads", "head_dim", "causal", "dtype")
    assert tuple(c[k] for k in keys) == fields
    assert vt.spec_name(c) == name


@pytest.mark.parametrize("spec", ["4096", "4096:x", "4096:32:fp8", "4096:32:dx", "4096:32/5"])
def test_a_bad_spec_says_what_is_expected(vt, spec):
    with pytest.raises(SystemExit, match=r"expected N:H|multiple of kv heads"):
        vt.parse_spec(spec)
