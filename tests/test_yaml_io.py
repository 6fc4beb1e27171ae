"""The files people write (GPU and CPU profiles, kernel descriptions, scenarios) are read by one loader: a key
given twice or nesting past its limit is an error naming the file, never a RecursionError or a silent last-wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iosim.hardware.cpu import CPU_PROFILES_DIR, get_cpu_profile
from iosim.hardware.gpu import PROFILES_DIR, ProfileError, get_profile
from iosim.scenario import ScenarioError, load_scenario
from iosim.timing import KernelError, load_kernel
from iosim.timing.kernels import KERNELS_DIR

DEEP = "a:\n" + "".join("  " * i + f"- k{i}:\n" for i in range(1, 1200)) + "  " * 1200 + "- 1\n"
DEEP_FLOW = "a: " + "[" * 3000 + "]" * 3000 + "\n"


LOADERS = [("profile", get_profile, PROFILES_DIR / "h100-sxm5-80gb.yaml", ProfileError),
           ("cpu profile", get_cpu_profile, CPU_PROFILES_DIR / "amd-epyc-9654.yaml", ProfileError),
           ("kernel", load_kernel, KERNELS_DIR / "fa2.yaml", KernelError),
           ("scenario", load_scenario, Path(__file__).resolve().parents[1] / "scenarios/decoding.yaml",
            ScenarioError)]
IDS = [name for name, *_ in LOADERS]


@pytest.mark.parametrize("text", [DEEP, DEEP_FLOW], ids=["block", "flow"])
@pytest.mark.parametrize("name,load,real,error", LOADERS, ids=IDS)
def test_deep_nesting_is_an_error_naming_the_file(tmp_path, name, load, real, error, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(error, match=r"deep\.yaml.*nested more than 100 levels deep"):
        load(str(path))


@pytest.mark.parametrize("name,load,real,error", LOADERS, ids=IDS)
def test_a_key_given_twice_is_an_error_naming_the_file_key_and_line(tmp_path, name, load, real, error):
    text = real.read_text()
    first = next(line for line in text.splitlines() if line and line[0].isalpha() and ":" in line)
    path = tmp_path / "twice.yaml"
    path.write_text(text.rstrip("\n") + "\n" + first + "\n")
    key = first.split(":")[0]
    line = len(text.rstrip("\n").splitlines()) + 1
    with pytest.raises(error, match=rf"twice\.yaml.*key '{key}' given twice \(line {line}; first on line \d+\)"):
        load(str(path))


def test_a_json_profile_with_a_key_twice_or_nested_too_deep_is_refused(tmp_path):
    data = get_profile("h100-sxm5-80gb").model_dump(mode="json")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data)[:-1] + ', "name": "again"}')
    with pytest.raises(ProfileError, match=r"p\.json.*key 'name' given twice"):
        get_profile(str(path))
    path.write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(ProfileError, match=r"p\.json.*nested more than 100 levels deep"):
        get_profile(str(path))


def test_the_cli_says_so_in_one_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    out = subprocess.run([sys.executable, "-m", "iosim", "simulate", "flash2", "--seq-len", "128", "--profile",
                          str(path)], capture_output=True, text=True, timeout=300, env={**os.environ})
    assert out.returncode == 2 and "Traceback" not in out.stderr and "RecursionError" not in out.stderr
    assert "nested more than 100 levels deep" in out.stderr


KINDS = {"profile": "profile", "cpu profile": "CPU profile", "kernel": "kernel description", "scenario": "scenario"}


@pytest.mark.parametrize("name,load,real,error", LOADERS, ids=IDS)
def test_every_file_kind_words_a_bad_field_the_same_way(tmp_path, name, load, real, error):
    """One helper (yaml_io.validated) validates all four kinds of file: the file and its kind, then one line per
    bad field, naming its path and the keys accepted beside an unknown one."""
    path = tmp_path / "typo.yaml"
    path.write_text(real.read_text().rstrip("\n") + "\ncolour: green\n")
    with pytest.raises(error) as info:
        load(str(path))
    head, *fields = str(info.value).splitlines()
    assert head == f"{path}: invalid {KINDS[name]}"
    assert fields[0].startswith("  colour: unknown key: remove it or check its spelling (accepted: ")
    path.write_text("- a list\n- not a mapping\n")
    with pytest.raises(error, match=rf"typo\.yaml: a {KINDS[name]} must be a mapping of fields, got list"):
        load(str(path))
