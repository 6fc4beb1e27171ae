"""benchmarks/decode_bytes_record.py and the Nsight Compute helper beside it (benchmarks/ncu_child.py), without a GPU:
the CSV ncu prints parsed into each kernel's metrics in launch order, and the committed records judged as the script
judges them (global exact; hbm by iosim.validation's rule), every simulated grid the launched one."""

from __future__ import annotations

import subprocess
import types

import pytest
from helpers import load_benchmark

NCU_CSV = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python","h","flash_decode_kernel<128, 1, bf16>","1","7","(128, 1, 1)","(1, 4, 64)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,234,567"
"0","1","python","h","flash_decode_kernel<128, 1, bf16>","1","7","(128, 1, 1)","(1, 4, 64)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"
"1","1","python","h","flash_decode_combine_kernel<128, bf16>","1","7","(128, 1, 1)","(128, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","2048"
"1","1","python","h","flash_decode_combine_kernel<128, bf16>","1","7","(128, 1, 1)","(128, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","512"
'''


def test_ncu_csv_becomes_each_kernels_metrics_in_launch_order(monkeypatch):
    mod = load_benchmark("ncu_child")
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout=NCU_CSV, stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    got = mod.kernel_metrics("script.py", ["--child", "x"], ("dram__bytes_read.sum", "dram__bytes_write.sum"))
    assert [k["name"][:19] for k in got] == ["flash_decode_kernel", "flash_decode_combin"]
    assert got[0]["dram__bytes_read.sum"] == 1234567 and got[1]["dram__bytes_write.sum"] == 512
    cmd = calls[0]
    assert cmd[:9] == ["ncu", "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
                       "--csv", "--print-units"] and cmd[-3:] == ["script.py", "--child", "x"]
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: types.SimpleNamespace(returncode=1, stdout="",
                                                                                   stderr="no GPU"))
    with pytest.raises(RuntimeError, match="ncu failed"):
        mod.kernel_metrics("script.py", [], ("dram__bytes_read.sum",))


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_the_committed_decode_byte_records_pass_as_the_script_judges_them(device):
    mod = load_benchmark("decode_bytes_record")
    import json

    record = json.loads((mod.ROOT / "data" / "validation" / f"{device}-decode-bytes.json").read_text())
    kernel = record.get("decode_kernel", "v5")  # the H100's record is of v5 (no H100 lent since v6)
    rows = [j for r in record["rows"] for j in mod.judged(device, r, kernel)]  # raises where a simulated grid differs
    assert {r["cache"] for r in rows} == {"same", "fp8"}
    assert all(r["passed"] for r in rows)
    assert all(r["by"] == "exact" for r in rows if r["boundary"] == "global")
