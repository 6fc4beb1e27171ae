"""SASS instructions of kernels/flash3_fwd.cu's mask pass per masked score, per instantiation (iosim.timing.fa3.MASK_OPS).

    python benchmarks/flash3_mask_sass.py        # needs nvcc and cuobjdump (CUDA 12.3+), no GPU

Each 16-bit instantiation is compiled twice for sm_90a, as shipped and from a copy whose ``if (need_mask)`` block is
compiled out; the difference in SASS instructions (cuobjdump -sass), over the two inlined copies of the softmax (the
first K/V tile's and the loop's) and the scores a thread masks in one pass (a warpgroup's 64 rows x Bc over its 128
threads), is the pass's instructions a masked score.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from iosim._resources import kernels_dir
from iosim.gpu import build
from iosim.gpu.build import nvcc_options
from iosim.gpu.compile_check import FLASH3_ARCH


def count(source_dir: Path, source: str, inst) -> int:
    """SASS instructions of ``inst`` compiled from ``source`` in ``source_dir``."""
    tu = source_dir / "tu.cu"
    tu.write_text(f'#include "{source}"\n{inst.explicit_instantiation}\n')
    cubin = source_dir / "k.cubin"
    opts = [o for o in nvcc_options(source_dir, FLASH3_ARCH) if o not in ("-Xptxas", "-v")]
    subprocess.run(["nvcc", *opts, "-o", str(cubin), str(tu)], check=True, capture_output=True)
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    return sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line))


def main() -> None:
    src, tmp = kernels_dir(), Path(tempfile.mkdtemp())
    for f in src.iterdir():
        if f.suffix in (".cu", ".cuh"):
            shutil.copy(f, tmp / f.name)
    text = (src / "flash3_fwd.cu").read_text()
    if text.count("if (need_mask) {") != 1:
        raise SystemExit("kernels/flash3_fwd.cu: expected one `if (need_mask) {` block")
    (tmp / "flash3_nomask.cu").write_text(text.replace("if (need_mask) {", "if (false && need_mask) {"))
    for inst in build.flash3_instances():
        e = inst.name_expression
        if "e4m3" in e:
            continue
        d, bc = (int(x) for x in re.search(r"<(\d+), (\d+),", e).groups())
        full, bare = count(tmp, "flash3_fwd.cu", inst), count(tmp, "flash3_nomask.cu", inst)
        per_thread = 64 * bc // 128  # a warpgroup's 64 rows x Bc scores over its 128 threads, one mask pass
        print(f"{e:62} SASS {full} vs {bare} without the pass: {(full - bare) / (2 * per_thread):.2f} a masked "
              f"score (d = {d})", flush=True)


if __name__ == "__main__":
    main()
