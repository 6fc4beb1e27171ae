"""Hardware profiles: the built-ins load and source every number; units parse as people write them; bad files fail
with an error that names the field; a profile is the same whether written in Python, YAML or JSON."""

from __future__ import annotations

import copy
import json
import math
import re
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner
from helpers import run_cli
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from iosim.cli import cli
from iosim.hardware.cpu import get_cpu_profile
from iosim.hardware.gpu import (
    DEFAULT_PROFILE,
    PROFILES_DIR,
    Profile,
    ProfileError,
    SourcedBytes,
    builtin_profile_names,
    get_profile,
    load_profile_file,
    profile_from_dict,
)
from iosim.units import parse_quantity

BUILTINS = [
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "b200",
    "h100-sxm5-80gb",
    "h200-sxm-141gb",
    "l4",
    "mi300x",
    "rtx-4090",
]

PREFIXES = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _sourced(obj, path=""):
    """Every {value, source} pair in a profile, with its dotted location."""
    if isinstance(obj, BaseModel):
        fields = type(obj).model_fields
        if "source" in fields and "value" in fields:
            yield path, obj
            return
        if "source" in fields:  # several numbers under one source (l2.room): each is a pair of its own
            for f in fields:
                if f != "source":
                    yield f"{path}.{f}", SimpleNamespace(value=getattr(obj, f), source=obj.source)
            return
        for field in type(obj).model_fields:
            yield from _sourced(getattr(obj, field), f"{path}.{field}" if path else field)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from _sourced(item, f"{path}.{i}")


def _numbers_outside_sourced(obj, path=""):
    """Numbers that are not inside a {value, source} pair (schema_version aside)."""
    if isinstance(obj, dict):
        if "source" in obj:
            return
        for k, v in obj.items():
            if path == "" and k == "schema_version":
                continue
            yield from _numbers_outside_sourced(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers_outside_sourced(v, f"{path}.{i}")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path


def _h100_dict() -> dict:
    return yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())


# -- the built-ins ------------------------------------------------------------------------------------------------


def test_the_eight_builtin_profiles_are_exactly_the_named_ones():
    assert builtin_profile_names() == sorted(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_profile_validates_and_every_number_has_a_source(name):
    p = get_profile(name)
    assert isinstance(p, Profile)
    assert p.name == name, "the file name and the profile's name agree"
    pairs = list(_sourced(p))
    assert len(pairs) >= 17, "at least every required number"
    for where, pair in pairs:
        assert pair.source.strip(), f"{name}: {where} has an empty source"
    raw = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
    assert list(_numbers_outside_sourced(raw)) == [], "every number sits in a {value, source} pair"


@pytest.mark.parametrize("name", BUILTINS)
def test_every_unpublished_number_is_null_with_a_source_that_says_why(name):
    for where, pair in _sourced(get_profile(name)):
        if pair.value is None:
            assert "not" in pair.source.lower(), f"{name}: {where} is null but its source does not say why"


def test_the_default_profile_is_h100_sxm5_80gb():
    assert DEFAULT_PROFILE == "h100-sxm5-80gb"
    assert get_profile().name == "h100-sxm5-80gb"
    assert get_profile(None) is get_profile("h100-sxm5-80gb")


def test_a_profile_file_path_and_a_profile_object_are_accepted_where_a_name_is(tmp_path):
    path = PROFILES_DIR / "a100-sxm4-40gb.yaml"
    assert get_profile(str(path)) == get_profile("a100-sxm4-40gb")
    p = get_profile("l4")
    assert get_profile(p) is p


def test_an_unknown_profile_name_is_an_error_that_lists_the_builtins():
    with pytest.raises(ProfileError, match="h100-sxm5-80gb"):
        get_profile("h1000")


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_profile_name_says_it_is_empty(name):
    """Issue 30 item 14: --profile '' read as the path '.' and said ". : no such profile file"."""
    with pytest.raises(ProfileError, match=rf"^profile={name!r}: the name is empty; expected a built-in name "
                                           r"\(a100-sxm4-40gb, .*\) or the path of a \.yaml/\.json profile file"):
        get_profile(name)
    with pytest.raises(ProfileError, match=rf"^profile={name!r}: the name is empty"):
        get_cpu_profile(name)


def test_the_cli_says_an_empty_profile_name_is_empty(capsys):
    code, _, err = run_cli(["simulate", "flash2", "--seq-len", "128", "--profile", ""], capsys)
    assert code == 2 and "profile='': the name is empty" in err and "Traceback" not in err

@pytest.mark.parametrize("name", BUILTINS)
def test_memory_levels_of_every_builtin_are_outermost_first_and_shrink_inward(name):
    p = get_profile(name)
    assert [m.level for m in p.memory] == ["dram", "l2", "smem", "registers"]
    if p.l2.capacity.value is not None:
        assert p.dram.capacity.value > p.l2.capacity.value > p.smem.per_sm.value
    assert p.smem.per_block.value <= p.smem.per_sm.value


@pytest.mark.parametrize("name", BUILTINS)
def test_dense_tensor_rates_exceed_plain_fp32_and_fp16_equals_bf16(name):
    c = get_profile(name).compute
    assert c.tensor.bf16.value == c.tensor.fp16.value
    assert c.tensor.bf16.value > c.fp32.value
    if c.tensor.fp8 is not None and c.tensor.fp8.value is not None:
        assert c.tensor.fp8.value == pytest.approx(2 * c.tensor.bf16.value, rel=0.01)


@pytest.mark.parametrize("name", [n for n in BUILTINS if n != "mi300x"])
def test_nvidia_exp_rate_is_16_exp2_per_sm_per_clock_wherever_sm_count_and_clock_are_published(name):
    p = get_profile(name)
    if p.sm_count.value is None or p.clock.value is None:
        assert p.compute.exp.value is None
    else:
        assert p.compute.exp.value == pytest.approx(16 * p.sm_count.value * p.clock.value, rel=1e-12)


def test_h200_sxm_rates_equal_h100_sxm_rates_as_the_h200_datasheet_states():
    h100, h200 = get_profile("h100-sxm5-80gb"), get_profile("h200-sxm-141gb")
    for dtype in ("fp16", "bf16", "fp8", "tf32"):
        assert getattr(h200.compute.tensor, dtype).value == getattr(h100.compute.tensor, dtype).value
    assert h200.compute.fp32.value == h100.compute.fp32.value
    assert h200.compute.exp.value == h100.compute.exp.value
    assert h200.dram.bandwidth.value == 4.8e12 and h200.dram.capacity.value == 141 * 10**9


def test_h200_l2_is_the_measured_60_mib_and_says_where_it_was_measured():
    l2 = get_profile("h200-sxm-141gb").l2.capacity
    assert l2.value == 62_914_560 == 60 * 2**20
    assert "measured on" in l2.source


def test_mi300x_notes_say_how_cus_lds_and_vgprs_map_onto_the_model():
    p = get_profile("mi300x")
    assert p.sm_count.value == 304
    assert p.smem.per_sm.value == 64 * 1024
    for term in ("CU", "LDS", "VGPR"):
        assert term in p.notes


# -- units --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "family", "expected"),
    [
        ("80GB", "bytes", 80e9),
        ("50MiB", "bytes", 52_428_800),
        ("228KiB", "bytes", 233_472),
        ("3.35 TB/s", "bytes/s", 3.35e12),
        ("989.4 TFLOP/s", "flop/s", 989.4e12),
        ("1.98 GHz", "Hz", 1.98e9),
        ("4.18176 Top/s", "op/s", 4.18176e12),
        ("2.25 PFLOP/s", "flop/s", 2.25e15),
        (1555, "bytes", 1555.0),
    ],
)
def test_units_parse_as_people_write_them(text, family, expected):
    assert parse_quantity(text, family) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(("text", "family"), [("80 GBB", "bytes"), ("3.35 TB", "bytes/s"), ("fast", "Hz")])
def test_a_quantity_in_the_wrong_unit_is_an_error_that_names_the_unit(text, family):
    with pytest.raises(ValueError, match=r"unit|cannot read"):
        parse_quantity(text, family)


@given(n=st.integers(min_value=1, max_value=100_000), prefix=st.sampled_from(sorted(PREFIXES)))
def test_byte_sizes_round_trip_for_every_prefix(n, prefix):
    factor = PREFIXES[prefix]
    assert parse_quantity(f"{n}{prefix}B", "bytes") == n * factor
    assert parse_quantity(f"{n} {prefix}B", "bytes") == n * factor
    assert SourcedBytes(value=f"{n}{prefix}B", source="test").value == n * factor


# -- bad files ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "location"),
    [
        (lambda d: d.__setitem__("colour", "green"), "colour"),
        (
            lambda d: d["compute"]["tensor"].__setitem__("fp4", {"value": 1, "source": "x"}),
            "compute.tensor.fp4",
        ),
        (lambda d: d["memory"][1].__setitem__("associativity", 16), "memory[1].l2.associativity"),
        (lambda d: d["sm_count"].__setitem__("sourse", "typo"), "sm_count.sourse"),
    ],
)
def test_unknown_keys_are_rejected_with_an_error_naming_the_dotted_location(mutate, location):
    data = _h100_dict()
    mutate(data)
    with pytest.raises(ProfileError) as err:
        profile_from_dict(data, "my-gpu.yaml")
    msg = str(err.value)
    assert location in msg
    assert "unknown key" in msg
    assert "my-gpu.yaml" in msg


def test_unknown_keys_in_a_file_are_rejected_with_the_file_and_the_field(tmp_path):
    data = _h100_dict()
    data["memory"][2]["per_warp"] = {"value": "1KiB", "source": "x"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"memory\[2\]\.smem\.per_warp: unknown key") as err:
        load_profile_file(path)
    assert str(path) in str(err.value)


def test_memory_levels_out_of_order_are_rejected():
    data = _h100_dict()
    data["memory"][0], data["memory"][1] = data["memory"][1], data["memory"][0]
    with pytest.raises(ProfileError, match="outermost first"):
        profile_from_dict(data)


def test_a_missing_memory_level_is_rejected():
    data = _h100_dict()
    del data["memory"][3]
    with pytest.raises(ProfileError, match="memory"):
        profile_from_dict(data)


def test_a_number_without_a_source_is_rejected():
    data = _h100_dict()
    del data["memory"][0]["bandwidth"]["source"]
    with pytest.raises(ProfileError, match=r"memory\[0\]\.dram\.bandwidth\.source: required field is missing"):
        profile_from_dict(data)
    data = _h100_dict()
    data["clock"]["source"] = ""
    with pytest.raises(ProfileError, match=r"clock\.source"):
        profile_from_dict(data)


def test_shared_memory_per_block_above_per_sm_is_rejected_naming_both():
    """Issue 30 item 13: one thread block cannot use more shared memory than its SM has."""
    data = _h100_dict()
    data["memory"][2]["per_block"]["value"] = "300KiB"
    with pytest.raises(ProfileError, match=r"memory\[2\]\.smem: per_block = 307,200 B is more than per_sm = "
                                           r"233,472 B"):
        profile_from_dict(data)
    data["memory"][2]["per_block"]["value"] = "228KiB"  # equal is fine
    assert profile_from_dict(data).smem.per_block.value == 233_472

def test_a_malformed_quantity_is_rejected_with_the_field_and_the_text():
    data = _h100_dict()
    data["memory"][0]["capacity"]["value"] = "80 GBB"
    with pytest.raises(ProfileError, match=r"memory\[0\]\.dram\.capacity\.value: .*'80 GBB'"):
        profile_from_dict(data)


def test_a_fractional_byte_count_is_rejected():
    data = _h100_dict()
    data["memory"][2]["per_sm"]["value"] = "0.5B"
    with pytest.raises(ProfileError, match=r"memory\[2\]\.smem\.per_sm\.value: .*whole number of bytes"):
        profile_from_dict(data)


def test_a_file_that_is_not_a_mapping_or_not_yaml_is_rejected(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match="mapping"):
        load_profile_file(tmp_path / "list.yaml")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile_file(tmp_path / "broken.json")
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile_file(tmp_path / "absent.yaml")


# -- one profile, three spellings ---------------------------------------------------------------------------------


def _s(value, source="test fixture"):
    return {"value": value, "source": source}


def _example_fields() -> dict:
    """A small made-up GPU, written with human units, one unpublished number."""
    return {
        "name": "toy-gpu",
        "display_name": "Toy GPU",
        "vendor": "Nobody",
        "notes": "a test fixture, not a real part",
        "sm_count": _s(4),
        "clock": _s("1.5 GHz"),
        "memory": [
            {"level": "dram", "name": "HBM3", "capacity": _s("16GB"), "bandwidth": _s("1.2 TB/s")},
            {
                "level": "l2",
                "capacity": _s("4MiB"),
                "bandwidth": _s(None, "not published by Nobody"),
                "line_size": _s("128B"),
                "sector_size": _s("32B"),
            },
            {"level": "smem", "per_sm": _s("128KiB"), "per_block": _s("96KiB"), "bandwidth": _s("2 TB/s")},
            {"level": "registers", "per_sm": _s("256KiB")},
        ],
        "sm": {"max_threads": _s(2048), "max_blocks": _s(16)},
        "compute": {
            "tensor": {"fp16": _s("100 TFLOP/s"), "bf16": _s("100 TFLOP/s"), "fp8": _s("200 TFLOP/s")},
            "fp32": _s("10 TFLOP/s"),
            "exp": _s("96 Gop/s"),
        },
    }


def test_a_profile_built_in_python_equals_the_same_profile_loaded_from_yaml_and_from_json(tmp_path):
    fields = _example_fields()
    built = Profile(**copy.deepcopy(fields))
    assert profile_from_dict(copy.deepcopy(fields)) == built

    yaml_path = tmp_path / "toy-gpu.yaml"
    yaml_path.write_text(yaml.safe_dump(fields, sort_keys=False))
    json_path = tmp_path / "toy-gpu.json"
    json_path.write_text(json.dumps(fields, indent=2))
    assert load_profile_file(yaml_path) == built
    assert load_profile_file(json_path) == built
    assert get_profile(str(yaml_path)) == built

    assert built.dram.capacity.value == 16 * 10**9
    assert built.l2.capacity.value == 4 * 2**20
    assert built.smem.per_block.value == 96 * 1024
    assert built.compute.exp.value == pytest.approx(96e9)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_survives_a_json_round_trip_in_base_units(name, tmp_path):
    p = get_profile(name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(p.model_dump(mode="json")))
    assert load_profile_file(path) == p


def test_profiles_are_frozen():
    p = get_profile("h100-sxm5-80gb")
    with pytest.raises(ValidationError, match="frozen"):
        p.name = "other"


# -- unpublished numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dotted"),
    [
        ("b200", "sm_count"),
        ("b200", "l2.capacity"),
        ("b200", "compute.exp"),
        ("l4", "clock"),
        ("mi300x", "compute.exp"),
        ("mi300x", "sm.max_threads"),
        ("h200-sxm-141gb", "l2.bandwidth"),
    ],
)
def test_a_null_number_raises_a_profile_error_naming_the_field_when_it_is_required(name, dotted):
    p = get_profile(name)
    with pytest.raises(ProfileError) as err:
        p.require(dotted)
    msg = str(err.value)
    assert dotted in msg and name in msg and "is not known" in msg


def test_a_null_number_in_a_python_built_profile_raises_when_required_and_known_numbers_do_not():
    p = Profile(**_example_fields())
    with pytest.raises(
        ProfileError, match=r"'toy-gpu': l2\.bandwidth is not known \(not published by Nobody\)"
    ):
        p.require("l2.bandwidth")
    assert p.require("l2.capacity") == 4 * 2**20
    assert p.require("compute.tensor.bf16") == pytest.approx(100e12)


def test_matmul_rate_uses_the_tensor_rate_per_dtype_and_plain_fp32_for_fp32():
    p = get_profile("h100-sxm5-80gb")
    assert p.matmul_rate("bf16") == p.compute.tensor.bf16.value
    assert p.matmul_rate("fp16") == p.compute.tensor.fp16.value
    assert p.matmul_rate("fp32") == p.compute.fp32.value
    toy = Profile(**_example_fields())
    with pytest.raises(ProfileError, match=r"compute\.tensor\.tf32"):
        toy.matmul_rate("tf32")  # absent from the profile, not merely null


def test_every_published_number_is_positive_and_finite():
    for name in BUILTINS:
        p = get_profile(name)
        for where, pair in _sourced(p):
            values = pair.value.values() if isinstance(pair.value, dict) else [pair.value]  # measured tables
            for v in values:
                if v is not None:
                    assert math.isfinite(v) and v > 0, f"{name}: {where}"


# -- docs/profiles.md stays true ----------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "profiles.md"
needs_doc = pytest.mark.skipif(
    not DOC.is_file(), reason="docs/profiles.md is not beside the tests (installed copy)"
)


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def _table_row(name: str) -> str:
    p = get_profile(name)

    def rate(v, unit, scale, fmt="{:g}"):
        return "null" if v is None else fmt.format(v / scale) + " " + unit

    def size(v, binary, unit):
        return "null" if v is None else f"{v:,} B ({v / binary:g} {unit})"

    label = f"`{name}`" + (" (default)" if name == DEFAULT_PROFILE else "")
    cells = [
        label,
        "null" if p.sm_count.value is None else str(p.sm_count.value),
        rate(p.dram.bandwidth.value, "TB/s", 1e12),
        size(p.l2.capacity.value, 2**20, "MiB"),
        size(p.smem.per_block.value, 2**10, "KiB"),
        rate(p.compute.tensor.bf16.value, "TFLOP/s", 1e12),
        rate(p.compute.fp32.value, "TFLOP/s", 1e12),
        rate(p.compute.exp.value, "Top/s", 1e12, "{:.5g}"),
    ]
    return "| " + " | ".join(cells) + " |"


@needs_doc
def test_the_builtin_table_in_docs_matches_the_yaml_files():
    text = DOC.read_text()
    for name in BUILTINS:
        assert _table_row(name) in text, (
            f"docs/profiles.md row for {name} is stale; expected {_table_row(name)}"
        )


@needs_doc
def test_the_example_profile_in_docs_validates_and_equals_its_template(tmp_path):
    example = next(block for block in _fenced("yaml") if block.startswith("# my-gpu.yaml"))
    path = tmp_path / "my-gpu.yaml"
    path.write_text(example)
    mine = load_profile_file(path)
    h100 = get_profile("h100-sxm5-80gb")
    for where, pair in _sourced(h100):
        if where.startswith("calibration.") or {"room", "dirty_at_start", "block_share"} & set(where.split(".")):
            continue  # measured on the GPU (iosim calibrate rates, l2, block-share), not the datasheet template
        assert dict(_sourced(mine))[where].value == pair.value, where


@needs_doc
def test_the_python_example_in_docs_builds_a_profile():
    code = next(block for block in _fenced("python") if "p = Profile(" in block)
    scope: dict = {}
    exec(code, scope)
    assert scope["p"].l2.capacity.value == 50 * 2**20


@pytest.mark.parametrize(
    ("path", "value", "location"),
    [
        (("memory", 0, "bandwidth"), 0, r"memory\[0\]\.dram\.bandwidth\.value: 0 is not a positive quantity"),
        (("memory", 0, "bandwidth"), "0 TB/s", r"memory\[0\]\.dram\.bandwidth\.value: '0 TB/s' is not a positive"),
        (("memory", 1, "capacity"), "0MiB", r"memory\[1\]\.l2\.capacity\.value: '0MiB' is not a positive"),
        (("compute", "fp32"), 0.0, r"compute\.fp32\.value: 0\.0 is not a positive quantity in flop/s"),
        (("clock",), "0 GHz", r"clock\.value: '0 GHz' is not a positive"),
        (("memory", 0, "bandwidth"), -1, r"memory\[0\]\.dram\.bandwidth\.value: .*non-negative"),
    ],
)
def test_a_zero_or_negative_rate_or_size_is_rejected_naming_the_field(path, value, location):
    data = _h100_dict()
    node = data
    for key in path:
        node = node[key]
    node["value"] = value
    with pytest.raises(ProfileError, match=location) as err:
        profile_from_dict(data, "my-gpu.yaml")
    assert "value: null" in str(err.value) or value == -1  # the fix: null where the number is not published


def test_zero_dirty_bytes_at_a_kernels_start_is_a_valid_measurement():
    data = _h100_dict()
    data["memory"][1]["dirty_at_start"] = {"value": "0B", "source": "measured: nothing dirty"}
    assert profile_from_dict(data).l2_dirty_at_start() == 0


@given(digits=st.integers(1, 999_999), point=st.integers(0, 6),
       prefix=st.sampled_from(["", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti"]))
def test_a_decimal_quantity_is_read_exactly_then_rounded_once(digits, point, prefix):
    """'66.9 TFLOP/s' is the float nearest 66.9·10^12 (66900000000000.0), not 66.9 · 1e12 (…0.01)."""
    text = str(Decimal(digits).scaleb(-point))
    factor = PREFIXES[prefix]
    assert parse_quantity(f"{text} {prefix}FLOP/s", "flop/s") == float(Decimal(text) * factor)


@pytest.mark.parametrize("name", BUILTINS)
def test_profiles_show_prints_no_float_noise(name):
    """Every number `iosim profiles show` prints has the digits it was written with, not 17 of them."""
    out = CliRunner().invoke(cli, ["profiles", "show", name])
    assert out.exit_code == 0, out.output
    numbers = re.findall(r"value: ([0-9.e+-]+)$", out.output, flags=re.M)
    assert numbers
    for n in numbers:
        significant = n.split("e")[0].replace(".", "").strip("0")
        assert len(significant) <= 10, f"{name}: {n}"
