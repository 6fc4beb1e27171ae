"""``iosim measure``: run iosim's kernels (and torch SDPA's) under Nsight Compute; bytes per boundary and time."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..measure import ATTENTION_KINDS, Attention, MeasureError, Options, from_dict, measure, to_csv
from ..units import fmt_bytes


def _b(x) -> str:
    return fmt_bytes(x) if isinstance(x, int) else "-"


def _print(record) -> None:
    d = record.device
    click.echo(f"device: {d.get('name')} ({d.get('sm_count')} SMs, L2 {d.get('l2_bytes'):,} B)")
    click.echo(f"{'kind':<11}{'N':>7}{'H':>4}{'d':>5} {'DRAM rd':>10}{'DRAM wr':>10}{'L2 rd':>10}{'L2 wr':>10}"
               f"{'ncu us':>9}{'event ms':>10}")
    for e in record.entries:
        r, m = e["run"], e.get("measured") or {}
        click.echo(f"{r['kind']:<11}{r.get('seq_len', '-'):>7}{r.get('heads', '-'):>4}{r.get('head_dim', '-'):>5} "
                   f"{_b(m.get('dram_read_bytes')):>10}{_b(m.get('dram_write_bytes')):>10}"
                   f"{_b(m.get('l2_read_bytes')):>10}{_b(m.get('l2_write_bytes')):>10}"
                   f"{(m.get('duration_ns') or 0) / 1e3:>9.1f}{e.get('time_ms') or float('nan'):>10.3f}"
                   + (f"  error: {e['error']}" if e.get("error") else ""))


@click.command("measure")
@click.option("--kind", "kinds", multiple=True, default=("flash2", "naive"), show_default=True,
              type=click.Choice(list(ATTENTION_KINDS)), help="what to run (repeat the flag for several)")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--heads", type=int, default=1, show_default=True)
@click.option("--kv-heads", type=int, default=None, help="grouped-query K/V heads; default = heads")
@click.option("--seq-len", type=int, default=4096, show_default=True)
@click.option("--kv-len", type=int, default=None)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "fp8"]), default="fp16", show_default=True,
              help="fp8: the kinds flash3-fp8 and fp8-quantize (inputs drawn in bf16, block-quantized)")
@click.option("--causal", is_flag=True)
@click.option("--block-q", type=int, default=None, help="flash2 Br (with --block-kv)")
@click.option("--block-kv", type=int, default=None, help="flash2 Bc (with --block-q)")
@click.option("--runs", "runs_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSON list of runs (iosim.measure.to_dict: attention kinds and probes) instead of the flags")
@click.option("--repeat", type=int, default=1, show_default=True, help="launch the list this many times over")
@click.option("--ncu", default=None, help="path of the ncu executable [default: found on PATH or /opt/nvidia]")
@click.option("--no-timing", is_flag=True, help="skip the CUDA-event timing pass")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="write the full record")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), default=None, help="one CSV row per run")
@click.option("--ncu-csv", type=click.Path(dir_okay=False), default=None, help="keep ncu's raw CSV here")
def measure_cmd(kinds, batch, heads, kv_heads, seq_len, kv_len, head_dim, dtype, causal, block_q, block_kv,
                runs_file, repeat, ncu, no_timing, json_out, csv_out, ncu_csv):
    """Measure DRAM bytes, SM->L2 bytes, shared-memory wavefronts and time of attention kernels on this GPU.

    Runs under `ncu --clock-control none` with L2 flushed before each kernel (ncu's default); time for throughput
    is the median of CUDA-event timings outside the profiler. Decimal units (1 MB = 10^6 B)."""
    try:
        if runs_file:
            runs = [from_dict(d) for d in json.loads(Path(runs_file).read_text())]
        else:
            runs = [Attention(k, seq_len=seq_len, heads=heads, kv_heads=kv_heads, batch=batch, kv_len=kv_len,
                              head_dim=head_dim, dtype=dtype, causal=causal,
                              block_q=block_q if k == "flash2" else None, block_kv=block_kv if k == "flash2" else None)
                    for k in kinds]
        record = measure(runs * repeat, Options(ncu=ncu, timing=not no_timing, keep_csv=ncu_csv))
    except MeasureError as exc:  # no GPU, no ncu, counters not permitted, a bad run: one line
        raise click.ClickException(str(exc)) from None
    if json_out:
        Path(json_out).write_text(json.dumps(record.to_json(), indent=1))
    if csv_out:
        Path(csv_out).write_text(to_csv(record))
    _print(record)


