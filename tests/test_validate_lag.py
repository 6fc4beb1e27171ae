"""benchmarks/validate_lag.py: each ncu launch is paired with the timeline of the same launch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import load_benchmark

HEADER = '"ID","Kernel Name","Block Size","Grid Size","Metric Name","Metric Unit","Metric Value"'


@pytest.fixture(scope="module")
def lag():
    return load_benchmark("validate_lag")


def _timeline(path: Path, n: int, h: int, launch: int, sms: int = 4, causal: bool = False) -> None:
    """A lockstep timeline: block b on SM b mod sms, every block 1000 ns (SM 0 a little slower)."""
    nb = (n // 128) * h
    b = np.arange(nb)
    start = (b // sms) * (1000 + 10 * (b % sms == 0))
    np.savez(
        path / f"timeline_N{n}_H{h}_d128{'_causal' if causal else ''}_r{launch}.npz",
        start_ns=start,
        end_ns=start + 1000,
        sm=(b % sms).astype(np.int32),
        grid=np.array([n // 128, h, 1]),
        config=json.dumps({"seq_len": n, "heads": h, "head_dim": 128, "causal": causal, "dtype": "fp16"}),
        device=json.dumps({"uuid": "GPU-test"}),
    )


def _ncu(path: Path, launches: list[tuple[tuple[int, int], int]], writes: list[int] | None = None) -> None:
    rows = [HEADER]
    for i, ((gx, gy), read) in enumerate(launches):
        k = f'"{i}","void flash_fwd_kernel<128, 128, 32, __half, 0>(...)","(128, 1, 1)","({gx}, {gy}, 1)"'
        rows.append(f'{k},"dram__bytes_read.sum","byte","{read:,}"')
        rows.append(f'{k},"dram__bytes_write.sum","byte","{writes[i] if writes else 0:,}"')
    (path / "pair_ncu.csv").write_text("==PROF== Connected\n" + "\n".join(rows) + "\n")


def test_launches_pair_with_their_own_timelines(lag, tmp_path, capsys):
    # the device ran H=4 first, then H=2 (names sort the other way): pairing goes by ncu's launch order and grid
    for i in range(2):
        _timeline(tmp_path, 1024, 4, i)
        _timeline(tmp_path, 1024, 2, i)
    reads = [3_000_000_000, 3_100_000_000, 1_000_000_000, 1_200_000_000]
    writes = [2_000_000, 0, 1_500_000, 1_000_000]
    grids = [(8, 4), (8, 4), (8, 2), (8, 2)]
    _ncu(tmp_path, list(zip(grids, reads, strict=True)), writes)
    lag.main_args([str(tmp_path)])
    out = capsys.readouterr().out
    assert "N1024_H4_d128 launch 1: measured read   3.100 GB" in out
    assert "N1024_H2_d128 launch 0: measured read   1.000 GB" in out
    assert "| N1024_H4_d128 | 2 | 3.00, 3.10 |" in out
    assert "| N1024_H2_d128 | 2 | 1.00, 1.20 |" in out
    # writes: the model writes nothing back on a problem this small (it fits in L2), so -100% against 1.5 and 1 MB
    assert "| N1024_H2_d128 | 2 | 1.50, 1.00 | -100.0% to -100.0% |" in out
    assert "| N1024_H4_d128 | 2 | 2.00, 0.00 | measured 0 B in some launch |" in out
    assert "GPU GPU-test" in out
    assert "N1024_H4_d128: +1.00" in out  # the per-SM pattern, launch against launch


def test_a_launch_of_another_grid_is_refused(lag, tmp_path):
    _timeline(tmp_path, 1024, 2, 0)
    _ncu(tmp_path, [((16, 2), 1_000_000)])
    with pytest.raises(SystemExit, match="matches no timeline"):
        lag.main_args([str(tmp_path)])


def test_a_missing_launch_is_refused(lag, tmp_path):
    _timeline(tmp_path, 1024, 2, 0)
    _timeline(tmp_path, 1024, 2, 1)
    _ncu(tmp_path, [((8, 2), 1_000_000)])
    with pytest.raises(SystemExit, match="1 flash launches, but there are 2 timelines"):
        lag.main_args([str(tmp_path)])


def test_problems_of_one_grid_pair_by_order_json_and_are_refused_without_it(lag, tmp_path, capsys):
    # the masked problem ran first; both have grid (8, 2, 1), so only order.json can tell their launches apart
    _timeline(tmp_path, 1024, 2, 0, causal=True)
    _timeline(tmp_path, 1024, 2, 0)
    _ncu(tmp_path, [((8, 2), 2_000_000), ((8, 2), 1_000_000)])
    with pytest.raises(SystemExit, match="same grid"):
        lag.main_args([str(tmp_path)])
    (tmp_path / "order.json").write_text(json.dumps(["N1024_H2_d128_causal", "N1024_H2_d128"]))
    lag.main_args([str(tmp_path)])
    out = capsys.readouterr().out
    assert "N1024_H2_d128_causal launch 0: measured read   0.002 GB" in out
    assert "N1024_H2_d128 launch 0: measured read   0.001 GB" in out
    (tmp_path / "order.json").write_text(json.dumps(["N1024_H2_d128"] * 2))
    with pytest.raises(SystemExit, match="launched 2 times, 1 timelines"):
        lag.main_args([str(tmp_path)])
