"""``iosim profiles list | show NAME|FILE | validate FILE...``."""

from __future__ import annotations

import sys

import click
import yaml

from ..cpu.detect import detect_profile
from ..hardware.cpu import (
    builtin_cpu_profile_names,
    get_cpu_profile,
    is_cpu_profile,
    is_cpu_profile_file,
    load_cpu_profile_file,
)
from ..hardware.gpu import (
    DEFAULT_PROFILE,
    ProfileError,
    builtin_profile_names,
    get_profile,
    load_profile_file,
)
from ..units import fmt_bytes, fmt_rate


@click.group("profiles")
def profiles():
    """Hardware profiles: built-in ones, or your own YAML/JSON files."""


@profiles.command("list")
def list_cmd():
    """List the built-in profiles: GPUs, then CPUs."""
    click.echo(f"{'name':<18}{'SMs':>5}{'DRAM BW':>13}{'L2':>11}{'smem/block':>12}{'bf16 dense':>15}  display name")
    for name in builtin_profile_names():
        p = get_profile(name)
        v = lambda q: q.value  # noqa: E731

        def show(x, f):
            return "n/a" if x is None else f(x)

        mark = " (default)" if name == DEFAULT_PROFILE else ""
        click.echo(
            f"{name:<18}{show(v(p.sm_count), str):>5}{show(v(p.dram.bandwidth), lambda x: fmt_rate(x, 'B/s')):>13}"
            f"{show(v(p.l2.capacity), fmt_bytes):>11}{show(v(p.smem.per_block), fmt_bytes):>12}"
            f"{show(v(p.compute.tensor.bf16), lambda x: fmt_rate(x, 'FLOP/s')):>15}  {p.display_name}{mark}"
        )
    click.echo("\nCPUs (iosim simulate --profile NAME; `iosim profiles detect` builds one for this machine):")
    for name in builtin_cpu_profile_names():
        click.echo(f"  {name:<24}{get_cpu_profile(name).display_name}")


@profiles.command("show")
@click.argument("name_or_file")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of YAML")
def show_cmd(name_or_file, as_json):
    """Print a profile (built-in NAME or FILE, GPU or CPU) with every number and its source."""
    p = get_cpu_profile(name_or_file) if is_cpu_profile(name_or_file) else get_profile(name_or_file)
    data = p.model_dump(mode="json")
    if as_json:
        click.echo(p.model_dump_json(indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, width=120))


@profiles.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate_cmd(files):
    """Check profile files; print what is wrong with each, field by field. Exit 2 if any is invalid."""
    bad = 0
    for f in files:
        try:
            p = load_cpu_profile_file(f) if is_cpu_profile_file(f) else load_profile_file(f)
        except ProfileError as exc:
            bad += 1
            click.echo(str(exc), err=True)
        else:
            click.echo(f"{f}: ok ({p.name}: {p.display_name})")
    if bad:
        sys.exit(2)


@profiles.command("detect")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="write the profile here (YAML) instead of printing it")
@click.option("--name", default="this-machine", show_default=True, help="the profile's name")
def detect_cmd(out, name):
    """Build a CPU profile of this machine: cores and caches from the OS (sysfs), DRAM bandwidth, GEMM, exp and
    softmax rates measured for a few seconds. Use it with ``iosim simulate --profile FILE``."""
    click.echo("iosim: measuring this machine (about 10 s)...", err=True)
    text = yaml.safe_dump(detect_profile(name).model_dump(mode="json"), sort_keys=False, width=120)
    if out is None:
        click.echo(text)
    else:
        with open(out, "w") as f:
            f.write(text)
        click.echo(f"wrote {out}", err=True)
