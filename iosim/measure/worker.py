"""The worker: runs inside ncu (or alone, for timing), one process per profile.

    python -m iosim.measure.worker SPEC.json OUT.json

SPEC holds ``mode`` ("profile": each run launched once after its marker kernel; "time": CUDA-event median of
``reps`` calls after ``warmup``) and ``runs`` (:func:`iosim.measure.runs.to_dict`). OUT gets one record per run
(its facts, or its error: the list goes on) and the device's identity.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import gpu
from .._resources import kernels_dir
from .events import ISOLATED, cupy_clock, time_ms
from .ncu import END_MARKER_Z
from .runs import (
    BACKWARD_KINDS,
    FP8_KINDS,
    Attention,
    MeasureError,
    ReadProbe,
    Run,
    WriteProbe,
    from_dict,
    to_dict,
)

PROBE_SOURCE = "probes.cu"
READ_PROBE_PASSES = 2  # l2probe reads its buffer twice
WRITE_PROBE_THREADS = 256  # l2write: one block of 256 threads per SM (its grid barrier needs all co-resident)


def device_identity(p: dict) -> dict:
    """Which physical GPU this is (CUDA device properties): its UUID and PCI address, as nvidia-smi prints them."""
    out = {}
    uuid = p.get("uuid")
    if isinstance(uuid, (bytes, bytearray)) and len(uuid) == 16:
        h = uuid.hex()
        out["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if "pciBusID" in p:
        out["pci_bus_id"] = f"{p.get('pciDomainID', 0):08x}:{p['pciBusID']:02x}:{p.get('pciDeviceID', 0):02x}.0"
    return out


def device_info(cp) -> dict:
    p = cp.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    return {"name": name, "sm_count": p["multiProcessorCount"], "l2_bytes": p["l2CacheSize"],
            "smem_per_sm": p["sharedMemPerMultiprocessor"], "regs_per_sm": p["regsPerMultiprocessor"],
            "cc": f"{p['major']}.{p['minor']}", "driver": cp.cuda.runtime.driverGetVersion(), **device_identity(p)}


class Probes:
    """The probe kernels of kernels/probes.cu, compiled once per process."""

    def __init__(self, cp):
        self.cp = cp
        mod = cp.RawModule(code=(kernels_dir() / PROBE_SOURCE).read_text())
        self.marker = mod.get_function("iosim_marker")
        self.read = mod.get_function("iosim_l2probe")
        self.write = mod.get_function("iosim_l2write")
        self.sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    def prepare_read(self, run: ReadProbe):
        cp, n = self.cp, run.nbytes // 16
        a = cp.random.random(n * 4, dtype=cp.float32) + 1.0
        out = cp.zeros(1, dtype=cp.float32)
        grid, block = (self.sms * run.blocks_per_sm,), (run.threads,)
        args = (a, out, cp.int64(n), cp.int32(READ_PROBE_PASSES))
        return (lambda: self.read(grid, block, args)), {"read_bytes": n * 16 * READ_PROBE_PASSES}

    def prepare_write(self, run: WriteProbe):
        cp, nw, nr = self.cp, run.nbytes // 16, run.read_bytes // 16
        w = cp.zeros(max(nw, 1) * 4, dtype=cp.float32)
        r = cp.random.random(max(nr, 1) * 4, dtype=cp.float32) + 1.0
        bar = cp.zeros(1, dtype=cp.uint32)
        out = cp.zeros(1, dtype=cp.float32)
        args = (w, cp.int64(nw), r, cp.int64(nr), cp.int32(run.mode), bar, out)
        stream = cp.cuda.get_current_stream().ptr

        def launch():
            cp.cuda.runtime.memsetAsync(bar.data.ptr, 0, 4, stream)
            self.write((self.sms,), (WRITE_PROBE_THREADS,), args)

        reads = nr * 16 * (self.sms if run.shared else 1)
        return launch, {"write_bytes": nw * 16, "read_bytes": reads}


def prepare_attention(run: Attention, torch):
    """A zero-argument callable that makes the attention call once (inputs made here, seeded)."""
    if torch is None:
        raise MeasureError("the attention runs need PyTorch for inputs (torch is not importable)")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[run.dtype]
    g = torch.Generator(device="cuda").manual_seed(1234)
    q = torch.randn(run.batch, run.seq_len, run.heads, run.head_dim, device="cuda", dtype=dt, generator=g)
    k = torch.randn(run.batch, run.kv_len, run.kv_heads, run.head_dim, device="cuda", dtype=dt, generator=g)
    v = torch.randn(run.batch, run.kv_len, run.kv_heads, run.head_dim, device="cuda", dtype=dt, generator=g)
    if run.kind in BACKWARD_KINDS:
        return _prepare_backward(run, torch, (q, k, v), g)
    if run.seqlens is not None:  # packed: (total, heads, head_dim), the batch's one sequence cut at cu_seqlens
        cu_q, cu_k = (np.cumsum([0] + [s[i] for s in run.seqlens]) for i in (0, 1))
        tiles = gpu.AttentionOptions(block_q=run.block_q, block_kv=run.block_kv)
        if run.page_size is not None:
            kc, vc, table = gpu.paged_kv(k[0], v[0], cu_k, run.page_size, seed=run.page_size)
            batch = gpu.varlen_batch(cu_q, cu_k, block_table=table, page_size=run.page_size)
            return lambda: gpu.attention_varlen(q[0], kc, vc, batch, causal=run.causal, window=run.window,
                                                options=tiles)
        return lambda: gpu.attention_varlen(q[0], k[0], v[0], (cu_q, cu_k), causal=run.causal, window=run.window,
                                            options=tiles, schedule=run.kind)
    if run.kind in ("flash2", "naive", "flash3"):
        tiles = {"block_q": run.block_q, "block_kv": run.block_kv} if run.kind == "flash2" else {}
        opts = gpu.AttentionOptions(**tiles, window=run.window)
        return lambda: gpu.attention(q, k, v, schedule=run.kind, causal=run.causal, options=opts)
    sdpa = _sdpa(run, torch, q, k, v)
    return lambda: sdpa()[0]


def _sdpa(run: Attention, torch, q, k, v):
    """A call of torch SDPA's backend for ``run`` (flash or cuDNN) on (B, H, N, d) views of q, k, v (no copy)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.FLASH_ATTENTION if run.kind.startswith("sdpa-flash") else SDPBackend.CUDNN_ATTENTION
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = run.heads != run.kv_heads

    def call():
        with sdpa_kernel(backend):
            return (torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=run.causal,
                                                                     enable_gqa=gqa),)

    return call


def _prepare_backward(run: Attention, torch, qkv: tuple, g):
    """The backward call of ``run``, its forward made here (before the run's marker: outside its range). flash2-bwd:
    iosim.gpu.attention_backward on the forward's O and lse; the torch kinds: torch.autograd.grad of the SDPA call's
    output (the graph kept, so the call repeats)."""
    q, k, v = qkv
    if run.kind == "flash2-bwd":
        o, lse = gpu.attention(q, k, v, causal=run.causal, return_lse=True)
        do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)
        return lambda: gpu.attention_backward(q, k, v, o, do, lse, causal=run.causal)
    leaves = tuple(x.requires_grad_() for x in qkv)
    (out,) = _sdpa(run, torch, *leaves)()
    do = torch.randn_like(out)  # out's strides: SDPA takes dO as it laid out O
    torch.cuda.synchronize()
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def _prepare_fp8(run: Attention, torch):
    """(the call, what the record gets) of an fp8 kind: inputs drawn in bf16 (what quantize_fp8 reads), seeded, and
    block-quantized at the fp8 kernel's tiles without rotation (incoherent processing loads its +-1 signs for every
    element, which the quantize schedule does not count; the attention kernel reads the same bytes either way).
    flash3-fp8: the attention kernel alone, its inputs quantized here, before the run's marker (outside its range, as
    a backward run's forward); fp8-quantize: the three quantize launches, with the blocks they used as the launch."""
    if torch is None:
        raise MeasureError("the fp8 runs need PyTorch for inputs (torch is not importable)")
    g = torch.Generator(device="cuda").manual_seed(1234)

    def draw(n, h):
        return torch.randn(run.batch, n, h, run.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)

    q, k, v = draw(run.seq_len, run.heads), draw(run.kv_len, run.kv_heads), draw(run.kv_len, run.kv_heads)
    bq, bkv = gpu.fp8_blocks(run.head_dim)

    def quantize():
        return (gpu.quantize_fp8(q, block=bq), gpu.quantize_fp8(k, block=bkv),
                gpu.quantize_fp8(v, block=bkv, transpose=True))

    if run.kind == "fp8-quantize":
        return quantize, {"launch": {"tiles": {"block_q": bq, "block_kv": bkv}, "kernels": []}}
    qf, kf, vf = quantize()
    return (lambda: gpu.attention(qf, kf, vf, schedule="flash3", causal=run.causal)), {}


def _prepare(run: Run, probes: Probes, torch):
    if isinstance(run, ReadProbe):
        return probes.prepare_read(run)
    if isinstance(run, WriteProbe):
        return probes.prepare_write(run)
    if run.kind in FP8_KINDS:
        return _prepare_fp8(run, torch)
    return prepare_attention(run, torch), {}


def _launch_record(run: Run) -> dict | None:
    """Our kernels' launch (tiles, per-kernel threads, shared memory) as iosim.gpu last made it (fp8-quantize's is
    the blocks _prepare_fp8 gave: quantize_fp8 leaves no launch record)."""
    if not (isinstance(run, Attention) and run.kind in ("flash2", "naive", "flash3", "flash2-bwd", "flash3-fp8")):
        return None
    lr = gpu.last_launch()
    return {"tiles": lr.tiles, "kernels": [asdict(k) for k in lr.launches]}


def run_spec(spec: dict) -> dict:
    """Run every run of ``spec`` (see the module docstring); the records and the device."""
    import cupy as cp

    try:
        import torch
    except ImportError:
        torch = None
    mode, reps, warmup = spec.get("mode", "profile"), int(spec.get("reps", 10)), int(spec.get("warmup", 3))
    probes = Probes(cp)
    dummy = cp.zeros(1, dtype=cp.int32)
    results = []
    for idx, d in enumerate(spec["runs"]):
        rec: dict = {"index": idx, "run": d}
        try:
            run = from_dict(d)
            fn, info = _prepare(run, probes, torch)
            rec.update(info)
            if mode == "profile":
                cp.cuda.Device().synchronize()  # the preparation (a backward run's forward) is done
                probes.marker((idx + 1,), (32,), (dummy,))
                fn()
                probes.marker((idx + 1, 1, END_MARKER_Z), (32,), (dummy,))  # the next run's preparation: no run's
                cp.cuda.Device().synchronize()
            else:
                rec["time_ms"] = time_ms(fn, reps, warmup, ISOLATED, cupy_clock(cp))
            launch = _launch_record(run)
            if launch:
                rec["launch"] = launch
        except Exception as exc:  # recorded, the list goes on
            rec["error"] = f"{type(exc).__name__}: {exc}"
        results.append(rec)
        fn = None  # frees the inputs before the next run
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
    return {"mode": mode, "device": device_info(cp), "results": results}


def write_spec(path: Path, runs: list[Run], mode: str, reps: int = 10) -> None:
    path.write_text(json.dumps({"mode": mode, "reps": reps, "runs": [to_dict(r) for r in runs]}))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m iosim.measure.worker SPEC.json OUT.json (use `iosim measure` instead)", file=sys.stderr)
        sys.exit(2)
    out = run_spec(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
