"""CI compile check: build every kernel instantiation the library can launch with nvcc, no GPU and no CuPy needed.

    python -m iosim.gpu.compile_check [--arch 80 --arch 90] [--jobs 2] [--nvcc nvcc]

For each instantiation and architecture it writes a translation unit that #includes the kernel file from
``kernels/`` and adds one explicit template instantiation, compiles it to a cubin with the options CuPy gives
NVRTC (see ``build.nvrtc_options``) plus ``-Xptxas -v``, and prints registers, stack frame and spills. Exit status:
0 when everything compiled and no head-dim 64 or 128 flash configuration spills; 1 otherwise; 2 if nvcc is missing.
One flash instantiation per architecture is also built with -DIOSIM_BLOCK_TRACE (the block-timeline variant), and
the L2 calibration probes of ``kernels/probes.cu`` (plain C, no templates) are built as they are. Where sm_90 is checked,
every flash3 instantiation (``kernels/flash3_fwd.cu`` and the backward ``kernels/flash3_bwd.cu``, wgmma and TMA)
is built for sm_90a, and none may spill. Every Flash-Decoding instantiation (``kernels/flash_decode.cu``, split and
combine kernels) is built for every architecture, and none may spill. The rate
calibration kernels (``kernels/rates.cu``, one translation unit of all of them) are built for every architecture, and
with their wgmma kernels for sm_90a; none may spill. A unit of several kernels reports the most registers, stack and
spills of any.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from iosim._resources import kernels_dir
from iosim.gpu.build import (
    COMPILE_ARCHS,
    FLASH3_ARCH,
    Flash3BwdInstance,
    Flash3Instance,
    FlashBwdInstance,
    FlashInstance,
    NaiveInstance,
    all_instances,
    flash3_bwd_instances,
    flash3_instances,
    nvcc_options,
)
from iosim.gpu.build_decode import DecodeInstance, decode_instances
from iosim.gpu.build_fp8 import QuantizeInstance, quantize_instances
from iosim.gpu.build_rates import RATES_WGMMA_DEFINE, RatesSource

NO_SPILL_HEAD_DIMS = (64, 128)  # a spill in these flash configurations fails the check

_RE_REGS = re.compile(r"Used (\d+) registers")
_RE_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass
class Result:
    name: str
    arch: int | str  # 80, 90, or "90a" (flash3)
    ok: bool
    registers: int = -1
    stack: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    log: str = ""
    must_not_spill: bool = False

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


TRACE_DEFINE = "-DIOSIM_BLOCK_TRACE"


@dataclass(frozen=True)
class PlainSource:
    """A kernel file with extern "C" kernels only: compiled as it is (no instantiation to add)."""

    source: str
    name_expression: str = ""
    explicit_instantiation: str = ""

    def __post_init__(self):
        object.__setattr__(self, "name_expression", self.source)


PLAIN_SOURCES = (PlainSource("probes.cu"),)


def _compile(
    inst: FlashInstance | Flash3Instance | FlashBwdInstance | NaiveInstance | PlainSource | RatesSource | DecodeInstance
    | QuantizeInstance,
    arch: int | str, nvcc: str, workdir: Path, defines: tuple[str, ...] = ()
) -> Result:
    kdir = kernels_dir()
    safe = re.sub(r"[^A-Za-z0-9]+", "_", inst.name_expression + "".join(defines)).strip("_")
    tu = workdir / f"{safe}_sm{arch}.cu"
    tu.write_text(f'#include "{inst.source}"\n{inst.explicit_instantiation}\n')
    cmd = [nvcc, *nvcc_options(kdir, arch), *defines, "-o", str(tu.with_suffix(".cubin")), str(tu)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    res = Result(
        inst.name_expression + (" " + " ".join(defines) if defines else ""),
        arch,
        proc.returncode == 0,
        log=log if proc.returncode else "",
        must_not_spill=(isinstance(inst, FlashInstance) and inst.head_dim in NO_SPILL_HEAD_DIMS)
        or (isinstance(inst, FlashBwdInstance) and inst.kind == "main" and inst.head_dim in NO_SPILL_HEAD_DIMS)
        or isinstance(inst, (Flash3Instance, Flash3BwdInstance, RatesSource, DecodeInstance, QuantizeInstance)),
    )
    if regs := _RE_REGS.findall(log):  # one report per kernel of the unit: the largest of each
        res.registers = max(int(r) for r in regs)
    if spills := _RE_SPILL.findall(log):
        res.stack, res.spill_stores, res.spill_loads = (max(int(s[i]) for s in spills) for i in range(3))
    if res.ok and res.registers < 0:  # nvcc said nothing about the kernel: treat as a failure to be looked at
        res.ok, res.log = False, "ptxas printed no resource report for the kernel\n" + log
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m iosim.gpu.compile_check", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", type=int, action="append", help="SM architecture, e.g. 80 or 90 (repeatable)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    ap.add_argument("--nvcc", default="nvcc", help="nvcc executable (default: nvcc on PATH)")
    args = ap.parse_args(argv)
    archs = tuple(args.arch or COMPILE_ARCHS)
    nvcc = shutil.which(args.nvcc)
    if nvcc is None:
        print(
            f"compile_check: nvcc not found (--nvcc {args.nvcc!r}); install the CUDA toolkit", file=sys.stderr
        )
        return 2
    jobs = [(inst, arch, ()) for arch in archs for inst in (*all_instances(), *decode_instances())]
    traced = next(i for i in all_instances() if isinstance(i, FlashInstance) and i.head_dim == 128)
    jobs += [(traced, arch, (TRACE_DEFINE,)) for arch in archs]
    jobs += [(src, arch, ()) for arch in archs for src in (*PLAIN_SOURCES, RatesSource())]
    if 90 in archs:  # flash3 and the wgmma rate kernels exist for the arch-specific Hopper target only
        jobs += [(inst, FLASH3_ARCH, ()) for inst in (*flash3_instances(), *flash3_bwd_instances(),
                                                      *quantize_instances())]
        jobs += [(RatesSource(wgmma=True), FLASH3_ARCH, (RATES_WGMMA_DEFINE,))]
    n3 = sum(j[1] == FLASH3_ARCH for j in jobs)
    print(
        f"compile_check: {len(jobs)} instantiations ({(len(jobs) - n3) // len(archs)} x sm_{', sm_'.join(map(str, archs))}"
        f"{f' + {n3} x sm_{FLASH3_ARCH} (flash3, rates wgmma)' if n3 else ''}) with {nvcc}, {args.jobs} jobs; kernels from {kernels_dir()}",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="iosim_cc_") as tmp,
        ThreadPoolExecutor(max(1, args.jobs)) as pool,
    ):
        results = list(pool.map(lambda ja: _compile(ja[0], ja[1], nvcc, Path(tmp), ja[2]), jobs))

    failed = [r for r in results if not r.ok]
    spilled = [r for r in results if r.ok and r.must_not_spill and r.spills]
    w = max(len(r.name) for r in results)
    print(f"{'instantiation':<{w}}  arch    regs  stack  spill_st  spill_ld  status")
    for r in results:
        status = (
            "FAIL"
            if not r.ok
            else ("SPILL" if r.spills and r.must_not_spill else ("spill" if r.spills else "ok"))
        )
        print(
            f"{r.name:<{w}}  {'sm_' + str(r.arch):<6} {r.registers:>5}  {r.stack:>5}  {r.spill_stores:>8}  {r.spill_loads:>8}  "
            f"{status}"
        )
    for r in failed:
        print(f"\n--- {r.name} sm_{r.arch} failed:\n{r.log}", file=sys.stderr)
    print(
        f"compile_check: {len(results) - len(failed)}/{len(results)} compiled; "
        f"{len(spilled)} forbidden spills (flash2 forward and backward main kernel at head dims {NO_SPILL_HEAD_DIMS}, "
        "every flash3 forward and backward, rates.cu, flash_decode.cu)"
    )
    return 1 if failed or spilled else 0


if __name__ == "__main__":
    sys.exit(main())
