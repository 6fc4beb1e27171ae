"""The energy record: joules per call of the forward kernels, by NVML's energy counter, beside the energy model.

    python benchmarks/energy_record.py --measure --device h100 [--out DIR]   # on the GPU (~1 min)
    python benchmarks/energy_record.py --device h100 [--profile FILE]         # anywhere: predict and judge

``--measure`` runs each kernel of :func:`shapes` (iosim flash2 and naive, torch SDPA's flash backend = ``fa2``, its
cuDNN backend = ``cudnn``, our flash3 forward = ``fa3`` where the GPU runs it) and of :func:`backward_shapes` (the
backward passes: ours of flash2 and flash3, torch's FA2 and cuDNN, as benchmarks/time_record_backward.py calls them)
back to back for a burst of at least 20 calls and 0.25 s, after 0.4 s of rest, and reads NVML's energy counter at
the counter's steps around it (:func:`iosim.calibrate.power.burst`, the calibration's own method): joules per call,
and seconds per call of the burst. It writes ``data/validation/<device>-energy.json``.

Without ``--measure`` it predicts each row's ``time.energy_j`` as the time record does (L2 model, warm calls, the
kernel's description), for the burst's mean call (``run`` = the burst's seconds: its clocks under the power
limiter, :mod:`iosim.timing.clock`), on the profile (default: the built-in one, whose ``calibration.power``
``iosim calibrate rates`` measured), and prints |predicted - measured| / measured per kernel: with the predicted
time (the bar: the median within 10%) and with the measured time put into the same formula (the energy model
alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from time_judge import simulate_row  # beside this file
from time_record import PROFILE, ROOT, Shape, _bench, _callables, device_header

KERNELS = ("iosim-flash2", "iosim-naive", "fa2", "cudnn", "fa3")
BACKWARD = ("iosim-flash2-bwd", "iosim-flash3-bwd", "fa2-bwd", "cudnn-bwd")
MIN_CALLS = 20


def shapes() -> list[Shape]:
    """Long and short calls, tensor-bound and memory-bound (naive), d 64 and 128, causal and not."""
    out = [_bench(n, d, c) for n in (1024, 4096, 16384) for d in (64, 128) for c in (False, True)]
    return [*out, Shape(8, 32, 8, 4096, 4096, 128, "bf16", True), Shape(1, 16, 16, 2048, 2048, 128)]


def backward_shapes() -> list[Shape]:
    """The backward pass: long and short calls, d 64 and 128, causal and not."""
    return [*(Shape(4, 16, 16, 4096, 4096, 128, "bf16", c) for c in (False, True)),
            Shape(4, 32, 32, 4096, 4096, 64, "bf16", True), Shape(1, 16, 16, 16384, 16384, 128, "bf16", True),
            Shape(16, 16, 16, 1024, 1024, 128)]


def measure(device: str) -> dict:
    import cupy as cp
    import torch
    from time_record_backward import _callables as backward_callables
    from time_record_backward import _gqa_inputs

    from iosim.calibrate.power import Nvml, burst

    nvml = Nvml()
    idle_j, idle_s, _ = burst(nvml, cp, None, 1.0, 0.0)
    rows = []
    for i, s in enumerate(shapes()):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[s.dtype]
        g = torch.Generator(device="cuda").manual_seed(i)
        tensors = tuple(torch.randn(s.batch, n, h, s.head_dim, generator=g, device="cuda").to(dt)
                        for n, h in ((s.seq_len, s.heads), (s.kv_len, s.kv_heads), (s.kv_len, s.kv_heads)))
        for name, fn in _callables(s, tensors).items():
            if name in KERNELS:
                rows.append(_burst_row(nvml, cp, torch, s, name, fn, idle_j / idle_s, i))
        del tensors
        torch.cuda.empty_cache()
    for i, s in enumerate(backward_shapes()):
        tensors = _gqa_inputs(torch, s, torch.bfloat16)
        for name, fn in backward_callables(s, tensors).items():
            if name in BACKWARD and not isinstance(fn, Exception):  # a refusal: no row
                rows.append(_burst_row(nvml, cp, torch, s, name, fn, idle_j / idle_s, i))
        del tensors
        torch.cuda.empty_cache()
    return {**device_header(device, 0), "idle_w": idle_j / idle_s, "rows": rows}


def _burst_row(nvml, cp, torch, s: Shape, name: str, fn, idle_w: float, i: int) -> dict:
    """Joules and seconds a call of ``fn`` over a burst of at least BURST_S and MIN_CALLS calls after REST_S."""
    from iosim.calibrate.power import BURST_S, burst

    for _ in range(3):
        fn()  # compile, caches
    torch.cuda.synchronize()
    j, sec, n = burst(nvml, cp, fn, BURST_S, idle_w)
    if n < MIN_CALLS:  # long calls: at least MIN_CALLS of them
        j, sec, n = burst(nvml, cp, fn, BURST_S * MIN_CALLS / n, idle_w)
    print(f"[{i + 1}] {s.key:<34} {name:<17} {j / n:9.4f} J a call, {sec / n * 1e3:8.3f} ms, "
          f"{j / sec:5.0f} W over {n} calls", flush=True)
    return {**s.__dict__, "kernel": name, "joules": j / n, "seconds": sec / n, "calls": n, "burst_s": sec}


def judge(data: dict, profile: str) -> int:
    from iosim import get_profile
    from iosim.timing.energy import KernelWork, energy_j

    prof = get_profile(profile)
    if prof.calibration is None or prof.calibration.power is None:
        sys.exit(f"profile {profile} has no calibration.power: iosim calibrate rates measures it")
    errs: dict[str, list[tuple[float, float]]] = {}
    print(f"{'kernel':<13} {'shape':<34} {'measured J':>10} {'predicted':>10} {'err':>7} {'with its time':>13}")
    for row in data["rows"]:
        r = simulate_row(row, profile, run=row["burst_s"])  # the burst's mean call, its clocks (iosim.timing.clock)
        pred = r.time.energy_j
        hbm = r.time_hbm["read_bytes"] + r.time_hbm["write_bytes"]
        c = r.time.clock
        clocks = list(zip(c.shares, (c.start_hz, c.fast_hz, c.steady_hz), strict=True)) if c else [(1.0, None)]
        alone = sum(share * energy_j(r.counts, hbm, row["seconds"], row["dtype"], getattr(r.kernel, "family", None),
                                     prof.calibration.power, KernelWork.of(r.time.kernels), clock)
                    for share, clock in clocks)
        e1, e2 = pred / row["joules"] - 1, alone / row["joules"] - 1
        errs.setdefault(row["kernel"], []).append((e1, e2))
        key = Shape(**{k: row[k] for k in Shape.__dataclass_fields__}).key
        print(f"{row['kernel']:<13} {key:<34} {row['joules']:10.4f} {pred:10.4f} {e1:+7.1%} {e2:+13.1%}")
    print(f"\n{data['device']} (measured at {data['commit'][:7]}), profile {profile}: |error| median / worst")
    ok = True
    for k, v in errs.items():
        med = statistics.median(abs(a) for a, _ in v)
        print(f"  {k:<13} {med:6.1%} / {max(abs(a) for a, _ in v):6.1%}   energy model alone (measured time): "
              f"{statistics.median(abs(b) for _, b in v):6.1%} / {max(abs(b) for _, b in v):6.1%}   ({len(v)} rows)")
        ok &= med <= 0.10
    print(f"bar (median within 10% per kernel): {'met' if ok else 'not met'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE), required=True)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "data" / "validation"))
    ap.add_argument("--profile", default=None, help="profile with calibration.power [default: the built-in one]")
    args = ap.parse_args(argv)
    path = Path(args.out) / f"{args.device}-energy.json"
    if args.measure:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measure(args.device), indent=1) + "\n")
        print(f"wrote {path}")
        return 0
    return judge(json.loads(path.read_text()), args.profile or PROFILE[args.device])


if __name__ == "__main__":
    sys.exit(main())
