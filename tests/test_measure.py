"""iosim.measure without a GPU: the run descriptions, parsing ncu's CSV (a sample recorded on the H200), grouping
launches by marker kernels, summing, merging the one-pass DRAM profile, reading records back (repeats, archives),
CSV output, and the clear errors."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from iosim import measure as M
from iosim.measure.records import merge_repeats, read_records, run_of

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def sample():
    return M.parse_ncu_csv((DATA / "ncu_h200_smoke.csv").read_text())


def test_parse_sample_launches(sample):
    names = [k["kernel"] for k in sample]
    assert len(sample) == 16  # 7 markers + copy + l2probe x2 + flash2 + naive x3 + sdpa flash + cuDNN
    assert sum("iosim_marker" in n for n in names) == 7
    assert any("iosim::flash_fwd_kernel<128, 128, 32, __half, 0>" in n for n in names)
    assert any("Flash_fwd_kernel_traits<128, 128, 64, 4" in n for n in names)
    for k in sample:  # numbers without thousands separators, in base units
        for v in k["metrics"].values():
            assert v is None or isinstance(v, (int, float, str))
    copy = next(k for k in sample if "iosim_copy" in k["kernel"])
    s = M.summarize(copy)
    # the metric choice, proven on a copy of 64 MiB: SM->L2 sectors x 32 = the bytes the kernel reads and writes
    assert s["l2_read_bytes"] == s["l2_write_bytes"] == 64 << 20
    assert s["lts_t_bytes"] > 2 * (64 << 20)  # lts__t_bytes counts fills and write-backs too
    assert s["dram_read_bytes"] >= 64 << 20
    assert copy["grid"] == "(1056, 1, 1)"


def test_group_by_marker_and_sum(sample):
    g = M.group_by_marker(sample)
    assert sorted(g) == list(range(7))
    assert [len(g[i]) for i in range(7)] == [1, 1, 1, 1, 3, 1, 1]
    naive = M.sum_launches(g[4])
    parts = [M.summarize(k) for k in g[4]]
    assert naive["dram_read_bytes"] == sum(p["dram_read_bytes"] for p in parts)
    assert naive["duration_ns"] == sum(p["duration_ns"] for p in parts)


def test_summary_matches_the_recorded_run(sample):
    """The committed JSON of the same run was produced by the same parser on the device."""
    rec = json.loads((DATA / "measured_h200_smoke.json").read_text())
    g = M.group_by_marker(sample)
    for i, e in enumerate(rec["configs"]):
        assert M.sum_launches(g[i])["dram_read_bytes"] == e["measured"]["dram_read_bytes"]


def _entry(launches):
    """A config's record as measure() builds it from the replayed profile."""
    kernels = [{"kernel": k["kernel"], **M.summarize(k)} for k in launches]
    return {"kernels": kernels, "measured": M.sum_launches(launches)}


def _with_dram(launch, read, write):
    """The same launch as the one-pass DRAM profile would report it."""
    return {**launch, "metrics": {"dram__bytes_read.sum": read, "dram__bytes_write.sum": write}}


def test_one_pass_dram_bytes_replace_the_replayed_ones_which_are_kept(sample):
    naive = M.group_by_marker(sample)[4]  # three kernels
    e = _entry(naive)
    replayed = [k["dram_write_bytes"] for k in e["kernels"]]
    dram = [_with_dram(k, 1000 + i, 10 * i) for i, k in enumerate(naive)]
    M.use_dram_pass(e, naive, dram)
    assert [k["dram_read_bytes"] for k in e["kernels"]] == [1000, 1001, 1002]
    assert [k["dram_write_bytes_replayed"] for k in e["kernels"]] == replayed
    assert e["measured"]["dram_read_bytes"] == 3003 and e["measured"]["dram_write_bytes"] == 30
    assert e["measured"]["dram_write_bytes_replayed"] == sum(replayed)
    assert "error" not in e


def test_a_dram_profile_of_other_kernels_is_an_error_not_a_mix(sample):
    naive = M.group_by_marker(sample)[4]
    e = _entry(naive)
    before = e["measured"]["dram_read_bytes"]
    M.use_dram_pass(e, naive, [_with_dram(k, 1, 1) for k in naive[:2]])
    assert "DRAM profile saw other kernels" in e["error"]
    assert e["measured"]["dram_read_bytes"] == before


def test_counter_permission_error():
    text = "==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    with pytest.raises(M.MeasureError, match="ERR_NVGPUCTRPERM"):
        M.parse_ncu_csv(text)


def test_ncu_error_lines_are_reported():
    with pytest.raises(M.MeasureError, match="Failed to find metric"):
        M.parse_ncu_csv("==ERROR== Failed to find metric foo__bar.sum\n")
    assert M.parse_ncu_csv("==PROF== nothing profiled\n") == []


def test_missing_ncu_is_a_clear_error(tmp_path):
    with pytest.raises(M.MeasureError, match="ncu"):
        M.find_ncu(str(tmp_path / "no-such-ncu"))


def test_each_kind_has_its_own_description_and_bad_fields_are_named():
    with pytest.raises(M.MeasureError, match="kind='l2reuse'"):
        M.Attention("l2reuse")
    with pytest.raises(M.MeasureError, match="dtype='fp32'"):
        M.Attention("flash2", dtype="fp32")
    a = M.Attention("flash2", seq_len=512, heads=8)
    assert a.kv_heads == 8 and a.kv_len == 512
    with pytest.raises(M.MeasureError, match="kv_heads=3"):
        M.Attention("flash2", heads=8, kv_heads=3)
    with pytest.raises(M.MeasureError, match="only flash2's tiles"):
        M.Attention("naive", block_q=64, block_kv=64)
    with pytest.raises(M.MeasureError, match="nbytes=100"):
        M.ReadProbe(100)
    with pytest.raises(M.MeasureError, match="threads=100"):
        M.ReadProbe(1 << 20, threads=100)
    with pytest.raises(M.MeasureError, match="interleave"):
        M.WriteProbe(1 << 20, 1 << 20, shared=True, interleave=True)
    assert [M.WriteProbe(16, 16, shared=s, interleave=i).mode for s, i in ((0, 0), (1, 0), (0, 1))] == [0, 1, 2]


@pytest.mark.parametrize("run", [M.Attention("sdpa-cudnn", seq_len=4096, heads=32, kv_heads=8, causal=True),
                                 M.ReadProbe(48 << 20, blocks_per_sm=2, threads=128),
                                 M.WriteProbe(8 << 20, 32 << 20, interleave=True),
                                 M.Attention("flash3", seq_len=8192, heads=16, causal=True, window=(1024, 0)),
                                 M.Attention("flash2", seq_len=4096, window=(None, 256)),
                                 M.Attention("flash2", seq_len=300, kv_len=900, seqlens=((100, 800), (200, 100)))])
def test_runs_go_to_the_worker_and_back_unchanged(run):
    assert M.from_dict(json.loads(json.dumps(M.to_dict(run)))) == run


def test_a_window_is_flash2s_and_flash3s():
    with pytest.raises(M.MeasureError, match=r"window=.*kind=.naive."):
        M.Attention("naive", window=(128, 0))
    with pytest.raises(M.MeasureError, match="window"):
        M.Attention("flash2", window=(128,))


def test_packed_sequences_are_flash2s_and_flash3s_and_add_up_to_a_batch_of_one():
    assert M.Attention("flash2", seq_len=10, seqlens=[[3, 3], [7, 7]]).seqlens == ((3, 3), (7, 7))  # JSON's lists
    assert M.Attention("flash3", seq_len=10, seqlens=[[3, 3], [7, 7]]).seqlens == ((3, 3), (7, 7))
    for bad in (dict(kind="naive", seq_len=10), dict(kind="flash2", seq_len=11), dict(kind="flash2", seq_len=5, batch=2)):
        with pytest.raises(M.MeasureError, match="packed sequences are flash2's and flash3's"):
            M.Attention(**bad, seqlens=((3, 3), (7, 7)))


def test_an_unknown_field_is_an_error_that_names_it():
    with pytest.raises(M.MeasureError, match="spin_us"):
        M.from_dict({"kind": "l2write", "nbytes": 16, "spin_us": 5})


def test_legacy_records_keep_the_kinds_still_measured():
    legacy = {"kind": "l2write", "seq_len": 1024, "heads": 1, "nbytes": 32, "read_bytes": 16, "read_shared": True,
              "interleave": False, "read_written": False, "spin_us": 0}
    assert run_of({"config": legacy}) == M.WriteProbe(32, 16, shared=True)
    assert run_of({"config": {**legacy, "read_written": True, "read_bytes": 0, "read_shared": False}}) is None
    assert run_of({"config": {**legacy, "kind": "l2reuse"}}) is None


def _launch(read, write):
    return {"run": M.to_dict(M.ReadProbe(64)), "measured": {"dram_read_bytes": read, "dram_write_bytes": write}}


def test_repeated_launches_merge_to_medians_with_each_launch_kept(tmp_path):
    data = {"device": {"name": "GPU"}, "entries": [_launch(100, 1), _launch(300, 5), _launch(200, 3),
                                                   {**_launch(0, 0), "error": "boom"}]}
    (m,) = merge_repeats(data)
    assert m.measured == {"dram_read_bytes": 200, "dram_write_bytes": 3}
    assert [x["dram_read_bytes"] for x in m.launches] == [100, 300, 200]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "measured_probes.json").write_text(json.dumps(data))
    archive = tmp_path / "run.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(folder / "measured_probes.json", arcname="measured_probes.json")
    for source in (folder, archive, folder / "measured_probes.json"):
        assert read_records(source) == {"probes": data}
    with pytest.raises(M.MeasureError, match="not a measured"):
        read_records(tmp_path / "nothing.txt")


def test_no_gpu_is_a_clear_error(monkeypatch):
    from iosim.gpu import _cupy

    def boom():
        raise _cupy.GPUUnavailableError("iosim.gpu needs CuPy and an NVIDIA GPU")

    monkeypatch.setattr(_cupy, "require_cupy", boom)
    with pytest.raises(M.MeasureError, match="GPU"):
        M.measure([M.Attention("flash2")])


def test_csv_output_one_row_per_run():
    rec = json.loads((DATA / "measured_h200_smoke.json").read_text())
    entries = [{**e, "run": M.to_dict(run_of(e))} for e in rec["configs"] if run_of(e) is not None]
    record = M.Record(rec["device"], rec["metrics"], rec["ncu_command"], "", entries)
    lines = M.to_csv(record).strip().splitlines()
    assert lines[0].startswith("kind,batch,heads")
    assert len(lines) == 1 + len(entries)
    assert sum("iosim::flash_fwd_kernel" in ln for ln in lines) == 1


def test_choose_metrics_filters_optional():
    mets = M.choose_metrics({"lts__t_sectors_srcunit_tex_op_write"})
    assert "lts__t_sectors_srcunit_tex_op_write.sum" in mets
    assert "l1tex__m_xbar2l1tex_read_bytes.sum" not in mets
    assert all(m in mets for m in M.CORE_METRICS)


def test_cli_without_gpu_is_one_line(monkeypatch):
    from click.testing import CliRunner

    from iosim.cli.measure import measure_cmd
    from iosim.gpu import _cupy

    def boom():
        raise _cupy.GPUUnavailableError("iosim.gpu needs CuPy and an NVIDIA GPU")

    monkeypatch.setattr(_cupy, "require_cupy", boom)
    res = CliRunner().invoke(measure_cmd, ["--kind", "flash2", "--seq-len", "1024"])
    assert res.exit_code == 1  # click's exit code for ClickException when run standalone
    assert "needs CuPy and an NVIDIA GPU" in res.output
    assert "Traceback" not in res.output


def test_device_identity_names_the_physical_gpu():
    uuid = bytes.fromhex("f31e45c5e45786cb1f9947df0918ba08")
    props = {"uuid": uuid, "pciBusID": 0, "pciDeviceID": 6, "pciDomainID": 0}
    ident = M.device_identity(props)
    # the form nvidia-smi prints (run 6: GPU-f31e45c5-e457-86cb-1f99-47df0918ba08 at 00000000:00:06.0)
    assert ident == {"uuid": "GPU-f31e45c5-e457-86cb-1f99-47df0918ba08", "pci_bus_id": "00000000:00:06.0"}
    assert M.device_identity({}) == {}
