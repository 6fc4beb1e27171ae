"""MLA prefill against a torch reference (issue 28 item 4): DeepSeek-V3's prefill of a chunk of new tokens run by
torch, each kernel's DRAM bytes (Nsight Compute) and time beside what iosim.schedules.mla_prefill counts and the time
model predicts for the same call.

    python benchmarks/mla_prefill_record.py --measure --device h200 [--out DIR]   # on the GPU (about two minutes)
    python benchmarks/mla_prefill_record.py --device h200                         # anywhere: the table

The reference (bf16, 128 heads, a latent cache of 512 + 64 values a token, causal) runs the way torch and vLLM run
MLA prefill (the schedule's ``expansion="gemm+cat"``): one GEMM c_KV · [W_UK | W_UV] writes each head's K_nope and V
side by side (``torch.matmul``, cuBLAS), a copy joins K = [K_nope ; k_R] with k_R broadcast over the heads
(``torch.cat``), and cuDNN's fused attention takes queries and keys of 192 values and V where the GEMM left it (rows
of 128 values, 256 apart). A first prefill (a sequence's queries on its own keys) calls it through
``scaled_dot_product_attention``'s cuDNN backend; a chunk after a cached prefix (its queries the last of ``kv_len``
keys, causal bottom-right, which SDPA's cuDNN backend takes only as a dense mask) through cudnn-frontend's sdpa with
the diagonal aligned bottom-right, the expansion then over every key the chunk sees. Before any timing both paths
are checked against the same prefill in float64 (2 sequences of 300 tokens, a ragged last tile; and a chunk of 200
on 500 keys).

Bytes: one process per shape under ``ncu --cache-control all --profile-from-start off`` (L2 flushed before each
kernel), each kernel given to its stage by the kernel list torch's profiler records for each stage (run first,
without ncu). Every stage's DRAM reads and writes are judged by iosim.validation's rule for ``hbm`` (5% reads, 10%
writes, or 1% of the stage's compulsory bytes) against :func:`iosim.schedules.mla_prefill.dram`; the attention
kernel's launch (grid, threads, registers, shared memory) and its global atomics (cuDNN's tile counter: one a tile
and one a block) are kept beside them.

Time: the median of ``--reps`` CUDA-event intervals of each stage on a busy stream (benchmarks/cuda_events.py). The
attention's is set beside :func:`iosim.timing.mla.prefill_attention_time` (the ``cudnn`` description's fa3 model
with values of 128 against keys of 192: no rate or constant of it taken from these shapes or measured on them), the
GEMM's and the copy's beside :func:`iosim.timing.roofline.predict` of their counts and DRAM bytes. Writes
``<out>/<device>-mla-prefill.json`` (default data/validation) and, from it, ``docs/validation/<device>-mla-prefill.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from mla_record import by_stage, listed_and_timed, mb, profiled_once, short, within  # beside this file
from ncu_child import kernel_metrics  # beside this file
from time_record import PROFILE, device_header, save_record  # beside this file

from iosim.hardware.gpu import get_profile
from iosim.schedules.mla_decode import NOPE, VALUE
from iosim.schedules.mla_prefill import MlaPrefill, counts, dram
from iosim.timing.mla import PREFILL_REFERENCE, prefill_attention_time, prefill_reference
from iosim.timing.roofline import predict

ROOT = Path(__file__).resolve().parent.parent
# (sequences, new tokens each, keys they see): first prefills (from 16 x 256, a tile or two a Q tile, to one long
# sequence), then chunks after a cached prefix
SHAPES = ((1, 1024, 1024), (1, 4096, 4096), (1, 8192, 8192), (1, 16384, 16384), (2, 2048, 2048), (4, 1024, 1024),
          (8, 512, 512), (16, 256, 256), (1, 1024, 4096), (1, 4096, 16384), (4, 1024, 8192), (2, 2048, 6144))
STAGES = ("kv_up", "k_cat", "attention")  # torch's, in order; each is one kernel of the schedule (mla_prefill.counts)
SCALE = (NOPE + 64) ** -0.5  # DeepSeek-V3's softmax scale: a query's 128 + 64 values per head
CHECK_TOL = 1e-2  # bf16 prefill against float64: relative Frobenius error
METRICS = {"dram_read": "dram__bytes_read.sum", "dram_write": "dram__bytes_write.sum",
           "grid": "launch__grid_size", "threads": "launch__block_size",
           "registers": "launch__registers_per_thread", "smem": "launch__shared_mem_per_block",
           "atomics": "sm__sass_inst_executed_op_global_atom.sum"}
CSV_FIELDS = ("batch", "seq_len", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "ms", "commit")


def inputs(torch, m: MlaPrefill, seed: int = 0) -> dict:
    """The call's tensors in the layouts a serving stack keeps: q (B, N, H, 192), the latent cache (B, N_k, 576)
    (c_KV then k_R), W_UKV (512, H x 256), head h's columns [W_UK_h | W_UV_h]; unit-variance values, the weight
    scaled by 1/sqrt(512)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    return {"q": torch.randn(m.batch, m.seq_len, m.heads, m.key_dim, **bf),
            "cache": torch.randn(m.batch, m.kv_len, m.latent + m.rope, **bf),
            "w_ukv": torch.randn(m.latent, m.heads * (NOPE + VALUE), **bf) / m.latent ** 0.5}


def stages(torch, x: dict, m: MlaPrefill) -> dict:
    """The three stages as functions; each reads what the previous one left in ``x`` (K_nope and V, then K, written
    into buffers allocated here, once)."""
    B, Nk, H = m.batch, m.kv_len, m.heads
    x["kv"] = torch.empty(B, Nk, H, NOPE + VALUE, device="cuda", dtype=torch.bfloat16)
    x["k"] = torch.empty(B, Nk, H, m.key_dim, device="cuda", dtype=torch.bfloat16)

    def kv_up():
        torch.matmul(x["cache"][..., :m.latent], x["w_ukv"], out=x["kv"].view(B, Nk, H * (NOPE + VALUE)))

    def k_cat():
        k_rope = x["cache"][:, :, None, m.latent:].expand(B, Nk, H, m.rope)
        torch.cat([x["kv"][..., :NOPE], k_rope], dim=-1, out=x["k"])  # (B, N_k, H, 192)

    attend = sdpa_attention(torch, x, m) if m.seq_len == m.kv_len else chunk_attention(torch, x, m)
    return dict(zip(STAGES, (kv_up, k_cat, attend), strict=True))


def sdpa_attention(torch, x: dict, m: MlaPrefill):
    """A first prefill's attention: SDPA's cuDNN backend, causal, V in place (rows of 128 values, 256 apart)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attention():
        v = x["kv"][..., NOPE:]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            x["o"] = torch.nn.functional.scaled_dot_product_attention(
                x["q"].transpose(1, 2), x["k"].transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=SCALE)

    return attention


def chunk_attention(torch, x: dict, m: MlaPrefill):
    """A chunk's attention on every key it sees: cudnn-frontend's sdpa, causal with the diagonal aligned bottom-right,
    on the same tensors (built once here, off the timed path; K and V are the stages' buffers, filled before it
    runs)."""
    import cudnn

    from iosim.calibrate.cudnn_fp8 import open_handle

    B, N, H = m.batch, m.seq_len, m.heads
    x["o"] = torch.full((B, H, N, VALUE), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    views = {1: x["q"].transpose(1, 2), 2: x["k"].transpose(1, 2), 3: x["kv"][..., NOPE:].transpose(1, 2), 4: x["o"]}
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32)
    q, k, v = (g.tensor(uid=u, dim=tuple(t.shape), stride=tuple(t.stride()), data_type=bf16)
               for u, t in ((u, views[u]) for u in (1, 2, 3)))
    o, _ = g.sdpa(q=q, k=k, v=v, generate_stats=False, attn_scale=SCALE,
                  diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0)
    o.set_uid(4).set_output(True).set_dim(tuple(x["o"].shape)).set_stride(tuple(x["o"].stride())).set_data_type(bf16)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    handle = open_handle(torch, cudnn)

    def attention():
        g.execute(views, ws, handle=handle)

    return attention


def reference(torch, x: dict, m: MlaPrefill):
    """O (B, H, N, 128) of the same prefill in float64: per head K = [c_KV W_UK ; k_R], V = c_KV W_UV, causal
    bottom-right (query i sees key j <= i + N_k - N)."""
    B, N, Nk, H = m.batch, m.seq_len, m.kv_len, m.heads
    c = x["cache"].double()
    kv = (c[..., :m.latent] @ x["w_ukv"].double()).view(B, Nk, H, NOPE + VALUE)
    k = torch.cat([kv[..., :NOPE], c[:, :, None, m.latent:].expand(B, Nk, H, m.rope)], dim=-1)
    s = torch.einsum("bihd,bjhd->bhij", x["q"].double(), k) * SCALE
    s = s.masked_fill(torch.ones(N, Nk, dtype=torch.bool, device=s.device).triu(Nk - N + 1), float("-inf"))
    return torch.einsum("bhij,bjhv->bhiv", s.softmax(-1), kv[..., NOPE:])


def check(torch) -> float:
    """The larger relative error of the bf16 call against float64: 2 sequences of 300 tokens (SDPA), 2 chunks of
    200 tokens on 500 keys (cudnn-frontend)."""
    errors = []
    for n, nk in ((300, 300), (200, 500)):
        m = prefill_reference(2, n, nk)
        x = inputs(torch, m, seed=1)
        for fn in stages(torch, x, m).values():
            fn()
        ref = reference(torch, x, m)
        errors.append(float((x["o"].double() - ref).norm() / ref.norm()))
    return max(errors)


def child(shape_index: int) -> None:
    """Under ncu (--profile-from-start off): one shape's call, warmed up, then once inside the profiled window."""
    import torch

    m = prefill_reference(*SHAPES[shape_index])
    profiled_once(torch, stages(torch, inputs(torch, m), m))


def measure(device: str, reps: int, out: Path) -> int:
    import torch

    err = check(torch)
    print(f"bf16 prefill (SDPA's cuDNN; a chunk, cudnn-frontend) against float64: {err:.2e} (tolerance {CHECK_TOL})",
          flush=True)
    record = device_header(device, reps) | {"check_error": err, "rows": []}
    for i, (batch, seq_len, kv_len) in enumerate(SHAPES):
        m = prefill_reference(batch, seq_len, kv_len)
        x = inputs(torch, m)
        names, times = listed_and_timed(torch, stages(torch, x, m), reps)
        launched = kernel_metrics(__file__, ["--child", str(i)], tuple(METRICS.values()))
        row = {"batch": batch, "seq_len": seq_len, "kv_len": kv_len, "stages": {}}
        staged, left = by_stage(launched, names)
        for s, ks in staged.items():
            row["stages"][s] = {"kernels": [k["name"][:100] for k in ks], "profiler_kernels": names[s],
                                "dram_read": sum(k.get(METRICS["dram_read"], 0) for k in ks),
                                "dram_write": sum(k.get(METRICS["dram_write"], 0) for k in ks), "ms": times[s]}
            if s == "attention":
                row["stages"][s]["launch"] = [{key: k.get(metric, 0) for key, metric in METRICS.items()} for k in ks]
        row["unassigned_kernels"] = [k["name"][:100] for k in left]
        record["rows"].append(row)
        print(f"[{i + 1}/{len(SHAPES)}] B={batch} N={seq_len} N_k={kv_len}: " + "; ".join(
            f"{s} {v['ms']:.4f} ms {v['dram_read'] / 1e6:.1f}/{v['dram_write'] / 1e6:.1f} MB {short(v['kernels'])}"
            for s, v in row["stages"].items()), flush=True)
        del x
        torch.cuda.empty_cache()
    print(f"wrote {save_record(record, out / f'{device}-mla-prefill.json')}")
    return 0 if err < CHECK_TOL else 1


def attention_kernel(stage: dict) -> dict | None:
    """The launch of the stage's cuDNN kernel (the one :data:`PREFILL_REFERENCE` names), or None."""
    for name, launch in zip(stage["kernels"], stage.get("launch", []), strict=False):
        if name.startswith(PREFILL_REFERENCE.name):
            return launch
    return None


def table(device: str, path: Path) -> list[float]:
    """Each shape's stages: DRAM bytes judged by the rule against the schedule's, time against the model (the
    attention) or the roofline (the GEMM and the copy); returns the attention rows' relative time errors
    |model - measured| / measured."""
    rec = json.loads(path.read_text())
    profile = get_profile(PROFILE[device])
    print(f"{rec.get('device', device)}, commit {rec.get('commit', '?')}; cuDNN (SDPA; chunks, cudnn-frontend); the "
          f"prefill against float64 {rec['check_error']:.1e}\n")
    print("| sequences x tokens (on keys) | schedule's kernel | torch's kernels | DRAM read MB, sim / meas | DRAM write MB | "
          "ms: roofline / model / measured | error |")
    print("|---|---|---|---|---|---|---|")
    errors = []
    for row in rec["rows"]:
        m = prefill_reference(row["batch"], row["seq_len"], row["kv_len"])
        c, d = counts(m).kernels, dram(m)
        roof = predict(counts(m), [r + w for r, w in d], m.dtype, profile)
        for k, s in enumerate(STAGES):
            meas = row["stages"][s]
            verdict = [within(d[k][i], meas[f"dram_{x}"], x, sum(d[k])) for i, x in enumerate(("read", "write"))]
            model, err = "-", "-"
            if s == "attention":
                t = prefill_attention_time(m, profile).predicted_s * 1e3
                errors.append((t - meas["ms"]) / meas["ms"])
                model, err = f"{t:.4f}", f"{errors[-1] * 100:+.1f}%"
            print(f"| {shape(row)} | {c[k].name} | {short(meas['kernels'])} | "
                  f"{mb(d[k][0], meas['dram_read'], 'yes' if verdict[0] else 'no')} | "
                  f"{mb(d[k][1], meas['dram_write'], 'yes' if verdict[1] else 'no')} | "
                  f"{roof.kernels[k].predicted_s * 1e3:.4f} / {model} / {meas['ms']:.4f} | {err} |")
    launches = [attention_kernel(row["stages"]["attention"]) for row in rec["rows"]]
    for row, launch in zip(rec["rows"], launches, strict=True):
        if launch is not None:
            tiles = row["batch"] * 128 * -(-row["seq_len"] // PREFILL_REFERENCE.block_q)
            print(f"\n{shape(row)}: cuDNN's launch {launch['grid']} blocks of {launch['threads']} "
                  f"threads, {launch['registers']} registers, {launch['smem']} B shared; {launch['atomics']} global "
                  f"atomics ({tiles} Q tiles of {PREFILL_REFERENCE.block_q} + {launch['grid']} blocks = "
                  f"{tiles + launch['grid']})", end="")
    e = sorted(abs(x) for x in errors)
    print(f"\n\nattention time, model against measured ({len(e)} rows): median {e[len(e) // 2] * 100:.1f}%, "
          f"worst {e[-1] * 100:.1f}%")
    return errors


def shape(row: dict) -> str:
    """A row's shape: sequences x new tokens, and the keys they see where those are more (a chunk)."""
    chunk = f" on {row['kv_len']}" if row["kv_len"] != row["seq_len"] else ""
    return f"{row['batch']} x {row['seq_len']}{chunk}"


def write_csv(path: Path, csv_path: Path) -> None:
    """The record at ``path`` as the report reads it: one row a stage of each shape, measured only."""
    rec = json.loads(path.read_text())
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in rec["rows"]:
            for s in STAGES:
                st = row["stages"][s]
                w.writerow({"batch": row["batch"], "seq_len": row["seq_len"], "kv_len": row["kv_len"], "stage": s,
                            "torch_kernels": short(st["kernels"]), "dram_read": st["dram_read"],
                            "dram_write": st["dram_write"], "ms": f"{st['ms']:.6f}", "commit": rec.get("commit", "")})
    print(f"wrote {csv_path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE))
    ap.add_argument("--measure", action="store_true", help="measure on this GPU")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON (default data/validation)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return 0
    if args.device is None:
        ap.error("--device is required")
    out = args.out or ROOT / "data/validation"
    rc = measure(args.device, args.reps, out) if args.measure else 0
    record = out / f"{args.device}-mla-prefill.json"
    if not record.exists():
        print(f"mla_prefill_record: no record {record} (python benchmarks/mla_prefill_record.py --measure --device "
              f"{args.device} on the GPU writes it)", file=sys.stderr)
        return 2
    table(args.device, record)
    if args.out is None:  # the committed record: the report's CSV follows it
        write_csv(record, ROOT / "docs/validation" / f"{args.device}-mla-prefill.csv")
    return rc


if __name__ == "__main__":
    sys.exit(main())
