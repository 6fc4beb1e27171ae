"""Kernels described as data: whose launch and pipeline the time model assumes (``iosim simulate --kernel``).

A description names its **family** (how its work overlaps), its warps per thread block, the order its grid is
launched in and, per head dimension, its tiles (Br = ``block_q``, Bc = ``block_kv``), registers per thread and shared
memory per block (which give the thread blocks resident per SM). Built-ins live in ``iosim/timing/kernels/*.yaml``:

* ``iosim-flash2`` and ``iosim-naive``: this project's kernels (kernels/flash_fwd.cu, kernels/naive.cu);
* ``fa2``: FlashAttention-2 as torch SDPA's flash backend runs it (tiles from its launch template; split-KV for decode);
* ``fa3``: FlashAttention-3's Hopper pipeline (its fp8 tiles FA3's published ones); ``cudnn``: cuDNN's fused
  attention, an FA3-class Hopper kernel; ``iosim-flash3``: this project's kernels/flash3_fwd.cu, whose fp8
  instantiations read iosim's fp8 layout (``fp8_layout: iosim``);
* ``iosim-decode``: this project's Flash-Decoding kernels (kernels/flash_decode.cu), family ``decode``: its tiling
  is the kernel's own (:mod:`iosim.schedules.decode_layout`), its registers per head dim and row stripes are listed.

A user's own kernel is a YAML file with the same fields (``--kernel my-kernel.yaml``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..yaml_io import read_data, validated

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
DEFAULT_KERNEL = {"flash2": "iosim-flash2", "naive": "iosim-naive", "flash3": "fa3"}
# the backward's: FlashAttention-2's kernel, whose tiles and design are the flash2 backward schedule's defaults
DEFAULT_BACKWARD_KERNEL = {"flash2": "fa2-bwd", "flash3": "iosim-flash3-bwd"}


class KernelError(ValueError):
    """An unknown kernel name, an unreadable or invalid description, or a head_dim it has no tiles for."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OtherTiles(_Strict):
    block_q: int = Field(ge=1, description="Br")
    block_kv: int = Field(ge=1, description="Bc")
    registers: int | None = Field(default=None, ge=1, le=255, description="registers per thread (ptxas)")
    q_in_registers: bool | None = Field(default=None, description="as the kernel decides at these tiles (None: a "
                                        "warp's rows <= 16, FlashAttention-2's rule)")


class TileConfig(_Strict):
    block_q: int = Field(ge=1, description="Br: query rows per thread block")
    block_kv: int = Field(ge=1, description="Bc: key/value rows per step")
    registers: int | None = Field(default=None, ge=1, le=255, description="registers per thread (occupancy)")
    smem: int | Literal["iosim", "qkv"] | None = Field(
        default=None, description="shared memory per block: bytes, 'iosim' (kernels/flash_fwd.cu's ring) or 'qkv' "
        "(Q, K, V tiles once: FlashAttention-2's Kernel_traits)")
    q_in_registers: bool = Field(default=False, description="Q's fragments held in registers (not re-read from "
                                 "shared memory at every K/V step)")
    warp_grid: tuple[int, int, int] | None = Field(
        default=None, description="backward (fa2 family): warps along Br of S and dP, along Bc of dK and dV, along "
        "Br of dQ (FlashAttention-2's AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ)")
    dq_reduce_lanes: Literal[1, 2] | None = Field(
        default=None, description="backward: fp32 lanes per reduction instruction of dQ (1: atomicAdd, 2: .v2)")
    others: tuple[OtherTiles, ...] = Field(
        default=(), description="the kernel's other compiled tiles at this head dim, each with its registers (what "
        "`iosim tune` ranks; the rest of this entry applies to them too)")
    step_ops: float = Field(default=0.0, ge=0, description="forward (fa2 family): warp instructions each warp runs "
                            "per K/V step beyond the math the model prices, at the ALU issue rate (set per call for a "
                            "paged cache: iosim.timing.fa2.PAGED_OPS)")

    def with_tiles(self, block_q: int, block_kv: int) -> TileConfig:
        """This entry at other tiles: the registers of the instantiation where ``others`` lists it."""
        if (block_q, block_kv) == (self.block_q, self.block_kv):
            return self
        other = next((o for o in self.others if (o.block_q, o.block_kv) == (block_q, block_kv)), None)
        update = {"block_q": block_q, "block_kv": block_kv, "others": ()}
        if other is not None:
            update |= {"registers": other.registers or self.registers}
            if other.q_in_registers is not None:
                update["q_in_registers"] = other.q_in_registers
        return self.model_copy(update=update)


class SplitKV(_Strict):
    block_q: int = Field(ge=1)
    block_kv: dict[int, int] = Field(description="head_dim -> Bc of the split-KV kernel")


class DecodeKernel(_Strict):
    """A decode kernel's instantiations (family ``decode``): registers by head dim and 16-row stripes per block."""

    registers: dict[int, dict[int, int]] = Field(
        description="head_dim -> {row stripes: registers per thread of the split kernel (ptxas)}")
    combine_registers: int = Field(ge=1, le=255, description="registers per thread of the combine kernel (ptxas)")


# the order a kernel's thread blocks (or a persistent kernel's tiles) reach the SMs: KernelDesc.launch_order
LaunchOrder = Literal["in-order", "causal-longest-first", "persistent", "persistent-in-order", "persistent-iosim"]


class KernelDesc(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    family: Literal["fa2", "fa3", "naive", "decode"] = Field(
        description="fa2: mma.sync, a warp's GEMMs and softmax in sequence, overlapped across warps; fa3: wgmma "
        "ping-pong, softmax under the GEMM, persistent grid; naive: three kernels (GEMM, softmax, GEMM); decode: "
        "iosim's Flash-Decoding (a split kernel streaming the KV cache, then a combine kernel)")
    source: str = Field(min_length=1, description="where the tiles and pipeline come from")
    pass_: Literal["forward", "backward"] = Field(default="forward", alias="pass",
                                                  description="the pass whose kernels it describes")
    gqa: Literal["expand", "grouped"] = Field(
        default="expand", description="backward, grouped-query heads: a block per query head, dK and dV summed "
        "after ('expand', FlashAttention-2), or a block per kv head summing its group ('grouped', iosim's kernel)")
    warps: int = Field(ge=1, le=32, description="warps per thread block")
    launch_order: LaunchOrder = "in-order"
    # persistent: a dynamic tile scheduler (each tile to the block that frees first, longest first: FA3's);
    # persistent-in-order: a dynamic tile scheduler handing the tiles out in the grid's order (a head's tiles in
    # turn, head after head; a causal forward's shortest Q tile first): cuDNN's (docs/timing.md, "the order cuDNN
    # hands its tiles out");
    # persistent-iosim: kernels/flash3_fwd.cu's own assignment (iosim.launch.flash3_schedule: the snake, or the
    # host's greedy schedule of a causal call)
    varlen_grid: Literal["tiles-heads-sequences", "tiles-sequences-heads"] = Field(
        default="tiles-heads-sequences", description="fa2, packed sequences: the varlen grid's axes (x, y, z), so its "
        "launch order (x fastest): kernels/flash_fwd.cu's (Q tiles, heads, sequences), a sequence's tiles from its "
        "last where causal or windowed; FlashAttention-2's mha_varlen_fwd (Q tiles, sequences, heads), in order")
    tiles: dict[int, TileConfig] = Field(default_factory=dict, description="head_dim -> tiles")
    split_kv: SplitKV | None = Field(default=None, description="the split-KV kernel used for decode (seq_len small)")
    fold_gqa_decode: bool = Field(default=False, description="one query with grouped-query heads runs with the "
                                  "group's query heads folded into query rows (FlashAttention-2's mha_fwd: "
                                  "seqlenq_ngroups_swapped), split-KV or not")
    decode: DecodeKernel | None = Field(default=None, description="family decode: the kernel's instantiations")
    masking: Literal["fa2-loop", "diagonal"] | None = Field(
        default=None, description="forward (fa2 family): which K/V steps of a Q block run the kernel's mask, priced "
        "at calibration.forward.masked_step where measured (None: none priced; iosim.timing.fa2.masked); "
        "'fa2-loop', FlashAttention-2's n_masking_steps: a causal block's last ceil(Br / Bc) steps, one more where "
        "the lengths are not whole tiles or the sequences are packed, and a non-causal block's last step in those "
        "cases; 'diagonal', kernels/flash_fwd.cu's: the tiles holding a key past the causal diagonal or the keys' end")
    fp8_tiles: dict[int, TileConfig] = Field(
        default_factory=dict, description="head_dim -> tiles of the fp8 (e4m3) instantiations, where they differ "
        "from ``tiles`` (a head dim past the largest listed: ``tiles``)")
    fp8_launch_order: LaunchOrder | None = Field(
        default=None, description="the fp8 instantiations' launch_order, where it differs from ``launch_order``")
    fp8_layout: Literal["fa3", "iosim"] = Field(
        default="fa3", description="what a fp8 problem's kernel reads: 'fa3', Q, K, V as given (FlashAttention-3's "
        "published kernel; its transpose of V and per-tensor descales cost nothing); 'iosim', iosim's layout (V^T "
        "padded to 16 keys, fp32 block scales, O in bf16: iosim.schedules.flash3_fp8)")

    def decode_registers(self, head_dim: int, stripes: int) -> int:
        """Registers per thread of a decode kernel's split kernel at ``head_dim`` with ``stripes`` row stripes."""
        regs = (self.decode.registers if self.decode else {}).get(head_dim, {}).get(stripes)
        if regs is None:
            raise KernelError(f"kernel {self.name!r} lists no decode instantiation for head_dim={head_dim} with "
                              f"{stripes} row stripes; add its registers under decode.registers")
        return regs

    def order_for(self, dtype: str | None = None) -> str:
        """The launch order of the instantiation for ``dtype``: ``fp8_launch_order`` for fp8, where given."""
        return self.fp8_launch_order if dtype == "fp8" and self.fp8_launch_order else self.launch_order

    def tiles_for(self, head_dim: int, dtype: str | None = None) -> TileConfig:
        """The tiles at ``head_dim`` (the next instantiation up); a fp8 ``dtype`` takes ``fp8_tiles`` where listed."""
        if dtype == "fp8" and any(d >= head_dim for d in self.fp8_tiles):
            return self.fp8_tiles[min(d for d in self.fp8_tiles if d >= head_dim)]
        if head_dim in self.tiles:
            return self.tiles[head_dim]
        bigger = [d for d in sorted(self.tiles) if d >= head_dim]
        if not bigger:
            raise KernelError(f"kernel {self.name!r} has no tiles for head_dim={head_dim} (it describes "
                              f"{sorted(self.tiles)}); add them to its description")
        return self.tiles[bigger[0]]  # kernels round the head dimension up to the next instantiation

    def runs_own_tiles(self, head_dim: int, tiles, dtype: str | None = None) -> bool:
        """Whether ``tiles`` (block_q, block_kv) are this description's own at ``head_dim`` (and ``dtype``): what a
        measurement on the kernel itself (``calibration.forward``, ``calibration.backward``) was taken at."""
        if head_dim not in self.tiles:
            return False
        own = self.tiles_for(head_dim, dtype)
        return (own.block_q, own.block_kv) == (tiles.block_q, tiles.block_kv)


def builtin_kernel_names() -> list[str]:
    return sorted(p.stem for p in KERNELS_DIR.glob("*.yaml"))


def load_kernel(name_or_path: str | Path | KernelDesc) -> KernelDesc:
    """A built-in description by name, or a YAML file of one."""
    if isinstance(name_or_path, KernelDesc):
        return name_or_path
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")):
        return _read_kernel(Path(text), text)
    if not (KERNELS_DIR / f"{text}.yaml").is_file():
        raise KernelError(f"kernel {text!r}: no such built-in ({', '.join(builtin_kernel_names())}) or file")
    return _builtin_kernel(text)


@cache
def _builtin_kernel(name: str) -> KernelDesc:
    """A built-in description, read once a process (a report reads one for each of ~330 cases: 1.5 s of YAML);
    the model is frozen, so the one copy is shared."""
    return _read_kernel(KERNELS_DIR / f"{name}.yaml", name)


def _read_kernel(path: Path, text: str) -> KernelDesc:
    if not path.is_file():
        raise KernelError(f"kernel {text!r}: no such built-in ({', '.join(builtin_kernel_names())}) or file")
    return validated(KernelDesc, read_data(path, KernelError), str(path), KernelError, "kernel description")
