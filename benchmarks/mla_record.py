"""MLA decode against a torch reference (issue 28 item 4): DeepSeek-V3's absorbed decode step run by torch, each of
its kernels' DRAM bytes (Nsight Compute) and time beside what iosim.schedules.mla_decode counts and the roofline
predicts for the same step.

    python benchmarks/mla_record.py --measure --device h100 [--out DIR]   # on the GPU (about a minute)
    python benchmarks/mla_record.py --device h100                         # anywhere: the table from the record

The reference (bf16, 128 query heads, a latent cache of 512 + 64 values a token, one new token a sequence) runs the
schedule's three kernels with torch's own: q_nope · W_UK per head (``torch.bmm``), attention of every head's row on
the latent cache as one kv head (``scaled_dot_product_attention`` with the memory-efficient backend: queries of 576
values, keys the cache's 576, values its first 512, the 128 heads as 128 query rows of one sequence), and the latent
output · W_UV per head (``torch.bmm``); between the first two, ``torch.cat`` joins q_latent and q_rope (a copy the
schedule, whose attention kernel takes them joined, does not have: measured and shown, not judged). Before any
timing the reference is checked against the same step computed without absorption in float64 (keys and values
expanded per head from the latent), which is what absorption must equal.

Bytes: one process per shape under ``ncu --cache-control all --profile-from-start off`` (L2 flushed before each
kernel), the window the step's kernels; each kernel is given to its stage by the kernel list torch's profiler records
for each stage (run first, without ncu), and a stage's bytes are its kernels' sum. The projections' DRAM reads and
writes are judged by iosim.validation's rule for ``hbm`` (5% reads, 10% writes, or 1% of the stage's compulsory
bytes) against :func:`iosim.schedules.mla_decode.dram`. The attention stage is torch's kernel, not the schedule's
(FlashMLA's) design: its bytes are judged at ``global`` (the loads and stores its instructions request, Nsight
Compute's ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld`` and ``_st``), exactly, against the counts of the design it
runs (:func:`iosim.timing.mla.reference`: the accumulator in global memory); its DRAM bytes are shown beside the
compulsory ones, a floor: what of its accumulators spills from L2 is not modeled.

Time: the median of ``--reps`` CUDA-event intervals of each stage on a busy stream (benchmarks/cuda_events.py). The
attention stage's is set beside :func:`iosim.timing.mla.attention_time` (the kernel's step measured by
``iosim calibrate rates``, :mod:`iosim.calibrate.mla_step`, on ceil(k x SMs / 4) sequences of 2048 and 8192 keys, none
of the shapes here), the others' beside :func:`iosim.timing.roofline.predict` of the schedule's counts and DRAM
bytes. No parameter of the model is taken from these shapes. Writes
``<out>/<device>-mla.json`` (default data/validation) and, from it, ``docs/validation/<device>-mla.csv`` (each
stage's measured bytes and time; the report's serving section sets the counts and the models beside them).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from cuda_events import time_ms  # beside this file
from ncu_child import kernel_metrics  # beside this file
from time_record import PROFILE, device_header, save_record  # beside this file

from iosim.hardware.gpu import get_profile
from iosim.schedules.mla_decode import NOPE, VALUE, MlaDecode, counts, dram
from iosim.timing.mla import attention_time, reference
from iosim.timing.roofline import predict
from iosim.validation import hbm_rule

ROOT = Path(__file__).resolve().parent.parent
# (sequences, cached tokens): one new token each; the last four added with iosim.timing.mla (more SMs' worth of
# blocks, longer caches, a grid over one wave): none is a shape the kernel's step is measured on
SHAPES = ((64, 4096), (64, 32768), (1, 32768), (128, 2048), (16, 16384), (96, 8192), (200, 1024), (32, 65536))
STAGES = ("q_absorb", "cat", "attention", "o_absorb")
JUDGED = {"q_absorb": 0, "attention": 1, "o_absorb": 2}  # stage -> the schedule's kernel (mla_decode.counts)
SCALE = (NOPE + 64) ** -0.5  # DeepSeek-V3's softmax scale: a query's 128 + 64 values per head
CHECK_TOL = 1e-2  # bf16 step against float64: relative Frobenius error
CSV_FIELDS = ("batch", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "global_read", "global_write", "ms",
              "sdpa_backend", "commit")
METRICS = {"dram_read": "dram__bytes_read.sum", "dram_write": "dram__bytes_write.sum",
           "global_read": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
           "global_write": "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"}


def inputs(torch, batch: int, kv_len: int, m: MlaDecode, seed: int = 0) -> dict:
    """The step's tensors in the layouts a serving stack keeps: q_nope (B, H, 128), q_rope (B, H, 64), the cache
    (B, kv_len, 576) (c_KV then k_R), W_UK (H, 128, 512), W_UV (H, 512, 128); unit-variance values, weights scaled
    by 1/sqrt(fan-in)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    H = m.heads
    return {"q_nope": torch.randn(batch, H, NOPE, **bf), "q_rope": torch.randn(batch, H, m.rope, **bf),
            "cache": torch.randn(batch, kv_len, m.key_dim, **bf),
            "w_uk": torch.randn(H, NOPE, m.latent, **bf) / NOPE ** 0.5,
            "w_uv": torch.randn(H, m.latent, VALUE, **bf) / m.latent ** 0.5}


BACKENDS = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")  # SDPA's, tried in turn: the first that takes the shape


def stages(torch, x: dict, m: MlaDecode, backend: str = BACKENDS[0]) -> dict:
    """The four stages as functions; each reads what the previous one left in ``x``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional

    def q_absorb():
        x["q_latent"] = torch.bmm(x["q_nope"].transpose(0, 1), x["w_uk"])  # (H, B, 512)

    def cat():
        x["q"] = torch.cat([x["q_latent"].transpose(0, 1), x["q_rope"]], dim=-1)  # (B, H, 576)

    def attention():
        c = x["cache"][:, None]  # one kv head: (B, 1, N, 576)
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            x["o_latent"] = F.scaled_dot_product_attention(x["q"][:, None], c, c[..., :m.latent], scale=SCALE)[:, 0]

    def o_absorb():
        x["o"] = torch.bmm(x["o_latent"].transpose(0, 1), x["w_uv"])  # (H, B, 128)

    return dict(zip(STAGES, (q_absorb, cat, attention, o_absorb), strict=True))


def expanded_reference(torch, x: dict, m: MlaDecode):
    """O (H, B, 128) of the step without absorption, in float64: per head K = [c_KV W_UK^T ; k_R], V = c_KV W_UV."""
    c = x["cache"].double()
    lat, rope = c[..., :m.latent], c[..., m.latent:]
    k_nope = torch.einsum("btc,hdc->bhtd", lat, x["w_uk"].double())  # (B, H, N, 128)
    v = torch.einsum("btc,hcv->bhtv", lat, x["w_uv"].double())  # (B, H, N, 128)
    s = (torch.einsum("bhd,bhtd->bht", x["q_nope"].double(), k_nope)
         + torch.einsum("bhr,btr->bht", x["q_rope"].double(), rope)) * SCALE
    return torch.einsum("bht,bhtv->bhv", s.softmax(-1), v).transpose(0, 1)


def check(torch, m: MlaDecode) -> tuple[str, float]:
    """(SDPA backend, relative error of the bf16 absorbed step against the float64 expanded one), 2 sequences of 300
    tokens; the backend is the first of BACKENDS that takes the shape."""
    x = inputs(torch, 2, 300, m, seed=1)
    for backend in BACKENDS:
        try:
            for fn in stages(torch, x, m, backend).values():
                fn()
            break
        except RuntimeError as e:
            print(f"SDPA {backend} refused the step: {str(e).splitlines()[0][:200]}", flush=True)
    else:
        raise RuntimeError("no SDPA backend ran the MLA step")
    ref = expanded_reference(torch, x, m)
    return backend, float((x["o"].double() - ref).norm() / ref.norm())


def child(shape_index: int, backend: str) -> None:
    """Under ncu (--profile-from-start off): one shape's step, warmed up, then once inside the profiled window."""
    import torch

    batch, kv_len = SHAPES[shape_index]
    m = MlaDecode(batch=batch, kv_len=kv_len)
    x = inputs(torch, batch, kv_len, m)
    profiled_once(torch, stages(torch, x, m, backend))


def profiled_once(torch, fns: dict) -> None:
    """The stages ``fns`` twice to warm up, then once inside the profiled window (cudaProfilerStart / Stop)."""
    for _ in range(2):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def listed_and_timed(torch, fns: dict, reps: int) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Each stage's kernels (:func:`kernel_lists`) and its median ms over ``reps`` CUDA-event intervals."""
    return kernel_lists(torch, fns), {s: time_ms(fn, reps, 3) for s, fn in fns.items()}


def kernel_lists(torch, fns: dict) -> dict[str, list[str]]:
    """The kernels each stage launches, in order (torch's profiler, one warm call of each stage)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        out[name] = [e.name for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name
                     and "Memset" not in e.name]
    return out


def by_stage(launched: list[dict], names: dict[str, list[str]]) -> tuple[dict[str, list[dict]], list[dict]]:
    """Nsight Compute's kernels (``launched``, in launch order) given to the stages in turn, as many to each as torch's
    profiler listed for it (``names``, :func:`kernel_lists`); and those left over."""
    out, at = {}, 0
    for stage, listed in names.items():
        out[stage] = launched[at:at + len(listed)]
        at += len(listed)
    return out, launched[at:]


def ncu_kernels(shape_index: int, backend: str) -> list[dict]:
    """Each kernel of one shape's profiled step, in launch order: its name and METRICS' values."""
    got = kernel_metrics(__file__, ["--child", str(shape_index), "--backend", backend], tuple(METRICS.values()))
    return [{"name": k["name"]} | {key: k.get(metric, 0) for key, metric in METRICS.items()} for k in got]


def measure(device: str, reps: int, out: Path) -> int:
    import torch

    m0 = MlaDecode(batch=1, kv_len=1)
    backend, err = check(torch, m0)
    print(f"absorbed bf16 step (SDPA {backend}) against float64 without absorption: {err:.2e} (tolerance "
          f"{CHECK_TOL})", flush=True)
    record = device_header(device, reps) | {"check_error": err, "sdpa_backend": backend, "rows": []}
    for i, (batch, kv_len) in enumerate(SHAPES):
        m = MlaDecode(batch=batch, kv_len=kv_len)
        x = inputs(torch, batch, kv_len, m)
        names, times = listed_and_timed(torch, stages(torch, x, m, backend), reps)
        launched = ncu_kernels(i, backend)
        row = {"batch": batch, "kv_len": kv_len, "stages": {}}
        staged, left = by_stage(launched, names)
        for s, ks in staged.items():
            row["stages"][s] = {"kernels": [k["name"][:80] for k in ks], "profiler_kernels": names[s],
                                **{key: sum(k[key] for k in ks) for key in METRICS}, "ms": times[s]}
        row["unassigned_kernels"] = [k["name"][:80] for k in left]
        record["rows"].append(row)
        print(f"[{i + 1}/{len(SHAPES)}] B={batch} N={kv_len}: " + "; ".join(
            f"{s} {v['ms']:.4f} ms {v['dram_read'] / 1e6:.2f}/{v['dram_write'] / 1e6:.2f} MB"
            for s, v in row["stages"].items()), flush=True)
        del x
        torch.cuda.empty_cache()
    print(f"wrote {save_record(record, out / f'{device}-mla.json')}")
    return 0 if err < CHECK_TOL else 1


def within(sim: int, meas: int, direction: str, compulsory: int) -> bool:
    """iosim.validation's hbm rule on one stage: the bound, or the floor of 1% of its compulsory bytes."""
    return bool(hbm_rule(sim, meas, direction, compulsory))


def mb(sim: float | None, meas: float | None, verdict: str = "") -> str:
    """A cell: simulated / measured MB, and the verdict where there is one."""
    sim_s = "-" if sim is None else f"{sim / 1e6:.2f}"
    meas_s = "-" if meas is None else f"{meas / 1e6:.2f}"
    return f"{sim_s} / {meas_s}" + (f" {verdict}" if verdict else "")


def attention_cells(row: dict, profile) -> tuple[list[str], float | None, float]:
    """The attention stage's cells (global read, global write, DRAM read, DRAM write), the model's ms (None where
    the profile has not measured the kernel's step) and the roofline's ms: torch's kernel against the counts of
    its design (:func:`iosim.timing.mla.reference`), exact at ``global``; DRAM against the compulsory bytes."""
    m, ref = MlaDecode(batch=row["batch"], kv_len=row["kv_len"]), reference(row["batch"], row["kv_len"])
    meas, c, d = row["stages"]["attention"], counts(ref).kernels[1], dram(ref)[1]
    cells = []
    for sim, x in ((c.global_read_bytes, "read"), (c.global_write_bytes, "write")):
        got = meas.get(f"global_{x}")
        cells.append(mb(sim, got, "" if got is None else ("exact" if got == sim else "no")))
    cells += [mb(d[0], meas["dram_read"], "(floor)"), mb(d[1], meas["dram_write"], "(floor)")]
    t = attention_time(ref, profile)
    roof = predict(counts(m), [r + w for r, w in dram(m)], m.dtype, profile).kernels[1].predicted_s
    return cells, None if t is None else t.predicted_s * 1e3, roof * 1e3


def table(device: str, path: Path) -> list[float]:
    """Each shape's judged stages (the projections' DRAM bytes by the rule, the attention's global bytes exactly)
    and time (the projections' roofline, the attention's model) against measured; returns the attention rows'
    relative time errors |model - measured| / measured."""
    rec = json.loads(path.read_text())
    profile = get_profile(PROFILE[device])
    print(f"{rec.get('device', device)}, commit {rec.get('commit', '?')}; SDPA {rec['sdpa_backend']}; absorbed step "
          f"against float64 {rec['check_error']:.1e}\n")
    print("| sequences x keys | schedule's kernel | torch's kernel | global read MB, sim / meas | global write MB | "
          "DRAM read MB, sim / meas | DRAM write MB | ms: roofline / model / measured |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for row in rec["rows"]:
        m = MlaDecode(batch=row["batch"], kv_len=row["kv_len"])
        c, d = counts(m).kernels, dram(m)
        est = predict(counts(m), [r + w for r, w in d], m.dtype, profile)
        shape = f"| {row['batch']} x {row['kv_len']} |"
        for s, k in JUDGED.items():
            meas = row["stages"][s]
            if s == "attention":
                cells, model, roof = attention_cells(row, profile)
                if model is not None:
                    errors.append(abs(model - meas["ms"]) / meas["ms"])
                time_cell = f"{roof:.4f} / {'-' if model is None else f'{model:.4f}'} / {meas['ms']:.4f}"
                print(f"{shape} {c[k].name} (torch's design) | {short(meas['kernels'])} | {' | '.join(cells)} | "
                      f"{time_cell} |")
                continue
            verdict = [within(d[k][i], meas[f"dram_{x}"], x, sum(d[k])) for i, x in enumerate(("read", "write"))]
            print(f"{shape} {c[k].name} | {short(meas['kernels'])} | - | - | "
                  f"{mb(d[k][0], meas['dram_read'], 'yes' if verdict[0] else 'no')} | "
                  f"{mb(d[k][1], meas['dram_write'], 'yes' if verdict[1] else 'no')} | "
                  f"{est.kernels[k].predicted_s * 1e3:.4f} / - / {meas['ms']:.4f} |")
        cat = row["stages"]["cat"]
        print(f"{shape} (none) | {short(cat['kernels'])} | - | - | {mb(None, cat['dram_read'])} | "
              f"{mb(None, cat['dram_write'])} | - / - / {cat['ms']:.4f} |")
    if errors:
        e = sorted(errors)
        print(f"\nattention time, model against measured ({len(e)} rows): median {e[len(e) // 2] * 100:.1f}%, "
              f"worst {e[-1] * 100:.1f}%")
    else:
        print(f"\nattention time: no model ({profile.name} has not measured the kernel's step: iosim calibrate rates)")
    return errors


def write_csv(path: Path, csv_path: Path) -> None:
    """The record at ``path`` as the report reads it: one row a stage of each shape, measured only."""
    rec = json.loads(path.read_text())
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in rec["rows"]:
            for s in STAGES:
                st = row["stages"][s]
                w.writerow({"batch": row["batch"], "kv_len": row["kv_len"], "stage": s,
                            "torch_kernels": short(st["kernels"]), "dram_read": st["dram_read"],
                            "dram_write": st["dram_write"], "global_read": st.get("global_read", ""),
                            "global_write": st.get("global_write", ""), "ms": f"{st['ms']:.6f}",
                            "sdpa_backend": rec["sdpa_backend"], "commit": rec.get("commit", "")})
    print(f"wrote {csv_path}")


def short(kernels: list[str]) -> str:
    """A stage's kernels, each by its name without namespaces, template arguments and parameters."""
    names = []
    for k in kernels:
        k = k.replace("<unnamed>", "").replace("(anonymous namespace)", "").replace("void ", "")
        names.append(k.split("(")[0].split("<")[0].split("::")[-1])
    return ", ".join(names) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE))
    ap.add_argument("--measure", action="store_true", help="measure on this GPU")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON (default data/validation)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backend", default=BACKENDS[0], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child, args.backend)
        return 0
    if args.device is None:
        ap.error("--device is required")
    out = args.out or ROOT / "data/validation"
    rc = measure(args.device, args.reps, out) if args.measure else 0
    record = out / f"{args.device}-mla.json"
    if not record.exists():
        print(f"mla_record: no record {record} (python benchmarks/mla_record.py --measure --device {args.device} "
              "on the GPU writes it)", file=sys.stderr)
        return 2
    table(args.device, record)
    if args.out is None:  # the committed record: the report's CSV follows it
        write_csv(record, ROOT / "docs/validation" / f"{args.device}-mla.csv")
    return rc


if __name__ == "__main__":
    sys.exit(main())
