"""Launch geometry of the forward pass's kernels (kernels/flash_fwd.cu, kernels/naive.cu, kernels/flash3_fwd.cu), as
plain data: tiles, threads, shared memory term by term, registers, grid order. Names follow the math: ``block_q`` =
Br, ``block_kv`` = Bc, ``head_dim`` = d.
"""

from __future__ import annotations

from ..blocks import cdiv
from ..problem import AttentionProblem
from ..schedules import Tiles
from ..schedules.flash1 import shared_memory as flash1_shared_memory
from ..schedules.flash2 import WARPS as FLASH_WARPS  # defined with the lengths' reads counted
from ..schedules.flash3_fp8 import FLASH3_FP8_TILES as FLASH3_FP8_TILES  # defined with the layout counted
from ..schedules.flash3_fp8 import FP8_KEY_GROUP as FP8_KEY_GROUP
from ..schedules.naive import row_pitch as naive_row_pitch  # defined with the layout counted
from .model import KernelLaunchModel, LaunchError, LaunchModel, registers_of

# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-2 forward (kernels/flash_fwd.cu)

FLASH_THREADS = 32 * FLASH_WARPS  # FLASH_WARPS: the schedule's (each warp owns block_q / 64 stripes of 16 rows)


def flash_stages(head_dim: int) -> int:
    """Depth of the kernel's K/V cp.async ring (mirrors flash_stages() in kernels/flash_fwd.cu).

    3 (tiles j+1 and j+2 in flight during tile j) where it fits two blocks per SM; 2 at d=256.
    """
    return 2 if head_dim >= 256 else 3


# (block_q, block_kv) the library can launch, per head dim. Every entry compiles without register spills for
# sm_80/sm_90 (checked by compile_check); larger tiles (e.g. 128 x 64 at d=128) spill and are left out.
FLASH_TILES: dict[int, tuple[tuple[int, int], ...]] = {
    32: ((128, 64), (64, 64)),
    64: ((128, 64), (64, 128), (64, 64)),
    128: ((128, 32), (64, 64)),
    256: ((64, 32),),
}
HEAD_DIMS: tuple[int, ...] = tuple(FLASH_TILES)

# default (block_q, block_kv) per head dim, causal or not alike: chosen from the tile sweep in docs/kernels.md
FLASH_DEFAULT_TILES: dict[int, tuple[int, int]] = {32: (128, 64), 64: (128, 64), 128: (128, 32), 256: (64, 32)}


def flash_smem_terms(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2,
                     paged: bool = False) -> dict[str, int]:
    """Dynamic shared memory of one flash2 thread block, term by term, in bytes (``paged``: the row-list paged
    kernel's, with its row lists: a cache row per key of each K/V ring slot, as kernels/flash_fwd.cu's sRows; its
    PageTiles instantiation keeps none)."""
    return ({"row lists": flash_stages(head_dim) * block_kv * 4} if paged else {}) | {
        # Q_i (Br x d), resident for the whole K/V loop; its rows are reused to stage O for 16-byte stores
        "Q_i": block_q * head_dim * itemsize,
        # K_j (Bc x d), a ring of flash_stages(d) buffers so later tiles load while tile j is used
        "K_j": flash_stages(head_dim) * block_kv * head_dim * itemsize,
        # V_j (Bc x d), likewise
        "V_j": flash_stages(head_dim) * block_kv * head_dim * itemsize,
    }


def flash_smem_bytes(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2, paged: bool = False) -> int:
    return sum(flash_smem_terms(head_dim, block_q, block_kv, itemsize, paged).values())


# registers per thread of iosim's flash2 kernel (launch__registers_per_thread, read by ncu on the H200, kernel v3)
FLASH2_REGISTERS = {(128, 128, 32): 255, (128, 64, 64): 249, (64, 128, 64): 238,
                    # the other instantiations (ptxas, nvcc 13, sm_90, the larger of causal and not; 2026-11-26)
                    (64, 64, 128): 182, (64, 64, 64): 138, (32, 128, 64): 166, (32, 64, 64): 99, (256, 64, 32): 253}
FLASH2_REGISTERS_DEFAULT = 255  # unknown instantiation: assume the register cap of __launch_bounds__(128)

# ------------------------------------------------------------------------------------------------------------------
# Naive attention, Algorithm 0 (kernels/naive.cu). Mirrors the constexprs at the top of naive.cu: the simulator
# counts the same tiling from this dict (the schedule's tiles are block_q = qk block_m = pv block_m, block_kv = qk
# block_n: what a measured launch is simulated with).

NAIVE_TILES: dict[str, dict[str, int]] = {
    # S = scale * Q K^T: a 128 x 128 tile of S per block (Q_i and K_j whole, all head dims), mma.sync; 8 warps of
    # 32 x 64 outputs. 128, not 64: at 64 x 64 the Q and K tiles are d/32 B of L2 reads per byte of S (4 at d = 128)
    "qk": {"block_m": 128, "block_n": 128, "threads": 256},
    # P = softmax(S): a row in registers, row_threads = 32..256 threads per row (naive_softmax_row_threads), 256 /
    # row_threads rows per block; where that does not apply, one row per block held in shared memory
    "softmax": {"threads": 256, "row_chunks": 8},
    # O = P V: a 128 x d tile of O per block, grid (1, ceil(N/128), B*H), so P is read once and V once per 128 rows;
    # keys in steps of 64 through a ring of naive_pv_stages(d) cp.async buffers
    "pv": {"block_m": 128, "block_k": 64, "threads": 256},
}
# registers per thread (ptxas, nvcc 13.0, sm_90, naive.cu v2.1, 2026-11-27): head dim -> (qk, pv)
# (qk: the larger of causal and not; __launch_bounds__(256, 2) caps qk and pv at d <= 128 to 128)
NAIVE_REGISTERS: dict[int, tuple[int, int]] = {32: (126, 85), 64: (128, 102), 128: (128, 127), 256: (128, 252)}
NAIVE_REGISTERS_DEFAULT = (128, 128)
# the softmax's, by chunks of a row per thread (naive_softmax_chunks; the larger of fp16 and bf16; the keys are the
# instantiations iosim.gpu.build compiles): up to 4 chunks fit the 64 that __launch_bounds__(256, 4) allows
NAIVE_SOFTMAX_REGISTERS: dict[int, int] = {1: 47, 2: 54, 4: 63, 8: 93}


def naive_pv_stages(head_dim: int) -> int:
    """Depth of naive_pv's cp.async ring of P and V tiles (mirrors naive_pv_stages() in kernels/naive.cu)."""
    return 2 if head_dim >= 256 else 3


def naive_qk_smem_bytes(head_dim: int, itemsize: int = 2) -> int:
    """Dynamic shared memory of the qk kernel: Q_i and K_j, whose space then stages the S tile for 16-byte stores."""
    t = NAIVE_TILES["qk"]
    return max((t["block_m"] + t["block_n"]) * head_dim, t["block_m"] * t["block_n"]) * itemsize


def naive_pv_smem_bytes(head_dim: int, itemsize: int = 2) -> int:
    """Dynamic shared memory of the pv kernel: its ring of P (block_m x block_k) and V (block_k x d) tiles."""
    t = NAIVE_TILES["pv"]
    return naive_pv_stages(head_dim) * (t["block_m"] + head_dim) * t["block_k"] * itemsize


def naive_softmax_row_threads(kv_len: int, itemsize: int = 2) -> int:
    """Threads per row of the softmax's register path (a power of two, 32 to 256, each thread holding at most
    ``row_chunks`` 16-byte chunks of the row at its pitch, :func:`naive_row_pitch`), or 0 where the row goes through
    shared memory instead: longer than 256 threads hold."""
    t = NAIVE_TILES["softmax"]
    chunks, threads = naive_row_pitch(kv_len, itemsize) * itemsize // 16, 32
    while threads * t["row_chunks"] < chunks:
        threads *= 2
    return threads if threads <= t["threads"] else 0


def naive_softmax_chunks(kv_len: int, itemsize: int = 2) -> int:
    """16-byte chunks of a row each thread of the softmax's register path holds (the kernel's Chunks: the smallest
    power of two that holds the row, 1 to ``row_chunks``); 1 where the row goes through shared memory."""
    rt = naive_softmax_row_threads(kv_len, itemsize)
    if not rt:
        return 1
    need, chunks = cdiv(naive_row_pitch(kv_len, itemsize) * itemsize // 16, rt), 1
    while chunks < need:
        chunks *= 2
    return chunks


def naive_softmax_rows_per_block(kv_len: int, itemsize: int = 2) -> int:
    rt = naive_softmax_row_threads(kv_len, itemsize)
    return NAIVE_TILES["softmax"]["threads"] // rt if rt else 1


def naive_softmax_smem_bytes(kv_len: int, itemsize: int = 2) -> int:
    """Dynamic shared memory of the softmax kernel: one row of S (at its pitch) in the input dtype where the row is
    not held in registers, else none."""
    return 0 if naive_softmax_row_threads(kv_len, itemsize) else naive_row_pitch(kv_len, itemsize) * itemsize


# ------------------------------------------------------------------------------------------------------------------
# The forward's launches


def launch_model(schedule: str, problem: AttentionProblem, tiles: Tiles, *, variant: str = "iosim",
                 registers: int | list[int] | None = None, pass_: str = "forward") -> LaunchModel:
    """The launch of ``schedule`` as iosim's kernels do it (``variant="iosim"``), or as FlashAttention-2 does it
    (``variant="fa2"``: grid (num_m_blocks, batch, heads), K/V loop in reverse, m blocks forward).
    ``registers`` overrides the registers per thread (one number, or one per kernel). The backward pass's kernels:
    :func:`iosim.launch.backward.backward_launch_model`."""
    if pass_ != "forward":
        raise LaunchError(f"pass={pass_!r}: the backward's launches are iosim.launch.backward_launch_model's")
    d, e = problem.head_dim, problem.elem_bytes
    if schedule == "flash2" and variant == "fa2":
        smem = tiles.block_q * d * e + 2 * tiles.block_kv * d * e  # Flash_fwd_kernel_traits: sQ + sK + sV
        return LaunchModel((KernelLaunchModel(128, smem, registers_of(registers, 0, 255)),), head_order="head_major",
                           kv_order="reverse", note="FA2: grid (m blocks, batch, heads), K/V blocks visited last to first")
    if schedule == "flash2":  # iosim/gpu/attention.py: grid (Tr, H, B); causal Q tiles launched last-first
        Br, Bc = tiles.block_q, tiles.block_kv
        regs = registers_of(registers, 0, FLASH2_REGISTERS.get((d, Br, Bc), FLASH2_REGISTERS_DEFAULT))
        kernel = KernelLaunchModel(FLASH_THREADS, flash_smem_bytes(d, Br, Bc, e), regs,
                                   "reverse" if problem.causal else "forward")
        return LaunchModel((kernel,), note="iosim flash2: grid (Tr, heads, batch); causal Q tiles launched last-first")
    if schedule == "naive":  # qk grid (Tc, Tr, B*H); softmax rows; pv grid (1, Tr, B*H)
        # the softmax's program block is one row: its threads are the row's (several rows share a GPU block)
        threads = (NAIVE_TILES["qk"]["threads"], naive_softmax_row_threads(problem.kv_len, e)
                   or NAIVE_TILES["softmax"]["threads"], NAIVE_TILES["pv"]["threads"])
        smem = (naive_qk_smem_bytes(d, e), naive_softmax_smem_bytes(problem.kv_len, e), naive_pv_smem_bytes(d, e))
        qk, pv = NAIVE_REGISTERS.get(d, NAIVE_REGISTERS_DEFAULT)
        regs = (qk, NAIVE_SOFTMAX_REGISTERS[naive_softmax_chunks(problem.kv_len, e)], pv)
        kernels = tuple(KernelLaunchModel(threads[i], smem[i], registers_of(registers, i, regs[i])) for i in range(3))
        return LaunchModel(kernels, note="iosim naive: qk grid (Tc, Tr, B*H), softmax rows of 32-256 threads, "
                                         "pv (1, Tr, B*H)")
    if schedule == "flash3":  # a persistent grid of min(tiles, SMs) blocks; each block one Q tile at a time
        smem = flash3_smem_bytes(d, tiles.block_q, tiles.block_kv, e)  # one block per SM: its ring fills the SM
        per_thread = (FLASH3_REGISTERS["producer"] + 2 * FLASH3_REGISTERS["consumer"]) // FLASH3_WARPGROUPS  # 168
        regs = registers_of(registers, 0, per_thread)
        kernel = KernelLaunchModel(FLASH3_THREADS, smem, regs, "reverse" if problem.causal else "forward")
        return LaunchModel((kernel,), note="iosim flash3: persistent, one block per SM taking Q tiles in grid order "
                                           "(modeled as blocks handing their slot to the next tile; causal: last-first)")
    if schedule == "flash1":
        kernel = KernelLaunchModel(128, flash1_shared_memory(problem, tiles), registers_of(registers, 0, 255))
        return LaunchModel((kernel,), note="flash1: one block per head (no GPU kernel; geometry assumed)")
    raise LaunchError(f"no launch geometry known for schedule {schedule!r}")


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-3 forward (kernels/flash3_fwd.cu)
# Appended by the flash3 work (issue 18); mirrors the constexprs at the top of flash3_fwd.cu. sm_90a only.

FLASH3_WARPGROUPS = 3  # warpgroup 0: producer (one thread issues every TMA load); 1 and 2: consumers (wgmma)
FLASH3_THREADS = 128 * FLASH3_WARPGROUPS
FLASH3_STAGES = 2  # depth of the K and V mbarrier rings (tiles j+1 loads while tile j is used)
FLASH3_SWIZZLE_ELEMS = 64  # 128-byte swizzle: one TMA box row = one wgmma swizzle-atom row = 64 fp16/bf16
# setmaxnreg after the role split: 128 x 40 + 256 x 232 = 64,512 of the SM's 65,536 registers (the producer's
# schedule walk spills at 24 or 32 registers, ptxas, sm_90a, d=64 causal)
FLASH3_REGISTERS = {"producer": 40, "consumer": 232}
# (block_q, block_kv) per head dim: block_q = 2 consumer warpgroups x 64 rows (wgmma's M); block_kv = wgmma's N
FLASH3_TILES: dict[int, tuple[int, int]] = {64: (128, 128), 128: (128, 128), 256: (128, 64)}
FLASH3_HEAD_DIMS: tuple[int, ...] = tuple(FLASH3_TILES)
# fp8 e4m3 (kernels/flash3_fwd.cu's Fp8 instantiations, issue 27): FLASH3_FP8_TILES and FP8_KEY_GROUP, imported
# above from iosim/schedules/flash3_fp8.py (the schedule layer counts them and cannot import this one)


def flash3_smem_terms(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> dict[str, int]:
    """Dynamic shared memory of one flash3 thread block, term by term, in bytes."""
    return {
        # Q_i (Br x d), resident for the whole K/V loop, in d/64 column panels of Br x 128 B (TMA 128B swizzle)
        "Q_i": block_q * head_dim * itemsize,
        # K_j (Bc x d), a ring of FLASH3_STAGES buffers
        "K_j": FLASH3_STAGES * block_kv * head_dim * itemsize,
        # V_j (Bc x d), likewise
        "V_j": FLASH3_STAGES * block_kv * head_dim * itemsize,
        # mbarriers: Q full and empty, and full + empty per stage for K and for V (8 B each), padded to 128 B
        "barriers": 128,
        # the kernel aligns its base to 1024 B (the swizzle pattern repeats every 1024 B)
        "align": 1024,
    }


def flash3_smem_bytes(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> int:
    return sum(flash3_smem_terms(head_dim, block_q, block_kv, itemsize).values())


def flash3_tiles(batch: int, seq_len: int, heads: int, block_q: int = 128) -> int:
    """Q tiles of one flash3 call: the work items its persistent grid (G = min(tiles, SMs) blocks) walks through.
    Tile t = m + Tr * (h + heads * b) (causal: m counted from the last tile); in round r block x takes tile
    r * G + x, or r * G + G - 1 - x on odd rounds (a snake, so causal blocks' work evens out)."""
    return cdiv(seq_len, block_q) * heads * batch
