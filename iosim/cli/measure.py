"""``iosim measure``: run iosim's kernels (and torch SDPA's) under Nsight Compute; bytes per boundary and time."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..units import fmt_bytes


@click.command("measure")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    default=("flash2", "naive"),
    show_default=True,
    type=click.Choice(["flash2", "naive", "sdpa-flash", "sdpa-cudnn", "copy"]),
    help="what to run (repeat the flag for several)",
)
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--heads", type=int, default=1, show_default=True)
@click.option("--kv-heads", type=int, default=None, help="grouped-query K/V heads; default = heads")
@click.option("--seq-len", type=int, default=4096, show_default=True)
@click.option("--kv-len", type=int, default=None)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--dtype", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True)
@click.option("--causal", is_flag=True)
@click.option("--block-q", type=int, default=None, help="flash2 Br (with --block-kv)")
@click.option("--block-kv", type=int, default=None, help="flash2 Bc (with --block-q)")
@click.option("--copy-bytes", type=int, default=64 << 20, show_default=True, help="size of the copy probe")
@click.option(
    "--sweep",
    "sweep_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="JSON list of configs (fields of iosim.measure.Config) instead of the flags above",
)
@click.option(
    "--ncu", default=None, help="path of the ncu executable [default: found on PATH or /opt/nvidia]"
)
@click.option("--no-timing", is_flag=True, help="skip the CUDA-event timing pass")
@click.option(
    "--json", "json_out", type=click.Path(dir_okay=False), default=None, help="write the full JSON here"
)
@click.option(
    "--csv", "csv_out", type=click.Path(dir_okay=False), default=None, help="write one CSV row per config"
)
@click.option("--ncu-csv", type=click.Path(dir_okay=False), default=None, help="keep ncu's raw CSV here")
def measure_cmd(
    kinds,
    batch,
    heads,
    kv_heads,
    seq_len,
    kv_len,
    head_dim,
    dtype,
    causal,
    block_q,
    block_kv,
    copy_bytes,
    sweep_file,
    ncu,
    no_timing,
    json_out,
    csv_out,
    ncu_csv,
):
    """Measure DRAM bytes, SM->L2 bytes, shared-memory wavefronts and time of attention kernels on this GPU.

    Runs under `ncu --clock-control none` with L2 flushed before each kernel (ncu's default); time for throughput
    is the median of CUDA-event timings outside the profiler. Decimal units (1 MB = 10^6 B)."""
    from ..measure import Config, MeasureError, measure, to_csv

    try:
        if sweep_file:
            configs = [Config(**c) for c in json.loads(Path(sweep_file).read_text())]
        else:
            configs = []
            for k in kinds:
                if k == "copy":
                    configs.append(Config("copy", nbytes=copy_bytes))
                else:
                    configs.append(
                        Config(
                            k,
                            seq_len=seq_len,
                            heads=heads,
                            kv_heads=kv_heads,
                            batch=batch,
                            kv_len=kv_len,
                            head_dim=head_dim,
                            dtype=dtype,
                            causal=causal,
                            block_q=block_q if k == "flash2" else None,
                            block_kv=block_kv if k == "flash2" else None,
                        )
                    )
        run = measure(configs, ncu=ncu, timing=not no_timing, keep_csv=ncu_csv)
        if json_out:
            Path(json_out).write_text(json.dumps(run.to_json(), indent=1))
        if csv_out:
            Path(csv_out).write_text(to_csv(run))
        click.echo(
            f"device: {run.device.get('name')} ({run.device.get('sm_count')} SMs, L2 {run.device.get('l2_bytes'):,} B)"
        )
        click.echo(
            f"{'kind':<11}{'N':>7}{'H':>4}{'d':>5} {'DRAM rd':>10}{'DRAM wr':>10}{'L2 rd':>10}{'L2 wr':>10}"
            f"{'ncu us':>9}{'event ms':>10}"
        )
        for e in run.configs:
            c, m = e["config"], e.get("measured") or {}

            def b(x):
                return fmt_bytes(x) if isinstance(x, int) else "-"

            click.echo(
                f"{c['kind']:<11}{c['seq_len']:>7}{c['heads']:>4}{c['head_dim']:>5} {b(m.get('dram_read_bytes')):>10}"
                f"{b(m.get('dram_write_bytes')):>10}{b(m.get('l2_read_bytes')):>10}{b(m.get('l2_write_bytes')):>10}"
                f"{(m.get('duration_ns') or 0) / 1e3:>9.1f}{e.get('time_ms') or float('nan'):>10.3f}"
                + (f"  error: {e['error']}" if e.get("error") else "")
            )

    except MeasureError as exc:  # no GPU, no ncu, counters not permitted: one line, exit 2
        raise click.ClickException(str(exc)) from None


COMMANDS = [measure_cmd]
