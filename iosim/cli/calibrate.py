"""``iosim calibrate``: the L2 model's probe-derived profile values, from recorded data or measured here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
import numpy as np

from ..calibrate import (
    CALIBRATION_PROBES,
    TIMELINE_RUNS,
    CalibrationError,
    block_share,
    fit_room,
    probe_cases,
)
from ..calibrate.decode_tile import decode_part
from ..calibrate.device import device_facts, guess_profile
from ..calibrate.power import measure_power_only
from ..calibrate.rates import (
    RatesError,
    calibration_section,
    measure_rates,
    measured_on,
    steps_part,
    with_part,
    write_calibrated,
)
from ..calibrate.rates_kernels import measure_only
from ..gpu import GPUUnavailableError
from ..gpu._cupy import require_cupy
from ..hardware.gpu import get_profile
from ..measure import MeasureError, Options, measure
from ..measure.records import merge_repeats, read_member, read_records
from ..measure.timeline import block_timeline


@click.group("calibrate")
def calibrate():
    """Derive profile values from measurements (l2.room, l2.dirty_at_start, sm.block_share; rates: calibration)."""


@calibrate.command("l2")
@click.argument("record", required=False, type=click.Path(exists=True))
@click.option("--profile", default="h200-sxm-141gb", show_default=True, help="profile whose L2 and SMs to model")
@click.option("--measure", "do_measure", is_flag=True, help="measure the probes on this GPU first (ncu)")
@click.option("--repeat", type=int, default=3, show_default=True, help="with --measure: launches of each probe")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="write the measured record")
def l2_cmd(record, profile, do_measure, repeat, json_out):
    """l2.room and l2.dirty_at_start from the probes' DRAM bytes.

    RECORD: measured_*.json, a folder or a .tar.xz of them (e.g. data/validation/h200-probes.tar.xz); the 45
    room candidates take about 4 minutes on the 43 probes."""
    try:
        if do_measure:
            rec = measure(list(CALIBRATION_PROBES) * repeat, Options(timing=False)).to_json()
            if json_out:
                Path(json_out).write_text(json.dumps(rec, indent=1))
            records = {"probes": rec}
        elif record:
            records = read_records(record)
        else:
            raise click.UsageError("give a RECORD, or --measure on a GPU")
        cases = probe_cases([m for data in records.values() for m in merge_repeats(data)])
        fit = fit_room(cases, profile)
    except (MeasureError, CalibrationError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(cases)} probes ({sum(c.interleave for c in cases)} interleaved); model: {profile}")
    click.echo(f"l2.dirty_at_start: {fit.dirty_at_start} B (mean DRAM writes of the read probes >= 48 MiB)")
    for err, room in fit.tried[:5]:
        click.echo(f"  room private {room[0]}, shared {room[1]}, dirty {room[2]}: misfit {err:.1f} MB^2")
    r = fit.room
    click.echo(f"l2.room: {{private: {r[0]}, shared: {r[1]}, dirty: {r[2]}}} (misfit {fit.misfit:.1f} MB^2)")


def _timelines(paths: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """(name, (start, end, sm)) of every timeline in ``paths`` (.npz files, or .tar.xz archives of them)."""
    out = []
    for p in paths:
        blobs = read_member(p, ".npz") if not p.endswith(".npz") else {Path(p).name: Path(p).read_bytes()}
        for name, blob in sorted(blobs.items()):
            z = np.load(io.BytesIO(blob))
            if json.loads(str(z["config"])).get("causal"):
                continue  # unequal work per block: shares cannot be read from durations
            out.append((name, (z["start_ns"], z["end_ns"], z["sm"])))
    return out


@calibrate.command("block-share")
@click.argument("timelines", nargs=-1, type=click.Path(exists=True))
@click.option("--measure", "do_measure", is_flag=True, help="record flash2's block timelines on this GPU first")
def block_share_cmd(timelines, do_measure):
    """sm.block_share from flash2 block timelines (TIMELINES: .npz files or a .tar.xz of them)."""
    try:
        if do_measure:
            found = []
            for run in TIMELINE_RUNS:
                t = block_timeline(run)
                found.append((f"N{run.seq_len}_H{run.heads}", (t.start_ns, t.end_ns, t.sm)))
        else:
            found = _timelines(timelines)
        if not found:
            raise CalibrationError("no block timeline of flash2 without a mask given (or --measure)")
        shares = [(name, block_share(*t)) for name, t in found]
    except (MeasureError, CalibrationError) as exc:
        raise click.ClickException(str(exc)) from None
    for name, b in shares:
        click.echo(f"  {name}: {b:.4f}")
    click.echo(f"sm.block_share: {np.median([b for _, b in shares]):.3f} (median of {len(shares)})")


@calibrate.command("rates")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="profile file to write (.yaml or .json)  [default: BASE-calibrated.yaml here]")
@click.option("--profile", "base", default=None,
              help="base profile, a built-in name or a file  [default: the built-in named like this GPU]")
@click.option("--repeats", type=click.IntRange(10, 1000), default=15, show_default=True,
              help="timed launches per quantity (their median is kept)")
@click.option("--power-only", is_flag=True,
              help="measure the power section only (NVML) and put it into the base profile's calibration section")
@click.option("--decode-only", is_flag=True,
              help="measure the decode section only (iosim's decode kernels: tiles, fixed parts, combine rounds) and "
                   "put it into the base profile's calibration section")
@click.option("--steps-only", is_flag=True,
              help="measure the forward and backward sections only (the steps of iosim's flash2 forward, dense, "
                   "varlen and paged, and flash3 forward, the naive kernels' rounds and softmax streaming, the steps "
                   "of the backward kernels and, where torch runs here, of torch's FlashAttention-2 forward (plain, "
                   "masked and split-KV) and backward and cuDNN's backward and, with cudnn-frontend, cuDNN's fp8 "
                   "forward) and put them into the base profile's calibration section")
def rates_cmd(output, base, repeats, power_only, decode_only, steps_only):
    """Measure what code reaches on this GPU (mma.sync, wgmma, exp, fp32, shared memory, L2, DRAM, launch costs,
    iosim's decode kernels' tiles, fixed parts and combine rounds, the forward and backward kernels' steps, power and
    energy per unit of work) with kernels of our own, and write a copy of the base profile with them as its calibration
    section."""
    if power_only + decode_only + steps_only > 1:
        raise click.UsageError("--power-only, --decode-only and --steps-only each measure one part: give one")
    try:
        dev = device_facts(require_cupy())
        base = base or guess_profile(dev["device"])
        get_profile(base)  # a bad --profile fails before any GPU work
        out = output or f"{Path(base).stem}-calibrated.yaml"
        click.echo(f"base profile {base}; writing {out}")
        cmd = (f"iosim calibrate rates -o {out} --profile {base}" + (f" --repeats {repeats}" if repeats != 15 else "")
               + (" --power-only" if power_only else "") + (" --decode-only" if decode_only else "")
               + (" --steps-only" if steps_only else ""))
        if power_only:
            section = with_part(base, measure_power_only(repeats, click.echo), measured_on(dev, cmd), "power")
        elif decode_only:
            section = with_part(base, measure_only(decode_part, repeats, click.echo), measured_on(dev, cmd),
                                "decode")
        elif steps_only:
            section = with_part(base, measure_only(steps_part, repeats, click.echo), measured_on(dev, cmd),
                                "forward", "backward")
        else:
            measured = measure_rates(repeats, click.echo, dev)
            section = calibration_section(measured, measured_on(dev, cmd), dev["hopper"])
        profile = write_calibrated(base, section, out)
    except (GPUUnavailableError, RatesError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out}: {profile.name}, {profile.calibration_label()}")


