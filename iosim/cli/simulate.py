"""``iosim simulate``: counts, FLOPs and predicted time of one schedule on one problem."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager, nullcontext
from decimal import Decimal, InvalidOperation

import click

try:  # numba compiles the L2 model on the first run after an install; say so instead of hanging silently
    from numba.core import event as numba_event
except ImportError:  # pragma: no cover (numba is a dependency; the L2 model has a pure-Python fallback)
    numba_event = None

from ..hardware.cpu import get_cpu_profile, is_cpu_profile
from ..problem import AttentionProblem
from ..schedules import SCHEDULES
from ..simulate import Result, simulate
from ..simulate_cpu import simulate_cpu
from ..units import fmt_bytes, fmt_rate, fmt_seconds
from .progress import ProgressBar


class WholeNumber(click.ParamType):
    """A size flag: digits (``1_048_576`` too) or an exact power of ten (``1e6``); the problem checks the range."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip().replace("_", "")
        try:
            d = Decimal(text)
        except InvalidOperation:
            d = None
        if d is None or not d.is_finite() or d != d.to_integral_value():
            self.fail(f"{value!r} is not a whole number: write digits, e.g. 4096 or 1_048_576", param, ctx)
        if d.adjusted() > 30:  # refused here, before Python builds a gigantic int
            self.fail(f"{value!r} is far larger than any size iosim takes (at most 2^31 tokens, 2^50 bytes)",
                      param, ctx)
        return int(d)


COUNT = WholeNumber()


class Lengths(click.ParamType):
    """Whole numbers separated by commas (``8192,4096,17``): the keys of each sequence of a ragged batch."""

    name = "n,n,..."

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        parts = [x for x in str(value).replace(" ", "").split(",") if x]
        if not parts:
            self.fail(f"{value!r}: expected the keys of each sequence, e.g. 8192,4096,17", param, ctx)
        return [COUNT.convert(x, param, ctx) for x in parts]


class Window(click.ParamType):
    """A sliding window ``LEFT,RIGHT`` (FlashAttention's window_size): whole numbers, or ``none`` for no bound."""

    name = "left,right"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).replace(" ", "").split(",")
        if len(parts) != 2:
            self.fail(f"{value!r}: expected LEFT,RIGHT, e.g. 4095,0 (a causal window of 4096 keys) or none,3",
                      param, ctx)
        return tuple(None if x.lower() in ("none", "") else COUNT.convert(x, param, ctx) for x in parts)


class SeqLens(click.ParamType):
    """Packed sequences separated by commas, each ``N`` (self-attention: N queries and N keys) or ``Q:K``
    (``512:4096,1024:8192``: chunks of new tokens against the keys in a cache)."""

    name = "n|q:k,..."

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        out = []
        for part in (x for x in str(value).replace(" ", "").split(",") if x):
            sides = part.split(":")
            if len(sides) not in (1, 2):
                self.fail(f"{part!r}: expected N or Q:K (queries:keys), e.g. 512:4096", param, ctx)
            q, k = (COUNT.convert(x, param, ctx) for x in (sides * 2)[:2]) if len(sides) == 1 else \
                (COUNT.convert(x, param, ctx) for x in sides)
            out.append((q, k))
        if not out:
            self.fail(f"{value!r}: expected each sequence's length, e.g. 512:4096,1024:8192", param, ctx)
        return out


def problem_options(f):
    """The attention-problem flags, shared by every command that takes a problem."""
    opts = [
        click.option("--batch", type=COUNT, default=1, show_default=True, help="batch size"),
        click.option("--heads", type=COUNT, default=1, show_default=True, help="query heads"),
        click.option("--kv-heads", type=COUNT, default=None, help="key/value heads (grouped-query); default = heads"),
        click.option("--seq-len", type=COUNT, required=True, help="query length N"),
        click.option("--kv-len", type=COUNT, default=None, help="key/value length; default = seq-len"),
        click.option("--head-dim", type=COUNT, default=128, show_default=True, help="head dimension d"),
        click.option("--dtype", type=click.Choice(["fp16", "bf16", "fp32", "fp8"]), default="fp16", show_default=True,
                     help="element type of Q, K, V, O (fp8 = e4m3)"),
        click.option("--causal", is_flag=True, help="causal mask, aligned bottom-right when kv-len != seq-len"),
        click.option("--scale", type=float, default=None, help="softmax scale; default 1/sqrt(head-dim)"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("simulate")
@click.argument("schedule", type=click.Choice(list(SCHEDULES)))
@click.option("--profile", default=None, help="built-in profile name or a .yaml/.json file [default: h100-sxm5-80gb]")
@problem_options
@click.option("--block-q", type=COUNT, default=None, help="Br: query rows per tile")
@click.option("--block-kv", type=COUNT, default=None, help="Bc: key/value rows per tile")
@click.option("--method", type=click.Choice(["closed", "walk"]), default="closed", show_default=True,
              help="closed form (fast) or a walk of the tile program (same numbers, slower)")
@click.option("--pass", "pass_", type=click.Choice(["forward", "backward", "both"]), default="forward",
              show_default=True, help="forward, backward (consumes the forward's O and statistics), or both")
@click.option("--splits", type=COUNT, default=None,
              help="flash-decoding: K/V splits [default: chosen from the profile's SM count]")
@click.option("--kv-lens", type=Lengths(), default=None,
              help="flash-decoding --kernel iosim-decode: keys of each sequence, comma-separated, one per sequence, "
                   "each at most --kv-len (a ragged batch) [default: every sequence --kv-len long]")
@click.option("--page-size", type=COUNT, default=None,
              help="flash-decoding --kernel iosim-decode: tokens per page of a paged KV cache, a multiple of 16; "
                   "flash2 with --seqlens: the sequences' keys in a paged cache (chunked prefill), any size "
                   "[default: a contiguous cache]")
@click.option("--kv-dtype", type=click.Choice(["fp8"]), default=None,
              help="flash-decoding --kernel iosim-decode: the KV cache in fp8 (e4m3, a scale per kv head; Q and O in "
                   "--dtype) [default: the cache in --dtype]")
@click.option("--seqlens", type=SeqLens(), default=None,
              help="flash2, flash3 forward: packed sequences (varlen), comma-separated, each N or Q:K (queries:keys); "
                   "the problem is batch 1 of their totals (--seq-len, --kv-len) [default: the dense batch]")
@click.option("--density", type=float, default=None,
              help="block-sparse: fraction of non-zero blocks of a drawn mask [default: 1]")
@click.option("--mask", type=click.Path(exists=True, dir_okay=False), default=None,
              help="block-sparse: block mask file (.npy, or text: one row of 0/1 per Q block)")
@click.option("--seed", type=int, default=None, help="block-sparse: seed of the drawn mask [default: 0]")
@click.option("--gqa", type=click.Choice(["expand", "grouped"]), default=None,
              help="flash2 --pass backward/both, grouped-query heads: expand (FlashAttention-2: dK, dV per query head, "
                   "then a group-sum kernel) or grouped (iosim's kernel: K, V loaded once per kv head) [default: expand]")
@click.option("--window", type=Window(), default=None,
              help="flash2, flash3 forward: a sliding window LEFT,RIGHT (FlashAttention's window_size: query i sees "
                   "keys i+off-LEFT .. i+off+RIGHT, none for no bound; with --causal RIGHT is 0) [default: none]")
@click.option("--l2/--no-l2", "use_l2", default=True, show_default=True,
              help="hbm from the L2 model (LRU, L2 flushed before each kernel as Nsight Compute does); "
                   "--no-l2: hbm = global, the papers' two-level view")
@click.option("--l2-exact", is_flag=True,
              help="walk every tile access in the L2 model (slow for long sequences); by default large problems "
                   "walk a few heads and skip steady K/V windows (within 1% of the full walk)")
@click.option("--kernel", default=None,
              help="whose launch and pipeline the time model assumes: iosim-flash2, iosim-naive, fa2, fa3, cudnn, "
                   "iosim-decode (flash-decoding as iosim's decode kernel tiles it) or a YAML file (docs/timing.md) "
                   "[default: the schedule's own]; its tiles unless --block-q/--block-kv")
@click.option("--warm", is_flag=True, help="time back-to-back calls on the same inputs (tensors that fit stay in L2)")
@click.option("--run", "run", default="record", show_default=True, metavar="record|single|steady|SECONDS",
              help="which call of a run of back-to-back calls the time means, under the board's power limiter: the "
                   "time records' median of 20 (record), one call from rest (single), a call of a long run "
                   "(steady), or the mean call of a run of SECONDS (docs/timing.md)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (the public contract, docs/json.md)")
def simulate_cmd(schedule, profile, block_q, block_kv, method, pass_, splits, density, mask, seed, use_l2, as_json,
                 l2_exact=False, kernel=None, warm=False, gqa=None, kv_lens=None, page_size=None, kv_dtype=None,
                 window=None, seqlens=None, run="record", **problem_kw):
    """Count the bytes SCHEDULE moves at each memory boundary, its FLOPs and its predicted time.

    With a CPU profile (``iosim profiles list``, or a file with ``kind: cpu``), the boundaries are the CPU's
    DRAM, L3 and L2 (naive and flash2; docs/cpu.md)."""
    problem = AttentionProblem.make(**problem_kw)  # the options of problem_options, by the fields' names
    if profile is not None and is_cpu_profile(profile):
        gpu_only = {"--method walk": method != "closed", "--pass": pass_ != "forward", "--splits": splits,
                    "--density": density, "--mask": mask, "--seed": seed, "--l2-exact": l2_exact, "--kernel": kernel,
                    "--warm": warm, "--gqa": gqa, "--kv-lens": kv_lens, "--page-size": page_size, "--kv-dtype": kv_dtype,
                    "--window": window,
                    "--seqlens": seqlens, "--run": run != "record"}
        given = [k for k, v in gpu_only.items() if v]
        if given:
            raise click.UsageError(f"{', '.join(given)}: not for a CPU profile ({profile}); the CPU model takes the "
                                   "forward pass of naive or flash2, its tiles and the problem")
        r = simulate_cpu(schedule, problem, get_cpu_profile(profile), block_q, block_kv)
        click.echo(r.to_json() if as_json else r.describe())
        return
    with compile_notice(), _l2_bar(use_l2) as bar:
        result = simulate(schedule, problem, profile, block_q=block_q, block_kv=block_kv, method=method,
                          pass_=pass_, splits=splits, density=density, mask=mask, seed=seed, gqa=gqa, l2=use_l2,
                          l2_exact=l2_exact, l2_progress=bar, kernel=kernel, warm=warm, kv_lens=kv_lens,
                          page_size=page_size, kv_dtype=kv_dtype, window=window, seqlens=seqlens, run=run)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(render(result))


@contextmanager
def compile_notice():
    """While inside, the first numba compilation prints one line on stderr. numba caches what it compiles
    (``cache=True`` in iosim/l2/_jit.py, which iosim/timing/_fluid.py uses too), so this happens on the first run
    after an install, never again:
    with an empty NUMBA_CACHE_DIR, 6.6 s of compiling (5.9 s of it the L2 model's round loop, ``run_kernel``)
    then 0.5 s for the next run, on an idle 2-core machine; issue 20 saw ~30 s. Other commands may use it too."""
    if numba_event is None:
        yield
        return
    with numba_event.install_listener("numba:compile", _CompileNotice()):
        yield


if numba_event is not None:
    class _CompileNotice(numba_event.Listener):
        def __init__(self):
            self.said = False

        def on_start(self, event):
            if not self.said:
                self.said = True
                click.echo("iosim: compiling the L2 model and the decode model's walk with numba, once per install "
                           "(cached for later runs; "
                           "this first run takes a few seconds to half a minute longer)", err=True)

        def on_end(self, event):
            pass


def _l2_bar(use_l2: bool):
    """The L2 model's progress bar on stderr (shown once a run passes ~1.5 s), where a terminal shows it."""
    return ProgressBar() if use_l2 and sys.stderr.isatty() else nullcontext()


def render(r: Result) -> str:
    """A readable table (decimal units: 1 MB = 10^6 B)."""
    j = r.to_json()

    def describe(t) -> str:
        if t.block_q is None:
            return "untiled (each GEMM reads its operands once)"
        extra = t.describe_options()
        lens = extra.get("kv_lens")
        if lens is not None and len(lens) > 8:  # a long batch: its size and range
            extra["kv_lens"] = f"{len(lens)} sequences of {min(lens)}-{max(lens)} keys"
        return (f"block_q={t.block_q}, block_kv={t.block_kv}"
                + (f" (M = {t.sram_elements} elements)" if t.sram_elements else "")
                + "".join(f", {k}={v}" for k, v in extra.items()))

    by_pass = r.tiles_by_pass or {r.pass_: r.tiles}
    tiles = describe(r.tiles) if len(by_pass) == 1 else "; ".join(f"{ps}: {describe(t)}" for ps, t in by_pass.items())
    lines = [
        f"{r.schedule} on {r.profile.display_name} ({r.profile.name})"
        + ("" if r.pass_ == "forward" else f", {'forward + backward' if r.pass_ == 'both' else 'backward'} pass"),
        f"problem: {r.problem.describe()}",
        f"tiles:   {tiles}",
        "",
        f"{'boundary':<10}{'read':>14}{'write':>14}{'total':>14}",
    ]
    for b in ("global", "hbm", "sram"):
        rd, wr = j["traffic"][b]["read_bytes"], j["traffic"][b]["write_bytes"]
        lines.append(f"{b:<10}{fmt_bytes(rd):>14}{fmt_bytes(wr):>14}{fmt_bytes(rd + wr):>14}")
    lines += ["", f"{'tensor':<10}{'global read':>14}{'global write':>14}"]
    for t, v in j["by_tensor"].items():
        lines.append(f"{t:<10}{fmt_bytes(v['global_read_bytes']):>14}{fmt_bytes(v['global_write_bytes']):>14}")
    f = j["flops"]
    lines += [
        "",
        f"FLOPs: {fmt_rate(f['total'], 'FLOP')} (matmul {fmt_rate(f['matmul'], 'FLOP')}, "
        f"exp {fmt_rate(f['exp'], 'FLOP')}, other {fmt_rate(f['other'], 'FLOP')})",
        "on-chip per thread block: "
        + (f"{j['sram_peak_bytes']:,} B = shared memory {j['sram_shared_bytes']:,} of {j['sram_budget_bytes']:,} B"
           f" + registers {j['sram_register_bytes']:,} of {j['register_budget_bytes'] or 0:,} B"
           if j["sram_peak_bytes"] is not None else "n/a (untiled)"),
        f"predicted time: {fmt_seconds(j['time']['predicted_s'])}{_band(j['time'].get('uncertainty'))}, "
        f"bound by {j['time']['bound']}"
        + (f", arithmetic intensity {j['time']['arithmetic_intensity']:.1f} FLOP/B (hbm)"
           if j["time"]["arithmetic_intensity"] else ""),
        f"  kernel {j['time']['kernel']}, rates {j['time']['calibration']}; peak roofline "
        f"{fmt_seconds(j['time']['roofline_s'])}",
    ]
    if j["time"].get("clock"):
        lines.append(_clock_line(j["time"]["clock"]))
    if j["time"].get("energy_j") is not None:
        e = j["time"]["energy_j"]
        lines.append(f"predicted energy: {e:.4g} J a call ({e / j['time']['predicted_s']:.0f} W on average): the "
                     "work units calibration.power prices at the call's clock, median |error| 2-10% against NVML "
                     "(docs/timing.md, Energy per call)")
    if j["time"]["unmodeled"]:
        lines.append("  not in the roofline (unpublished in the profile): "
                     + ", ".join(f"{r} ({f})" for r, f in j["time"]["unmodeled"].items()))
    lines += _kernel_rows(j["time"]["kernels"])
    if r.warm:
        why = ("the inputs stay in L2: the time prices no DRAM bytes (hbm above: a cold L2)" if r.time.dram_free
               else "the peak roofline has no warm model" if r.time.kernel == "roofline"
               else "the inputs do not stay in L2")
        lines.append(f"  warm calls: {why}" + ("" if r.time.dram_free else "; the time prices the hbm bytes above"))
    lines.append(f"(decimal units: 1 MB = 10^6 B; hbm model: {r.hbm_model})")
    return "\n".join(lines)


def _clock_line(c: dict) -> str:
    """The clocks under the power limiter, e.g. "  clock: 1.78 GHz from rest (1036 W), 1.57 GHz from 68 ms (the
    fast loop's cap), 1.48 GHz from 0.80 s (the 700 W limit); this call (record): 100% at 1.57 GHz"."""
    if c["fast_hz"] == c["start_hz"] and c["settle_s"] is None:
        return (f"  clock under the power limiter: {fmt_rate(c['start_hz'], 'Hz')} throughout (the call draws "
                f"{c['watts']:.0f} W there, under what the limiter allows)")
    phases = [f"{fmt_rate(c['start_hz'], 'Hz')} from rest ({c['watts']:.0f} W)",
              f"{fmt_rate(c['fast_hz'], 'Hz')} from {fmt_seconds(c['engage_s'])}"]
    if c["settle_s"] is not None:
        phases.append(f"{fmt_rate(c['steady_hz'], 'Hz')} from {fmt_seconds(c['settle_s'])} (the board's limit)")
    at = ", ".join(f"{s:.0%} at {fmt_rate(f, 'Hz')}" for s, f in zip(c["shares"], (c["start_hz"], c["fast_hz"],
                                                                                c["steady_hz"]), strict=True) if s)
    return f"  clock under the power limiter: {', '.join(phases)}; the time's calls ({c['run']}): {at}"


def _band(u: dict | None) -> str:
    """The records' band around the predicted time, e.g. " (band 38.94 us to 47.54 us: 10th-90th percentile of
    measured ÷ predicted over 16 rows of fa2, causal, h100-sxm5-80gb record)", or why there is none."""
    if not u:
        return ""
    if u["low_s"] is None:
        return f" (no band: {u['group']})"
    pooled = u["device"].startswith("pooled")
    src = f"records {u['device']}" if pooled else f"{u['device']} record"
    return (f" (band {fmt_seconds(u['low_s'])} to {fmt_seconds(u['high_s'])}: 10th-90th percentile of measured ÷ "
            f"predicted over {u['rows']} rows of {u['group']}, {src})")


def _kernel_rows(kernels: list[dict]) -> list[str]:
    """One aligned row per kernel: every column as wide as its longest entry (long names, huge grids)."""
    rows = [(k["name"], f"{k['grid']:,}", fmt_seconds(k["predicted_s"]), k["bound"], f"{k['utilization']:.0%}")
            for k in kernels]
    if not rows:
        return []
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    return [f"  {n:<{w[0]}}  grid {g:>{w[1]}}  {t:>{w[2]}}  {b:<{w[3]}}  utilization {u:>{w[4]}}"
            for n, g, t, b, u in rows]
