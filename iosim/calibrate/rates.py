"""``iosim calibrate rates``: what code reaches on this GPU, measured by small kernels of our own (kernels/rates.cu),
written into a copy of a profile as its ``calibration`` section (:class:`iosim.hardware.calibration.Calibration`).

Every rate is the median CUDA-event time of ``repeats`` launches after warm-up, each launch sized to about 2 ms, but
shared memory's: bytes per clock64 cycle of each SM (the kernel's own clock, whatever it ran at) times SMs x sm_clock;
latencies are clock64 cycles over one dependent chain of one warp; the SM clock is clock64 cycles over
%globaltimer nanoseconds in the same busy kernels; memory latencies (L2 hit, DRAM) are seconds, from a pointer chase
(:func:`iosim.calibrate.rates_kernels.chase_latency`). :func:`measure_rates` prints each quantity as it completes.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from iosim._version import __version__
from iosim.calibrate.backward_step import backward_part
from iosim.calibrate.cudnn_step import cudnn_part
from iosim.calibrate.decode_tile import decode_part
from iosim.calibrate.device import device_facts
from iosim.calibrate.fa2_step import fa2_part
from iosim.calibrate.forward_step import forward_part
from iosim.calibrate.mla_step import mla_part
from iosim.calibrate.naive_step import naive_part
from iosim.calibrate.power import power_part
from iosim.calibrate.rates_kernels import (
    ALU_UNROLL,
    CHAINS,
    MMA_FLOP,
    SMEM_PER_TRIP,
    SMEM_WARPS,
    Bench,
    Measured,
    RatesError,
    chase_latency,
    fmt_value,
)
from iosim.calibrate.rates_wgmma import wgmma_part
from iosim.gpu._cupy import require_cupy
from iosim.gpu.build_rates import rates_mma_names
from iosim.hardware.gpu import (
    PROFILES_DIR,
    Profile,
    builtin_profile_names,
    profile_from_dict,
    read_profile_data,
)
from iosim.measure.events import BUSY, cupy_clock, time_ms
from iosim.units import fmt_rate
from iosim.yaml_io import parse_data

MMA_WARPS = (1, 2, 4, 8, 16)  # resident warps per SM of the mma.sync table
ALU_OPS = {  # rates_alu op: (path, unit, what; FLOPs per op)
    0: (("fp32", "fma"), "FLOP/s", "fma.rn.f32 (2 FLOPs)"), 1: (("fp32", "add"), "FLOP/s", "add.rn.f32"),
    2: (("fp32", "max"), "op/s", "max.f32 (FMNMX)"), 3: (("exp", "throughput"), "op/s", "ex2.approx.ftz.f32 (MUFU)"),
}
DRAM_BYTES = 4 << 30  # the DRAM buffer (less where the GPU has less free memory)
LAUNCHES = 256  # empty kernels per launch-interval measurement
CALLS = 200  # event-bracketed calls per launch.call measurement
BLOCKS_PER_SM = 512  # tiny blocks per SM of the per-block cost
H100 = "H100/H200 SXM"
EXPECTED = {  # printed beside the measurement: what an H100 or H200 SXM reaches (issue 17), by path prefix
    "sm_clock": "~1.98 GHz boost", "mma_sync.fp16.throughput": "best 600-700 TFLOP/s",
    "mma_sync.bf16.throughput": "best 600-700 TFLOP/s", "wgmma.fp8": "dense peak 1979 TFLOP/s (H100 SXM)",
    "wgmma": "best 750-800 TFLOP/s (dense peak 989)",
    "exp.throughput": "16 /clk/SM", "fp32.fma": "256 FLOP/clk/SM (128 lanes)", "fp32.add": "128 /clk/SM",
    "smem": "128 B/clk/SM", "l2": "8-12 TB/s", "dram.read": "~3.0 TB/s H100, ~4.3 TB/s H200",
    "launch.interval": "2-4 us", "launch.call": "a few us",
    # one dependent load, rough ranges (docs/profiles.md names pointer-chase studies of Hopper)
    "latency.l2": "~200-300 ns (L2 hit)", "latency.dram": "~450-600 ns (HBM)",
}


def calibration_section(measured: list[Measured], on: dict, hopper: bool) -> dict:
    """The ``calibration`` mapping of a profile: measured_on, then each value with its source. A new measurement
    has every group: the memory latencies too (optional in the schema only for files calibrated before them)."""
    missing = {("latency", "l2"), ("latency", "dram")} - {m.path for m in measured}
    if missing:
        raise RatesError(f"the measurement lacks {', '.join('.'.join(p) for p in sorted(missing))}")
    out: dict = {"measured_on": on}
    nest(out, measured, on)
    if not hopper:
        out["wgmma"] = None
    return out


def nest(out: dict, measured: list[Measured], on: dict) -> dict:
    """Each measured value into ``out`` at its path, with its source."""
    prefix = f"measured on {on['device']}, {on['date']}, iosim calibrate rates: "
    for m in measured:
        path = list(m.path)
        key = path.pop() if isinstance(path[-1], int) else None
        node = out
        for part in path:
            node = node.setdefault(part, {})
        if key is None:
            node["value"] = fmt_value(m)
        else:
            node.setdefault("value", {})[key] = fmt_value(m)
        node["source"] = prefix + m.method
    return out


def write_calibrated(base: str, section: dict, path: str | Path) -> Profile:
    """Write profile ``base`` (a built-in name or a file) with ``section`` as its calibration to ``path`` (.yaml,
    or .json); the file is read back and validated. A YAML base without a calibration keeps its text and comments."""
    src = PROFILES_DIR / f"{base}.yaml" if base in builtin_profile_names() else Path(base)
    data, path = read_profile_data(src), Path(path)
    if path.suffix == ".json":
        text = json.dumps({**data, "calibration": section}, indent=1, default=str) + "\n"
    elif src.suffix == ".json" or "calibration" in data:
        text = yaml.safe_dump({**data, "calibration": section}, sort_keys=False, width=200, allow_unicode=True)
    else:
        text = (src.read_text().rstrip("\n") + f"\n# calibration: {section['measured_on']['command']}\n"
                + yaml.safe_dump({"calibration": section}, sort_keys=False, width=200, allow_unicode=True))
    where = f"{path} (as written)"
    profile = profile_from_dict(parse_data(text, where, is_json=path.suffix == ".json", error=RatesError), where)
    path.write_text(text)
    return profile


def with_part(base: str, measured: list[Measured], on: dict, *parts: str) -> dict:
    """The base profile's calibration section with the ``parts`` sections of ``measured`` put in (``--power-only``,
    ``--decode-only``, ``--steps-only``); the other sections keep their values and sources, and a part nothing of
    which could be measured here keeps the base's."""
    what = " and ".join(parts)
    src = PROFILES_DIR / f"{base}.yaml" if base in builtin_profile_names() else Path(base)
    section = read_profile_data(src).get("calibration")
    if not section:
        raise RatesError(f"{what}: profile {base} has no calibration section to add to; run iosim calibrate rates "
                         "without the option")
    nested = nest({}, measured, on)
    if not any(p in nested for p in parts):
        raise RatesError(f"{what}: nothing could be measured on this GPU (see above)")
    return {**section, **{p: nested[p] for p in parts if p in nested}}


def steps_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """The kernels' own steps: iosim's forward kernels (flash2's on any GPU, flash3's on Hopper), cuDNN's forward
    (Hopper), torch's FlashAttention-2 forward, torch's MLA decode attention, the naive schedule's GEMMs, then the
    backward kernels."""
    forward_part(b, cp, report)
    cudnn_part(b, cp, report)
    fa2_part(b, cp, report)
    mla_part(b, cp, report)
    naive_part(b, cp, report)
    backward_part(b, cp, report)


# -- the measurements (CuPy from here on) -------------------------------------------------------------------------


def _compute(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """SM clock, fp32 and exp rates, mma.sync and wgmma tables, latencies."""
    i32, n_alu = cp.int32, 4 * b.sms
    alu = b.fn("rates_alu")
    per = ALU_UNROLL * CHAINS * n_alu * 256  # ops per loop trip over the grid
    for op, (path, unit, what) in ALU_OPS.items():
        iters, t = b.sized(lambda n, op=op: lambda: alu((n_alu,), (256,), (i32(op), i32(n), b.out, b.stamps)))
        if op == 0:
            b.sm_clock = b.clock(n_alu)
            report(Measured(("sm_clock",), b.sm_clock, "Hz", "clock64 cycles over %globaltimer ns of thread 0 of "
                            "each block of an fp32 FMA loop (4 blocks of 256 threads per SM), median over blocks"), "")
        report(Measured(path, per * iters / t * (2 if op == 0 else 1), unit, f"{what}, 4 blocks of 256 threads per "
                        f"SM, {CHAINS} independent chains per thread, chip-wide, median CUDA-event time"), "")
    lat = b.fn("rates_alu_latency")
    iters = 4096
    c = b.cycles_of(lambda: lat((1,), (32,), (i32(3), i32(iters), b.out, b.cycles)))
    report(Measured(("exp", "latency"), c / (iters * ALU_UNROLL), "cycles",
                    "one warp, one dependent chain of ex2.approx.ftz.f32, clock64"), "")
    names = rates_mma_names()
    for dt, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        mma = b.fn(names[("mma", dt)], pad=True)
        for w in MMA_WARPS:
            iters, t = b.sized(lambda n, w=w, f=mma: lambda: f((b.sms,), (32 * w,), (i32(n), i32(0), b.out, b.stamps),
                                                               shared_mem=b.pad))
            rate = MMA_FLOP * CHAINS * w * b.sms * iters / t
            report(Measured(("mma_sync", short, "throughput", w), rate, "FLOP/s",
                            f"mma.sync m16n8k16 {short} fp32 accumulate, one block per SM of w warps (key), {CHAINS} "
                            "independent accumulators per warp, chip-wide, median CUDA-event time"),
                   f"at {fmt_rate(b.clock(b.sms), 'Hz')}")
        mlat = b.fn(names[("latency", dt)])
        c = b.cycles_of(lambda f=mlat: f((1,), (32,), (i32(256), b.out, b.cycles)))
        report(Measured(("mma_sync", short, "latency"), c / (256 * ALU_UNROLL), "cycles",
                        f"one warp, one dependent chain of mma.sync m16n8k16 {short}, clock64"), "")
    if not b.hopper:
        return
    wgmma_part(b, cp, report)


def _memory(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Shared memory, L2 and DRAM bandwidths."""
    i32, i64 = cp.int32, cp.int64
    smem = b.fn("rates_smem")
    blocks, block_bytes = 4 * b.sms, SMEM_WARPS * SMEM_PER_TRIP * 512  # bytes per block per loop trip
    for mode, name, what in ((0, "ldmatrix", "ldmatrix.x4"), (1, "ld128", "ld.shared.v4.u32")):
        iters, t = b.sized(lambda n, mode=mode: lambda: smem((blocks,), (256,), (i32(mode), i32(n), i32(0), b.out,
                                                                                 b.stamps)))
        # bytes per SM cycle, from clock64 on each SM: CUDA-event seconds are at this kernel's own clock, which is
        # not sm_clock (a lighter kernel runs faster: 34.22 TB/s = 130.9 B/clk at sm_clock on an H100, 2026-11-24)
        per_clk, own = b.per_sm_clk(blocks, block_bytes * iters), b.clock(blocks)
        event_rate = fmt_rate(blocks * block_bytes * iters / t, "B/s")
        report(Measured(("smem", name), per_clk * b.sms * (b.sm_clock or own), "B/s",
                        f"{what}, 512 B per warp instruction without bank conflicts, 4 blocks of 8 warps per SM: bytes "
                        f"per clock64 cycle of each SM over its blocks' loops (median over SMs), {per_clk:.1f} B/clk, "
                        "times SMs x sm_clock"),
               f"kernel at {fmt_rate(own, 'Hz')}: {event_rate} by CUDA-event time")
    grid, block = (4 * b.sms,), (256,)
    read, write, copy = b.fn("rates_read"), b.fn("rates_write"), b.fn("rates_copy")
    how = "(4 blocks of 256 threads per SM, grid-stride, 16 B per access, .cg)"
    for level, n, passes in (("l2", max(1, b.l2_bytes // 64), None),  # a quarter of L2, in float4
                             ("dram", min(DRAM_BYTES, cp.cuda.runtime.memGetInfo()[0] // 3) // 32 * 2, 1)):
        buf = cp.ones(4 * n, cp.float32)
        size = f"{16 * n / 1e6:.1f} MB"
        for kind, k, extra in (("read", read, b.out), ("write", write, cp.float32(2))):
            def make(r, k=k, extra=extra, buf=buf, n=n):
                return lambda: k(grid, block, (buf, i64(n), i32(r), extra))
            iters, t = b.sized(make, iters=8) if passes is None else (1, b.time(make(1)))
            verb = "read" if kind == "read" else "written"
            where = f"a {size} buffer (L2/4) resident in L2, {verb} many times" if passes is None else \
                f"one {kind} of a {size} buffer"
            report(Measured((level, kind), 16 * n * iters / t, "B/s", f"{where} per launch {how}"), "")
        if level == "dram":
            half = n // 2
            t = b.time(lambda buf=buf, half=half: copy(grid, block, (buf[: 4 * half], buf[4 * half :], i64(half))))
            report(Measured(("dram", "read_write"), 2 * 16 * half / t, "B/s", f"bytes read + bytes written per second, "
                            f"copying {16 * half / 1e6:.1f} MB to another buffer {how}"), "")


def _reduce(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """fp32 reductions into L2 (the backward's dQ accumulator): bytes of fp32 addends per second, red.global.add.f32
    (FlashAttention-2's atomicAdd) and red.global.add.v2.f32 (kernels/flash_bwd.cu)."""
    reduce = b.fn("rates_reduce")
    n = max(1024, b.l2_bytes // 16)  # floats: a quarter of L2, resident
    buf = cp.zeros(n, cp.float32)
    for width, name, what in ((1, "f32", "red.global.add.f32"), (2, "f32x2", "red.global.add.v2.f32")):
        def make(r, width=width):
            return lambda: reduce((4 * b.sms,), (256,), (buf, cp.int64(n), cp.int32(r), cp.int32(width)))
        iters, t = b.sized(make, iters=8)
        report(Measured(("l2", "reduce", name), 4 * n * iters / t, "B/s",
                        f"{what} of 1.0 into a {4 * n / 1e6:.1f} MB fp32 buffer (L2/4) resident in L2, every address "
                        "once a pass, many passes per launch (4 blocks of 256 threads per SM, grid-stride): fp32 "
                        "bytes added per second"), "")


def _launch(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Launch interval (queued, and from the host) and the cost of each further thread block."""
    empty, spin = b.fn("rates_empty"), b.fn("rates_spin")
    start, end = b.events

    def interval(queued: bool) -> float:  # queued: the launches wait behind rates_spin, never for the host
        if queued:
            spin((1,), (32,), (cp.int64(30_000_000),))
        else:
            cp.cuda.Stream.null.synchronize()
        start.record()
        for _ in range(LAUNCHES):
            empty((1,), (32,), ())
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e-3 / LAUNCHES

    for queued, key, method in ((True, "interval", "queued behind a 30 ms kernel"),
                                (False, "host_interval", "launched from Python through CuPy while the GPU waits")):
        interval(queued)
        t = float(np.median([interval(queued) for _ in range(b.repeats)]))
        report(Measured(("launch", key), t, "s", f"{LAUNCHES} empty kernels (1 block of 32 threads) on one stream, "
                        f"{method}: CUDA-event time over {LAUNCHES}"), "")
    one = b.time(lambda: empty((1,), (128,), ()))
    many = b.time(lambda: empty((BLOCKS_PER_SM * b.sms,), (128,), ()))
    report(Measured(("launch", "per_block"), max(many - one, 1e-12) / BLOCKS_PER_SM, "s",
                    f"(time of an empty kernel of {BLOCKS_PER_SM} blocks of 128 threads per SM - time of one block) / "
                    f"{BLOCKS_PER_SM}"), "")
    _calls(b, cp, report)


def _calls(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """A call as the time records time one (CUDA events around it, queued behind a busy kernel): one, then two
    dependent launches of a one-wave kernel whose every thread loads 16 B that sit in L2 and stores them."""
    copy, spin = b.fn("rates_copy"), b.fn("rates_spin")
    n = 4 * b.sms * 256  # one float4 per thread of 4 blocks of 256 threads per SM
    buf = cp.ones(8 * n, cp.float32)
    src, dst = buf[: 4 * n], buf[4 * n :]

    clock = cupy_clock(cp, spin=lambda: spin((1,), (32,), (cp.int64(10_000_000),)))

    def call(kernels: int) -> float:
        def one() -> None:
            for _ in range(kernels):
                copy((4 * b.sms,), (256,), (src, dst, cp.int64(n)))

        return time_ms(one, CALLS, warmup=0, view=BUSY, clock=clock) * 1e-3

    call(1)  # warm: the buffers in L2
    t1 = float(np.median([call(1) for _ in range(b.repeats)]))
    t2 = float(np.median([call(2) for _ in range(b.repeats)]))
    what = (f"a one-wave kernel (4 blocks of 256 threads per SM, each thread one 16 B load from L2 and one store), "
            f"CUDA events around each of {CALLS} calls queued behind a 10 ms kernel, median")
    report(Measured(("launch", "call"), t1, "s", f"one launch per call: {what}"), "")
    report(Measured(("launch", "dependent"), max(t2 - t1, 1e-12), "s",
                    f"two launches per call minus one: {what}"), "")


def _per_clk(m: Measured, sms: int, clock: float | None) -> str:
    if clock is None or m.unit in ("s", "cycles", "Hz", "W") or m.unit.startswith("J/"):
        if clock is not None and m.path[0] == "latency":  # memory latency: the same in SM cycles
            return f"{m.value * clock:.0f} cycles"
        return ""
    unit = {"FLOP/s": "FLOP", "op/s": "", "B/s": "B"}[m.unit]
    return f"{m.value / (sms * clock):.4g} {unit}/clk/SM".replace("  ", " ")


def measure_rates(repeats: int = 15, echo: Callable[[str], None] = print, dev: dict | None = None) -> list[Measured]:
    """Measure every rate on CUDA device 0, printing each as it completes; ``dev`` (:func:`device_facts`, default:
    read here) gets ``hopper``: whether wgmma was measured."""
    cp = require_cupy()
    dev = device_facts(cp) if dev is None else dev
    echo(f"{dev['device']}: {dev['sms']} SMs, compute capability {dev['cc']}, driver {dev['driver']}, CUDA {dev['cuda']}")
    try:
        b = Bench(cp, repeats)
        measured: list[Measured] = []
        clock: list[float] = []
        echo(f"{'quantity':<28}{'measured':>16}  {'per clk per SM':<22}  expected ({H100}) / note")

        def report(m: Measured, note: str) -> None:
            measured.append(m)
            if m.path == ("sm_clock",):
                clock.append(m.value)
            label = ".".join(str(p) for p in m.path)
            expect = next((v for k, v in EXPECTED.items() if label.startswith(k)), "")
            echo(f"{label:<28}{fmt_value(m)!s:>16}  {_per_clk(m, b.sms, clock[0] if clock else None):<22}  "
                 f"{'; '.join(x for x in (expect, note) if x)}")

        for part in (_compute, _memory, _reduce, chase_latency, _launch, decode_part, steps_part, power_part):
            part(b, cp, report)
            cp.cuda.runtime.deviceSynchronize()
    except RatesError:
        raise
    except Exception as exc:  # a CUDA error (launch, fault, out of memory), one line
        raise RatesError(f"calibration kernel failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    dev["hopper"] = b.hopper
    return measured


def measured_on(dev: dict, command: str) -> dict:
    """The calibration's measured_on record: device, driver, CUDA, date (UTC), git commit, command."""
    return {"device": dev["device"], "driver": dev["driver"], "cuda": dev["cuda"],
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "commit": git_commit(),
            "command": command}


def git_commit() -> str:
    """The short commit of the checkout iosim runs from, '+dirty' with uncommitted changes; or the iosim version."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            raise OSError(head.stderr)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root, timeout=20).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return f"iosim {__version__} (not a git checkout)"
    return head.stdout.strip() + ("+dirty" if dirty else "")
