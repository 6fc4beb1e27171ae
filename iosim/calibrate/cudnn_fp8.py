"""cuDNN's FP8 (e4m3) attention forward through NVIDIA's cudnn-frontend Python package (``import cudnn``), the measured
peer of iosim's FP8 forward: timed beside it by benchmarks/bench_fp8.py and benchmarks/time_record_fp8.py, and its
step by ``iosim calibrate rates`` (:mod:`iosim.calibrate.cudnn_step`).

One graph per (shape, causal), built once off the timed path: ``pygraph(io_data_type=FP8_E4M3)``, Q, K, V as
(B, H, N, d) views of the (B, N, H, d) buffers (strides (N H d, d, H d, 1); K and V with the shape's ``kv_heads``
where it has grouped-query heads and its ``kv_len`` keys where they differ from the queries), ``sdpa_fp8`` with a
descale for each of Q, K, V and S (= P), a scale for S and O, the amax of S and O as outputs, no softmax stats
(inference), causal as the frontend's preferred mask (``diagonal_alignment=TOP_LEFT, right_bound=0``). The output
type is the first of :data:`OUT_TYPES` the installed cuDNN builds a plan for (bf16 is our kernel's; cuDNN's Hopper
FP8 forward may only write fp16 or fp8; a caller may ask for fewer, ``out_types``); each refusal's reason is kept.
Inputs: the benchmark's bf16 tensors quantized per tensor with a power-of-two scale (amax x scale <= 448, e4m3's
largest finite value), so descale = 1 / scale exactly.

Nothing here imports torch or cudnn: the caller passes both modules in (the graph builder only needs ``cudnn``, so
tests drive it with a stand-in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
P_SCALE = 256.0  # S (softmax probabilities, <= 1) scaled into e4m3: 1 x 256 <= 448, a power of two
OUT_TYPES = ("bf16", "fp16", "fp8")  # tried in this order
UID = {"q": 1, "k": 2, "v": 3, "o": 4, "descale_q": 5, "descale_k": 6, "descale_v": 7, "descale_s": 8,
       "scale_s": 9, "scale_o": 10, "amax_s": 11, "amax_o": 12}
SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def pow2_scale(amax: float, fmax: float = E4M3_MAX) -> float:
    """The largest power of two s with amax * s <= fmax (1 where amax is 0 or not finite)."""
    if not (amax > 0 and math.isfinite(amax)):
        return 1.0
    return 2.0 ** math.floor(math.log2(fmax / amax))


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    kv_heads: int | None = None  # K and V's heads (grouped-query); None: heads
    kv_len: int | None = None  # K and V's tokens; None: seq_len

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def keys(self) -> int:
        return self.kv_len or self.seq_len


def _cudnn_type(cudnn, name: str):
    return {"bf16": cudnn.data_type.BFLOAT16, "fp16": cudnn.data_type.HALF, "fp8": cudnn.data_type.FP8_E4M3}[name]


def build_graph(cudnn, s: Shape, causal: bool, out: str):
    """The FP8 forward graph of one shape, its plan built (raises what cudnn raises where it is not supported)."""
    b, n, h, d, hk, nk = s.batch, s.seq_len, s.heads, s.head_dim, s.kv, s.keys
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=f32, compute_data_type=f32)
    stride = (n * h * d, d, h * d, 1)  # (B, H, N, d) dims over a (B, N, H, d) buffer
    kv_stride = (nk * hk * d, d, hk * d, 1)
    qkv = {x: g.tensor(uid=UID[x], dim=(b, h, n, d) if x == "q" else (b, hk, nk, d),
                       stride=stride if x == "q" else kv_stride, data_type=cudnn.data_type.FP8_E4M3)
           for x in ("q", "k", "v")}
    one = (1, 1, 1, 1)
    scalars = {x: g.tensor(uid=UID[x], dim=one, stride=one, data_type=f32) for x in SCALARS}
    mask = {"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, "right_bound": 0} if causal else {}
    o, _stats, amax_s, amax_o = g.sdpa_fp8(**qkv, **scalars, generate_stats=False, attn_scale=d ** -0.5, **mask)
    o.set_uid(UID["o"]).set_output(True).set_dim((b, h, n, d)).set_stride(stride).set_data_type(_cudnn_type(cudnn, out))
    for name, t in (("amax_s", amax_s), ("amax_o", amax_o)):
        t.set_uid(UID[name]).set_output(True).set_dim(one).set_stride(one).set_data_type(f32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def first_supported(cudnn, s: Shape, causal: bool, out_types=OUT_TYPES) -> tuple[Any, str | None, list[str]]:
    """(graph, its output type, why each type before it was refused); (None, None, reasons) where none builds."""
    why = []
    for out in out_types:
        try:
            return build_graph(cudnn, s, causal, out), out, why
        except Exception as exc:  # cudnnGraphNotSupportedError, or any error of an older or newer frontend
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            why.append(f"{out} out: {type(exc).__name__}: {first}")
    return None, None, why


@dataclass
class CudnnFp8:
    """One shape's built graph and everything its execute() call needs."""

    graph: Any
    out_type: str
    handle: Any
    pack: dict = field(default_factory=dict)
    workspace: Any = None
    o_scale: float = 1.0

    def __call__(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)

    def output(self, torch):
        """O as float32 (B, N, H, d), scale undone."""
        return self.pack[UID["o"]].float() / self.o_scale


def quantize_per_tensor(torch, x) -> tuple[Any, float]:
    """(x in float8_e4m3fn, its descale): one power-of-two scale for the whole tensor."""
    scale = pow2_scale(float(x.abs().max().float()))
    return (x.float() * scale).to(torch.float8_e4m3fn), 1.0 / scale


def poison(torch, o) -> None:
    """NaN in every element of an output buffer (0x7F is NaN in e4m3fn)."""
    if o.dtype == torch.float8_e4m3fn:
        o.view(torch.uint8).fill_(0x7F)
    else:
        o.fill_(float("nan"))


def prepare(torch, cudnn, handle, inputs, causal: bool, out_types=OUT_TYPES) -> tuple[CudnnFp8 | None, str]:
    """The callable cuDNN FP8 forward on ``inputs`` = (q, k, v) bf16 (B, N, H, d), K and V (B, N_k, H_k, d) with H or
    fewer heads (grouped-query), its output (the first of ``out_types`` cuDNN builds) poisoned, or (None, why not)."""
    q, k, v = inputs
    B, N, H, d = q.shape
    graph, out, why = first_supported(cudnn, Shape(B, N, H, d, int(k.shape[2]), int(k.shape[1])), causal, out_types)
    if graph is None:
        return None, "; ".join(why)
    (q8, dq), (k8, dk), (v8, dv) = (quantize_per_tensor(torch, x) for x in (q, k, v))
    o_scale = pow2_scale(float(v.abs().max().float())) if out == "fp8" else 1.0  # |O| <= max |V|
    odt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[out]
    o = torch.empty(q.shape, dtype=odt, device=q.device)
    poison(torch, o)

    def scalar(x):
        return torch.full((1, 1, 1, 1), x, dtype=torch.float32, device=q.device)

    pack = {UID["q"]: q8, UID["k"]: k8, UID["v"]: v8, UID["o"]: o,
            UID["descale_q"]: scalar(dq), UID["descale_k"]: scalar(dk), UID["descale_v"]: scalar(dv),
            UID["descale_s"]: scalar(1 / P_SCALE), UID["scale_s"]: scalar(P_SCALE), UID["scale_o"]: scalar(o_scale),
            UID["amax_s"]: scalar(math.nan), UID["amax_o"]: scalar(math.nan)}
    ws = torch.empty(max(1, graph.get_workspace_size()), dtype=torch.uint8, device=q.device)
    note = f"out {out}" + (f" ({'; '.join(why)})" if why else "")
    return CudnnFp8(graph, out, handle, pack, ws, o_scale), note


def open_handle(torch, cudnn):
    """A cuDNN handle on torch's current stream (the stream the CUDA events time)."""
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    return handle
