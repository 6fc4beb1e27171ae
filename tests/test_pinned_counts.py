"""Nothing moves: every schedule's counts equal a table written before the library was re-layered.

``tests/data/pinned_counts.json`` was generated at commit f67c44e (before the house issue's change) by running
this file as a script: ``python tests/test_pinned_counts.py --write``. For every schedule and pass, on ragged,
causal, grouped-query, fp32 and bf16 problems, it holds what ``simulate(...).to_json()`` says of traffic (with and
without the L2 model), per-tensor bytes, FLOPs, SRAM peak, on-chip bytes, tiles and per-kernel bytes. A change that
moves any of them fails here; a deliberate change of a count rewrites the table in its own commit and says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from iosim import AttentionProblem, simulate

TABLE = Path(__file__).parent / "data" / "pinned_counts.json"

PROBLEMS = {
    "square": dict(batch=2, heads=4, seq_len=512, head_dim=64),
    "ragged": dict(batch=1, heads=2, seq_len=100, kv_len=77, head_dim=32),
    "causal-ragged": dict(batch=1, heads=2, seq_len=300, kv_len=500, head_dim=64, causal=True),
    "causal-taller": dict(batch=1, heads=2, seq_len=500, kv_len=300, head_dim=64, causal=True),
    "gqa-bf16": dict(batch=2, heads=8, kv_heads=2, seq_len=1000, head_dim=128, dtype="bf16", causal=True),
    "fp32": dict(batch=1, heads=3, seq_len=257, head_dim=64, dtype="fp32"),
}
# the L2 model past one wave and past L2's capacity (H200 profile: room factors, blocks drifting apart)
L2_BIG = {
    "l2-flash2-long": ("flash2", dict(heads=32, seq_len=16384, head_dim=128)),
    "l2-flash2-gqa": ("flash2", dict(heads=32, kv_heads=8, seq_len=8192, head_dim=64, causal=True)),
    "l2-naive": ("naive", dict(heads=16, seq_len=4096, head_dim=128)),
    "l2-flash1": ("flash1", dict(heads=8, seq_len=2048, head_dim=64)),
}
FORWARD = ["naive", "flash1", "flash2", "flash3", "flash-decoding", "block-sparse"]
BACKWARD = ["naive", "flash1", "flash2", "block-sparse"]
L2_SCHEDULES = ["naive", "flash1", "flash2"]
OPTIONS = {"block-sparse": dict(density=0.5, seed=3)}
KEYS = ("traffic", "by_tensor", "flops", "conventional_flops", "sram_peak_bytes", "sram_shared_bytes",
        "sram_register_bytes", "sram_budget_bytes", "tiles", "tiles_by_pass")


def _cases():
    for pname in PROBLEMS:
        for s in FORWARD:
            yield pname, s, "forward", "closed", False
            yield pname, s, "forward", "walk", False
        for s in BACKWARD:
            yield pname, s, "backward", "closed", False
            yield pname, s, "both", "walk", False
        for s in L2_SCHEDULES:
            yield pname, s, "forward", "closed", True
    for pname, (s, _) in L2_BIG.items():
        yield pname, s, "forward", "closed", True


def _key(case) -> str:
    pname, s, ps, method, l2 = case
    return f"{pname}/{s}/{ps}/{method}/{'l2' if l2 else 'no-l2'}"


def _entry(case) -> dict:
    pname, s, ps, method, l2 = case
    p = AttentionProblem(**(L2_BIG[pname][1] if pname in L2_BIG else PROBLEMS[pname]))
    profile = "h200-sxm-141gb" if pname in L2_BIG else "h100-sxm5-80gb"
    j = simulate(s, p, profile, method=method, pass_=ps, l2=l2, **OPTIONS.get(s, {})).to_json()
    out = {k: j[k] for k in KEYS}
    out["kernels"] = j["kernels"]
    return out


def _table() -> dict:
    return {_key(c): _entry(c) for c in _cases()}


@pytest.mark.parametrize("case", list(_cases()), ids=_key)
def test_counts_equal_the_table_pinned_before_the_change(case):
    pinned = json.loads(TABLE.read_text())
    assert _key(case) in pinned, f"{_key(case)} is not in {TABLE.name}"
    assert _entry(case) == pinned[_key(case)]


def test_the_pinned_table_covers_every_case():
    assert set(json.loads(TABLE.read_text())) == {_key(c) for c in _cases()}


if __name__ == "__main__":  # python tests/test_pinned_counts.py --write
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_pinned_counts.py --write   (rewrites tests/data/pinned_counts.json)")
    TABLE.write_text(json.dumps(_table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE} ({len(json.loads(TABLE.read_text()))} cases)")
