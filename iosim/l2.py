"""The L2 model: a three-level hierarchy (DRAM - L2 - SM) that turns a schedule's tile accesses into DRAM bytes.

``global`` (what the SMs request from L2) is the schedule's own count. ``hbm`` (what crosses L2 <-> DRAM) depends on
which thread blocks run at once, the order the hardware launches them, and the L2 capacity; this module predicts
it under the conditions Nsight Compute measures by default:

* L2 is flushed (clean and empty) before every kernel, so each kernel starts cold;
* reads that miss fetch their bytes from DRAM; writes allocate without a fetch (whole sectors are written) and
  mark the bytes dirty; a dirty byte reaches DRAM only when it is evicted during the kernel;
* dirty bytes still in L2 when the kernel ends are NOT counted as DRAM writes (reported as ``dirty_at_end``).

How the access stream is made
-----------------------------
1. The tile program of ONE head is run by :class:`Tracer` (a :class:`~iosim.machine.Counter` that also records
   every load/store as ``(tensor, rows, cols, write)`` per thread block). For flash2 and naive, whose programs
   are simple, :func:`head_program` can produce the same records with NumPy (``fast=True``; the tests prove them
   equal to the tracer's), because a Python walk of a 131072-token head takes minutes.
2. Each tensor's accesses within one kernel are cut into *atoms*: rectangles between consecutive tile edges. Every
   access is a whole number of atoms; a line belongs to exactly one atom.
3. The grid is laid out as the GPU launches it (:data:`LAUNCH` states it per schedule, read from ``iosim/gpu``):
   heads outermost in the kernel's grid order, the blocks of a head in ``blockIdx.x`` order. ``R`` thread blocks
   run at once (:func:`resident_blocks`: shared memory, registers, threads, block limit per SM, times the SM
   count). Execution is modeled as rounds: in each round every running block issues its next tile access (slot
   order); a block that finishes hands its slot to the next block in launch order.
4. L2 is a fully associative LRU over bytes, with atoms as the unit of recency and partial eviction of the
   least-recent atom. This equals a line-granular LRU over the same trace when every access touches its atoms'
   lines in a fixed order (tested against a plain line-level LRU).

Approximation (``dedupe=True``, the default): within one round, a tile that several blocks read is touched once,
at its first occurrence in the round (later reads in the same round are hits in both models; only their recency
order inside the round differs; valid when L2 holds a few rounds' worth of tiles, R x tile bytes, which is 2 MiB
against 60 MiB for flash2 on an H200). This makes lockstep blocks that stream the same K/V cost one LRU operation per
round instead of R. The tests bound its difference from the exact trace (``dedupe=False``) on small cases.

Not modeled: set associativity and address hashing, the two L2 partitions, sectors of a line left unfilled (row
segments shorter than a line), prefetch, compression, and differences in speed between blocks beyond "one tile
access per round".
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np

from .blocks import cdiv, n_kv_blocks_visible
from .machine import Counter
from .problem import STAT_BYTES, AttentionProblem
from .profile import Profile, get_profile
from .schedules import Tiles, get_schedule

try:  # numba is a runtime dependency; the pure-Python fallback is only for environments without it
    import numba

    _njit = numba.njit(cache=True, nogil=True)
except ImportError:  # pragma: no cover
    numba = None

    def _njit(f):
        return f


# tensor codes used in traces
TENSOR_CODES = {"Q": 0, "K": 1, "V": 2, "O": 3, "S": 4, "P": 5, "m": 6, "l": 7, "lse": 8}
TENSOR_NAMES = {v: k for k, v in TENSOR_CODES.items()}
KV_TENSORS = (TENSOR_CODES["K"], TENSOR_CODES["V"])  # indexed by the key/value head


class L2ModelError(ValueError):
    """The L2 model cannot run as asked (missing profile field, unknown schedule geometry, ...)."""


# ----------------------------------------------------------------------------------------------------------------
# 1. The tracer: the schedule's tile program, recorded


class Tracer(Counter):
    """Records every global load/store of a tile program as ``(tensor, r0, r1, c0, c1, write)`` per thread block.

    It counts like the :class:`~iosim.machine.Counter` it extends (so a test can check the trace adds up to the
    schedule's ``global`` bytes). ``kv_order`` overrides the order of the K/V loop (``"forward"`` as written, or
    ``"reverse"`` as FlashAttention-2's CUDA kernel iterates). One kernel launch = one list of blocks.
    """

    def __init__(self, problem: AttentionProblem, kv_order: str = "forward"):
        super().__init__(problem)
        self.kv_order = kv_order
        self.traces: list[list[list[tuple]]] = []  # kernel -> block -> accesses
        self._blocks: list[list[tuple]] | None = None
        self._cur: list[tuple] | None = None

    @contextmanager
    def kernel(self, name, grid):
        self._blocks = []
        with super().kernel(name, grid):
            yield
        if self._cur is not None:  # a kernel whose program opened no thread block (one block for the grid)
            self._blocks.append(self._cur)
            self._cur = None
        self.traces.append(self._blocks)
        self._blocks = None

    @contextmanager
    def thread_block(self):
        self._cur = []
        with super().thread_block():
            yield
        self._blocks.append(self._cur)
        self._cur = None

    def order(self, blocks):
        return reversed(list(blocks)) if self.kv_order == "reverse" else blocks

    def _rec(self, tensor, rows, cols, write):
        if self._cur is None:
            self._cur = []
        c0, c1 = (cols.start, cols.stop) if cols is not None else (0, 0)
        self._cur.append((TENSOR_CODES[tensor], rows.start, rows.stop, c0, c1, write))

    def load(self, tensor, rows, cols=None):
        self._rec(tensor, rows, cols, False)
        return super().load(tensor, rows, cols)

    def store(self, tensor, rows, tile, cols=None):
        self._rec(tensor, rows, cols, True)
        return super().store(tensor, rows, tile, cols)

    def fill(self, tensor, rows, value):
        self._rec(tensor, rows, None, True)
        return super().fill(tensor, rows, value)


@dataclass
class KernelTrace:
    """One kernel's accesses for one head: block b's accesses are rows ``ptr[b]:ptr[b+1]`` of the arrays."""

    name: str
    ptr: np.ndarray  # int64 (blocks + 1)
    tensor: np.ndarray  # int8
    r0: np.ndarray  # int64
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray
    write: np.ndarray  # bool

    @property
    def n_blocks(self) -> int:
        return len(self.ptr) - 1


def _from_lists(name: str, blocks: list[list[tuple]]) -> KernelTrace:
    ptr = np.zeros(len(blocks) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(b) for b in blocks])
    flat = [a for b in blocks for a in b]
    arr = np.array(flat, dtype=np.int64).reshape(-1, 6) if flat else np.zeros((0, 6), dtype=np.int64)
    return KernelTrace(
        name,
        ptr,
        arr[:, 0].astype(np.int8),
        arr[:, 1].copy(),
        arr[:, 2].copy(),
        arr[:, 3].copy(),
        arr[:, 4].copy(),
        arr[:, 5].astype(bool),
    )


def trace_program(
    schedule: str, problem: AttentionProblem, tiles: Tiles, kv_order: str = "forward"
) -> list[KernelTrace]:
    """Run the schedule's tile program for one head through the :class:`Tracer`."""
    x = Tracer(problem, kv_order)
    get_schedule(schedule).program(x, problem, tiles)
    return [_from_lists(k.name, blocks) for k, blocks in zip(x.kernels, x.traces, strict=True)]


@_njit
def _flash2_fill(Tr, Br, Bc, N, Nk, n, reverse, ptr, tensor, r0, r1, write):
    for i in range(Tr):
        p = ptr[i]
        qs, qe = i * Br, min((i + 1) * Br, N)
        if n[i] > 0:  # a block that sees no key (causal) loads nothing and writes O = 0, lse = -inf
            tensor[p] = 0
            r0[p] = qs
            r1[p] = qe
            p += 1
        for s in range(n[i]):
            j = n[i] - 1 - s if reverse else s
            for code in (1, 2):  # K_j, V_j
                tensor[p] = code
                r0[p] = j * Bc
                r1[p] = min((j + 1) * Bc, Nk)
                p += 1
        for code in (3, 8):  # O_i, lse_i
            tensor[p] = code
            r0[p] = qs
            r1[p] = qe
            write[p] = True
            p += 1


def _flash2_fast(p: AttentionProblem, t: Tiles, kv_order: str) -> list[KernelTrace]:
    """The flash2 program's records, built without walking the program (equal to the tracer's: tests)."""
    N, Nk, Br, Bc = p.seq_len, p.kv_len, t.block_q, t.block_kv
    Tr = cdiv(N, Br)
    i = np.arange(Tr, dtype=np.int64)
    n = np.asarray(n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal), dtype=np.int64).reshape(Tr)
    ptr = np.zeros(Tr + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.where(n > 0, 2 * n + 3, 2))  # Q, (K, V) x n, O, lse
    total = int(ptr[-1])
    tensor = np.empty(total, dtype=np.int8)
    r0 = np.empty(total, dtype=np.int64)
    r1 = np.empty(total, dtype=np.int64)
    write = np.zeros(total, dtype=bool)
    _flash2_fill(Tr, Br, Bc, N, Nk, n, kv_order == "reverse", ptr, tensor, r0, r1, write)
    zeros = np.zeros(total, dtype=np.int64)
    return [KernelTrace("flash2_fwd", ptr, tensor, r0, r1, zeros, zeros, write)]


def head_program(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    *,
    kv_order: str = "forward",
    fast: bool | None = None,
) -> list[KernelTrace]:
    """Accesses of one head, per kernel. ``fast=None``: NumPy for flash2 (any size), the tracer otherwise."""
    if fast is None:
        fast = schedule == "flash2"
    if fast and schedule == "flash2":
        return _flash2_fast(problem, tiles, kv_order)
    return trace_program(schedule, problem, tiles, kv_order)


# ----------------------------------------------------------------------------------------------------------------
# 2. Launch geometry (what iosim/gpu launches; stated here so the model needs no GPU)

# registers per thread of iosim's flash2 kernel (launch__registers_per_thread, ncu on the H200, kernel v3)
FLASH2_REGISTERS = {
    (128, 128, 32): 255,
    (128, 64, 64): 249,
    (64, 128, 64): 238,
}  # v3, read by ncu on the H200
FLASH2_REGISTERS_DEFAULT = 255  # unknown instantiation: assume the register cap of __launch_bounds__(128)


@dataclass(frozen=True)
class KernelLaunchModel:
    """How one kernel of a schedule is launched, per head: threads, shared memory, registers, block order.

    ``block_order``: permutation of the head's program blocks in ``blockIdx.x`` order (None = program order).
    ``gpu_blocks_per_block``: thread blocks the GPU launches for one program block (naive pv at d > 64 splits the
    output columns over ``ceil(d/64)`` blocks); residency is divided by it.
    """

    threads: int
    smem: int
    registers: int
    block_order: str = "forward"  # or "reverse"
    gpu_blocks_per_block: int = 1


@dataclass(frozen=True)
class LaunchModel:
    kernels: tuple[KernelLaunchModel, ...]
    head_order: str = (
        "batch_major"  # grid (.., heads, batch): heads fastest; "head_major": grid (.., batch, heads)
    )
    kv_order: str = "forward"
    note: str = ""


def launch_model(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    *,
    variant: str = "iosim",
    registers: int | list[int] | None = None,
) -> LaunchModel:
    """The launch of ``schedule`` as iosim's kernels do it (``variant="iosim"``, read from iosim/gpu), or as
    FlashAttention-2 (``variant="fa2"``: grid (num_m_blocks, batch, heads), K/V loop in reverse, m blocks forward)."""
    d, e = problem.head_dim, problem.elem_bytes
    if schedule == "flash2":
        Br, Bc = tiles.block_q, tiles.block_kv
        if variant == "fa2":
            smem = Br * d * e + 2 * Bc * d * e  # Flash_fwd_kernel_traits: sQ + sK + sV (one stage each)
            regs = (registers[0] if isinstance(registers, (list, tuple)) else registers) or 255
            return LaunchModel(
                (KernelLaunchModel(128, smem, regs),),
                head_order="head_major",
                kv_order="reverse",
                note="FA2: grid (m blocks, batch, heads), K/V blocks visited last to first",
            )
        # iosim/gpu/attention.py: grid (Tr, H, B), 128 threads, smem from iosim/gpu/build.py (Q + the K/V stages);
        # kernels/flash_fwd.cu: causal launches Q tiles last-first (m_block = Tr - 1 - blockIdx.x)
        try:
            from .gpu import build  # no CuPy needed

            smem = build.flash_smem_bytes(d, Br, Bc, e)
        except Exception:  # pragma: no cover - a head dim the GPU library does not build
            smem = Br * d * e + 2 * 2 * Bc * d * e
        regs = (registers[0] if isinstance(registers, (list, tuple)) else registers) or FLASH2_REGISTERS.get(
            (d, Br, Bc), FLASH2_REGISTERS_DEFAULT
        )
        return LaunchModel(
            (KernelLaunchModel(128, smem, regs, "reverse" if problem.causal else "forward"),),
            note="iosim flash2: grid (Tr, heads, batch); causal Q tiles launched last-first",
        )
    if schedule == "naive":
        # iosim/gpu/build.py NAIVE_TILES: qk grid (Tc, Tr, B*H) 256 threads; softmax one row per block;
        # pv grid (ceil(d/64), Tr, B*H): ceil(d/64) blocks per Q block. Static smem of the GEMMs: 2 x 16 x 68 fp32.
        # registers (ptxas via ncu on the H200): qk 80, softmax 31, pv 40
        gemm_smem = 2 * 16 * 68 * 4
        regs = (
            registers
            if isinstance(registers, (list, tuple))
            else [registers or 80, registers or 31, registers or 40]
        )
        return LaunchModel(
            (
                KernelLaunchModel(256, gemm_smem, regs[0]),
                KernelLaunchModel(256, problem.kv_len * e, regs[1]),
                KernelLaunchModel(256, gemm_smem, regs[2], gpu_blocks_per_block=cdiv(d, 64)),
            ),
            note="iosim naive: qk grid (Tc, Tr, B*H), softmax (B*H*N), pv (ceil(d/64), Tr, B*H)",
        )
    if schedule == "flash1":
        return LaunchModel(
            (KernelLaunchModel(128, get_schedule("flash1").shared_memory(problem, tiles), 255),),
            note="flash1: one block per head (no GPU kernel; geometry assumed)",
        )
    raise L2ModelError(f"no launch geometry known for schedule {schedule!r}")


def resident_blocks(
    profile: Profile, threads: int, smem: int, registers: int, *, smem_reserved: int = 1024
) -> tuple[int, dict]:
    """Thread blocks of one kernel resident at once on the whole GPU, and the per-SM limit of each resource.

    Registers are allocated per warp in units of 256 (CUDA occupancy calculator); the runtime reserves 1 KiB of
    shared memory per block (sm_80+)."""
    sms = int(profile.require("sm_count"))
    max_threads = profile.sm.max_threads.value if profile.sm else None
    max_blocks = profile.sm.max_blocks.value if profile.sm else None
    if max_threads is None or max_blocks is None:
        raise L2ModelError(
            f"profile {profile.name}: sm.max_threads and sm.max_blocks are needed for residency"
        )
    smem_sm = int(profile.require("smem.per_sm"))
    regs_sm = int(profile.require("registers.per_sm")) // 4
    warps = cdiv(threads, 32)
    regs_block = warps * cdiv(registers * 32, 256) * 256
    limits = {
        "blocks": max_blocks,
        "threads": max_threads // threads,
        "registers": regs_sm // regs_block if regs_block else max_blocks,
        "smem": smem_sm // (smem + smem_reserved),
    }
    per_sm = max(1, min(limits.values()))
    return per_sm * sms, limits


# ----------------------------------------------------------------------------------------------------------------
# 3. Atoms and the LRU simulation


@dataclass
class _Atoms:
    """The atoms of one kernel (one head) and each access as (first atom, shape)."""

    atom_bytes: np.ndarray  # int64 [A]
    atom_kv: np.ndarray  # bool [A]: indexed by the kv head (K, V), else by the query head
    atom_tensor: np.ndarray  # int64 [A]
    acc_atom: np.ndarray  # int32 per access: its first atom
    acc_shape: (
        np.ndarray
    )  # int32 per access: 0 = one atom; k > 0 = shapes row k (rows of atoms, cols, stride)
    shapes: np.ndarray  # int64 [K, 3]


def _bounds(starts, stops, size):
    mark = np.zeros(size + 1, dtype=bool)
    mark[starts] = True
    mark[stops] = True
    rb = np.flatnonzero(mark).astype(np.int64)
    lut = np.cumsum(mark) - 1  # lut[x] = index of boundary x in rb (x a boundary)
    return rb, lut


def _atomize(kt: KernelTrace, p: AttentionProblem) -> _Atoms:
    n_acc = len(kt.tensor)
    acc_atom = np.zeros(n_acc, dtype=np.int64)
    nr_all = np.ones(n_acc, dtype=np.int64)
    nc_all = np.ones(n_acc, dtype=np.int64)
    stride_all = np.ones(n_acc, dtype=np.int64)
    bytes_parts, kv_parts, t_parts = [], [], []
    nxt = 0
    for t in range(len(TENSOR_CODES)):
        sel = np.nonzero(kt.tensor == t)[0]
        if len(sel) == 0:
            continue
        name = TENSOR_NAMES[t]
        r0, r1 = kt.r0[sel], kt.r1[sel]
        rb, rlut = _bounds(r0, r1, int(r1.max()))
        has_cols = name in ("S", "P")
        if has_cols:
            c0, c1 = kt.c0[sel], kt.c1[sel]
            cb, clut = _bounds(c0, c1, int(c1.max()))
            ca0, ca1 = clut[c0], clut[c1]
            width = np.diff(cb)
        else:
            cb = np.array([0, 1], np.int64)
            ca0, ca1 = np.zeros(len(sel), np.int64), np.ones(len(sel), np.int64)
            width = np.array([1 if name in ("m", "l", "lse") else p.head_dim])
        ra0, ra1 = rlut[r0], rlut[r1]
        nr, nc = len(rb) - 1, len(cb) - 1
        acc_atom[sel] = nxt + ra0 * nc + ca0
        nr_all[sel], nc_all[sel], stride_all[sel] = ra1 - ra0, ca1 - ca0, nc
        elem = STAT_BYTES if name in ("m", "l", "lse") else p.elem_bytes
        bytes_parts.append((np.diff(rb)[:, None] * width[None, :] * elem).reshape(-1).astype(np.int64))
        kv_parts.append(np.full(nr * nc, t in KV_TENSORS))
        t_parts.append(np.full(nr * nc, t, dtype=np.int64))
        nxt += nr * nc
    single = (nr_all == 1) & (nc_all == 1)
    shape_keys = np.stack([nr_all, nc_all, stride_all], axis=1)
    acc_shape = np.zeros(n_acc, dtype=np.int32)
    shapes = np.zeros((1, 3), dtype=np.int64)
    if not single.all():
        uniq, inv = np.unique(shape_keys[~single], axis=0, return_inverse=True)
        shapes = np.concatenate([shapes, uniq])
        acc_shape[~single] = inv.reshape(-1) + 1
    if nxt >= 2**31:
        raise L2ModelError(f"{kt.name}: {nxt} atoms per head is too many for the model")

    def cat(xs, dt):
        return np.concatenate(xs) if xs else np.zeros(0, dt)

    return _Atoms(
        cat(bytes_parts, np.int64),
        cat(kv_parts, bool),
        cat(t_parts, np.int64),
        acc_atom.astype(np.int32),
        acc_shape,
        shapes,
    )


@_njit
def _launch_block(
    launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
):
    """Put the grid's next thread block (number ``launched`` in launch order) into residency slot ``s``: its
    accesses are ``ptr[b]:ptr[b+1]`` of the trace, offset into its head's Q-side and K/V-side atoms."""
    nb = block_order.shape[0]
    h = launched // nb
    b = block_order[launched % nb]
    slot_pos[s] = ptr[b]
    slot_end[s] = ptr[b + 1]
    slot_qoff[s] = head_q[h] * A
    slot_kvoff[s] = head_kv[h] * A


@_njit
def _simulate_kernel(
    ptr,
    acc_atom,
    acc_shape,
    acc_write,
    shapes,
    atom_bytes,
    atom_kv,
    atom_tensor,
    block_order,
    head_q,
    head_kv,
    n_slots,
    capacity,
    dedupe,
    out_read,
    out_write,
    cost_private,
    cost_shared,
    n_sms,
):
    """Round-robin execution of the grid over a byte-weighted LRU. Returns (dram_read, dram_write, dirty_end,
    rounds); ``out_read``/``out_write`` (per tensor) are incremented.

    Capacity is counted in half-bytes: an atom occupies ``cost * bytes / 2`` where ``cost`` is ``cost_private``
    until SMs of both halves of the chip (slot % n_sms below / above n_sms / 2) have touched it, then
    ``cost_shared`` (2 and 2: a plain LRU; 3 and 4: copies in both L2 partitions, see simulate_l2)."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    G = n_slot_heads * A
    res = np.zeros(G, np.int64)
    cost = np.zeros(G, np.int64)
    mask = np.zeros(G, np.int8)
    dirty = np.zeros(G, np.bool_)
    prev = np.full(G, -1, np.int64)
    nxt = np.full(G, -1, np.int64)
    last_round = np.full(G, -1, np.int64)
    cap_units = 2 * capacity
    lru_head = -1  # most recent
    lru_tail = -1  # least recent
    used = 0  # half-bytes
    dram_read = 0
    dram_write = 0
    total_blocks = nb * n_heads
    slot_pos = np.zeros(n_slots, np.int64)
    slot_end = np.zeros(n_slots, np.int64)
    slot_qoff = np.zeros(n_slots, np.int64)
    slot_kvoff = np.zeros(n_slots, np.int64)
    slot_live = np.zeros(n_slots, np.bool_)
    slot_half = np.zeros(n_slots, np.int8)
    for s in range(n_slots):
        slot_half[s] = 1 if (s % n_sms) * 2 < n_sms else 2
    launched = 0
    live = 0
    for s in range(n_slots):
        if launched < total_blocks:
            _launch_block(
                launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
            )
            slot_live[s] = True
            launched += 1
            live += 1
    rnd = 0
    while live > 0:
        rnd += 1
        for s in range(n_slots):
            if not slot_live[s]:
                continue
            pos = slot_pos[s]
            if pos < slot_end[s]:
                a0 = acc_atom[pos]
                w = acc_write[pos]
                k = acc_shape[pos]
                if k == 0:
                    nr, nc, stride = 1, 1, 1
                else:
                    nr, nc, stride = shapes[k, 0], shapes[k, 1], shapes[k, 2]
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        size = atom_bytes[a]
                        t = atom_tensor[a]
                        r = res[g]
                        mask[g] |= slot_half[s]
                        want = cost_shared if mask[g] == 3 else cost_private
                        if dedupe and (not w) and last_round[g] == rnd:
                            if r > 0 and cost[g] != want:  # now shared: a second copy takes room
                                used += r * (want - cost[g])
                                cost[g] = want
                            else:
                                continue
                        else:
                            last_round[g] = rnd
                            used -= r * cost[g]  # the atom's old room; it is re-linked at the head below
                            if 0 < r < size:
                                # partly evicted: it is the LRU tail, and a line-level LRU walking its lines in
                                # order evicts each remaining line just before reaching it: all of it misses
                                if dirty[g]:
                                    dram_write += r
                                    out_write[t] += r
                                    dirty[g] = False
                            if r > 0:  # unlink
                                pv = prev[g]
                                nx = nxt[g]
                                if pv >= 0:
                                    nxt[pv] = nx
                                else:
                                    lru_head = nx
                                if nx >= 0:
                                    prev[nx] = pv
                                else:
                                    lru_tail = pv
                            miss = 0 if r == size else size
                            if w:
                                dirty[g] = True
                            else:
                                dram_read += miss
                                out_read[t] += miss
                            res[g] = size
                            cost[g] = want
                            used += size * want
                            prev[g] = -1  # link at the head (most recent)
                            nxt[g] = lru_head
                            if lru_head >= 0:
                                prev[lru_head] = g
                            lru_head = g
                            if lru_tail < 0:
                                lru_tail = g
                        while used > cap_units:  # evict the least recent bytes
                            v = lru_tail  # (v == g only for an atom larger than L2: its first bytes go)
                            cv = cost[v]
                            take = min(res[v], (used - cap_units + cv - 1) // cv)
                            res[v] -= take
                            used -= take * cv
                            if dirty[v]:
                                dram_write += take
                                out_write[atom_tensor[v % A]] += take
                            if res[v] == 0:
                                dirty[v] = False
                                mask[v] = 0
                                cost[v] = 0
                                pv = prev[v]
                                lru_tail = pv
                                if pv >= 0:
                                    nxt[pv] = -1
                                else:
                                    lru_head = -1
                                prev[v] = -1
                pos += 1
                slot_pos[s] = pos
            if pos >= slot_end[s]:
                if launched < total_blocks:
                    _launch_block(
                        launched,
                        s,
                        block_order,
                        ptr,
                        head_q,
                        head_kv,
                        A,
                        slot_pos,
                        slot_end,
                        slot_qoff,
                        slot_kvoff,
                    )
                    launched += 1
                else:
                    slot_live[s] = False
                    live -= 1
    dirty_end = 0
    for g in range(G):
        if dirty[g]:
            dirty_end += res[g]
    return dram_read, dram_write, dirty_end, rnd


@_njit
def _miss(curve_x, curve_y, d):
    """Miss probability of a reuse at stack distance ``d`` bytes (linear interpolation, 1 beyond the curve)."""
    n = curve_x.shape[0]
    if d >= curve_x[n - 1]:
        return 1.0
    if d <= curve_x[0]:
        return curve_y[0]
    lo, hi = 0, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if curve_x[mid] <= d:
            lo = mid
        else:
            hi = mid
    f = (d - curve_x[lo]) / (curve_x[hi] - curve_x[lo])
    return curve_y[lo] + f * (curve_y[hi] - curve_y[lo])


@_njit
def _bit_add(tree, i, v):
    i += 1
    n = tree.shape[0]
    while i < n:
        tree[i] += v
        i += i & (-i)


@_njit
def _bit_prefix(tree, i):  # sum of [0, i]
    s = 0
    i += 1
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@_njit
def _simulate_kernel_sd(
    ptr,
    acc_atom,
    acc_shape,
    acc_write,
    shapes,
    atom_bytes,
    atom_kv,
    atom_tensor,
    block_order,
    head_q,
    head_kv,
    n_slots,
    dedupe,
    out_read,
    out_write,
    curve_x,
    curve_y,
    window,
):
    """The same execution as :func:`_simulate_kernel`, with L2 hits decided by a measured miss curve: a reuse of
    an atom after ``d`` distinct bytes (its LRU stack distance) misses with probability ``curve(d)``; a dirty
    atom is written back with the probability that it was evicted. Expected bytes (floats)."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    G = n_slot_heads * A
    dmax = curve_x[curve_x.shape[0] - 1]
    last_t = np.full(G, -1, np.int64)
    dirty = np.zeros(G, np.float64)  # expected dirty bytes in L2
    last_round = np.full(G, -1, np.int64)
    TW = window
    tree = np.zeros(TW + 1, np.int64)
    atom_at = np.full(TW, -1, np.int64)
    total = 0  # bytes of atoms in the window
    tau = 0
    oldest = 0
    dram_read = 0.0
    dram_write = 0.0
    total_blocks = nb * n_heads
    slot_pos = np.zeros(n_slots, np.int64)
    slot_end = np.zeros(n_slots, np.int64)
    slot_qoff = np.zeros(n_slots, np.int64)
    slot_kvoff = np.zeros(n_slots, np.int64)
    slot_live = np.zeros(n_slots, np.bool_)
    launched = 0
    live = 0
    for s in range(n_slots):
        if launched < total_blocks:
            _launch_block(
                launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
            )
            slot_live[s] = True
            launched += 1
            live += 1
    rnd = 0
    while live > 0:
        rnd += 1
        for s in range(n_slots):
            if not slot_live[s]:
                continue
            pos = slot_pos[s]
            if pos < slot_end[s]:
                a0 = acc_atom[pos]
                w = acc_write[pos]
                k = acc_shape[pos]
                if k == 0:
                    nr, nc, stride = 1, 1, 1
                else:
                    nr, nc, stride = shapes[k, 0], shapes[k, 1], shapes[k, 2]
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        if dedupe and (not w) and last_round[g] == rnd:
                            continue
                        last_round[g] = rnd
                        size = atom_bytes[a]
                        t = atom_tensor[a]
                        lt = last_t[g]
                        if lt >= 0:
                            d = total - _bit_prefix(tree, lt)
                            m = _miss(curve_x, curve_y, d)
                            _bit_add(tree, lt, -size)
                            total -= size
                            atom_at[lt] = -1
                        else:
                            m = 1.0
                        if dirty[g] > 0:
                            wb = dirty[g] * m
                            dram_write += wb
                            out_write[t] += wb
                            dirty[g] -= wb
                        if w:
                            dirty[g] = size
                        else:
                            dram_read += size * m
                            out_read[t] += size * m
                        if tau == TW:  # renumber the window's timestamps from 0
                            j = 0
                            for u in range(oldest, TW):
                                v = atom_at[u]
                                if v >= 0:
                                    atom_at[j] = v
                                    last_t[v] = j
                                    j += 1
                            for u in range(j, TW):
                                atom_at[u] = -1
                            tree[:] = 0
                            for u in range(j):
                                _bit_add(tree, u, atom_bytes[atom_at[u] % A])
                            tau = j
                            oldest = 0
                        last_t[g] = tau
                        atom_at[tau] = g
                        _bit_add(tree, tau, size)
                        total += size
                        tau += 1
                        # atoms more than the curve's reach behind are surely gone: drop them
                        while oldest < tau:
                            v = atom_at[oldest]
                            if v < 0:
                                oldest += 1
                                continue
                            vb = atom_bytes[v % A]
                            if total - _bit_prefix(tree, oldest) < dmax:
                                break
                            if dirty[v] > 0:
                                dram_write += dirty[v]
                                out_write[atom_tensor[v % A]] += dirty[v]
                                dirty[v] = 0.0
                            _bit_add(tree, oldest, -vb)
                            total -= vb
                            last_t[v] = -1
                            atom_at[oldest] = -1
                            oldest += 1
                pos += 1
                slot_pos[s] = pos
            if pos >= slot_end[s]:
                if launched < total_blocks:
                    _launch_block(
                        launched,
                        s,
                        block_order,
                        ptr,
                        head_q,
                        head_kv,
                        A,
                        slot_pos,
                        slot_end,
                        slot_qoff,
                        slot_kvoff,
                    )
                    launched += 1
                else:
                    slot_live[s] = False
                    live -= 1
    dirty_end = 0.0
    for u in range(oldest, tau):
        v = atom_at[u]
        if v >= 0 and dirty[v] > 0:
            m = _miss(curve_x, curve_y, total - _bit_prefix(tree, u))
            dram_write += dirty[v] * m
            out_write[atom_tensor[v % A]] += dirty[v] * m
            dirty_end += dirty[v] * (1.0 - m)
    return dram_read, dram_write, dirty_end, rnd


def _head_slots(p: AttentionProblem, head_order: str) -> tuple[np.ndarray, np.ndarray]:
    """Query-head and kv-head slot of each head, in the order the grid launches them."""
    B, H, Hk = p.batch, p.heads, p.kv_heads
    g = H // Hk
    if head_order == "batch_major":
        b, h = np.divmod(np.arange(B * H, dtype=np.int64), H)
    elif head_order == "head_major":
        h, b = np.divmod(np.arange(B * H, dtype=np.int64), B)
    else:
        raise L2ModelError(f"head_order={head_order!r}")
    return b * H + h, b * Hk + h // g


@dataclass
class KernelL2:
    name: str
    grid: int  # thread blocks of the schedule's program (all heads)
    resident: int  # program blocks running at once
    resident_limits: dict
    dram_read: int
    dram_write: int
    dirty_at_end: int
    read_by_tensor: dict = field(default_factory=dict)
    write_by_tensor: dict = field(default_factory=dict)
    global_read: int = 0
    global_write: int = 0
    rounds: int = 0


@dataclass
class L2Result:
    schedule: str
    profile: str
    capacity: int
    kernels: list[KernelL2]
    launch: LaunchModel
    dedupe: bool
    seconds: float = 0.0

    @property
    def read_bytes(self) -> int:
        return sum(k.dram_read for k in self.kernels)

    @property
    def write_bytes(self) -> int:
        return sum(k.dram_write for k in self.kernels)

    def to_json(self) -> dict:
        return {
            "model": "l2-lru",
            "conditions": "L2 flushed before each kernel; dirty lines left in L2 at kernel end not written (ncu)",
            "capacity_bytes": self.capacity,
            "dedupe": self.dedupe,
            "launch": self.launch.note,
            "kernels": [
                {
                    "name": k.name,
                    "grid": k.grid,
                    "resident": k.resident,
                    "hbm_read_bytes": k.dram_read,
                    "hbm_write_bytes": k.dram_write,
                    "dirty_at_end_bytes": k.dirty_at_end,
                    "hbm_read_by_tensor": k.read_by_tensor,
                    "hbm_write_by_tensor": k.write_by_tensor,
                }
                for k in self.kernels
            ],
        }


def simulate_l2(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    profile: str | Profile | None = None,
    *,
    capacity: int | None = None,
    resident: int | list[int] | None = None,
    dedupe: bool = True,
    variant: str = "iosim",
    registers: int | list[int] | None = None,
    fast: bool | None = None,
    traces: list[KernelTrace] | None = None,
    partitions: bool = False,
    miss_curve: list[tuple[float, float]] | None = None,
) -> L2Result:
    """DRAM read/write bytes of every kernel of ``schedule`` under the L2 model (see the module docstring).

    ``capacity`` overrides the profile's L2 size; ``resident`` the number of program blocks running at once (one
    number, or one per kernel); ``variant``: ``"iosim"`` (our kernels' launch) or ``"fa2"`` (FlashAttention-2's)."""
    import time

    t0 = time.perf_counter()
    prof = get_profile(profile)
    cap = int(capacity if capacity is not None else prof.require("l2.capacity"))
    lm = launch_model(schedule, problem, tiles, variant=variant, registers=registers)
    if traces is None:
        traces = head_program(schedule, problem, tiles, kv_order=lm.kv_order, fast=fast)
    head_q, head_kv = _head_slots(problem, lm.head_order)
    out = []
    for ki, kt in enumerate(traces):
        klm = lm.kernels[ki]
        if resident is None:
            r_gpu, limits = resident_blocks(prof, klm.threads, klm.smem, klm.registers)
            r = max(1, r_gpu // klm.gpu_blocks_per_block)
        else:
            r = resident[ki] if isinstance(resident, (list, tuple)) else resident
            limits = {"given": r}
        at = _atomize(kt, problem)
        nb = kt.n_blocks
        costs = (3, 4) if partitions else (2, 2)
        sms = int(prof.require("sm_count"))
        order = np.arange(nb, dtype=np.int64)
        if klm.block_order == "reverse":
            order = order[::-1].copy()
        r = int(min(r, nb * len(head_q))) if nb else 1
        rd_t = np.zeros(len(TENSOR_CODES), np.int64)
        wr_t = np.zeros(len(TENSOR_CODES), np.int64)
        if nb == 0:
            rd = wr = dirty = rounds = 0
        elif miss_curve is not None:
            cx = np.array([x for x, _ in miss_curve], dtype=np.float64)
            cy = np.array([y for _, y in miss_curve], dtype=np.float64)
            rdf, wrf = np.zeros(len(TENSOR_CODES)), np.zeros(len(TENSOR_CODES))
            rd, wr, dirty, rounds = _simulate_kernel_sd(
                kt.ptr,
                at.acc_atom,
                at.acc_shape,
                kt.write,
                at.shapes,
                at.atom_bytes,
                at.atom_kv,
                at.atom_tensor,
                order,
                head_q,
                head_kv,
                r,
                dedupe,
                rdf,
                wrf,
                cx,
                cy,
                1 << 22,
            )
            rd, wr, dirty = round(rd), round(wr), round(dirty)
            rd_t, wr_t = np.round(rdf).astype(np.int64), np.round(wrf).astype(np.int64)
        else:
            rd, wr, dirty, rounds = _simulate_kernel(
                kt.ptr,
                at.acc_atom,
                at.acc_shape,
                kt.write,
                at.shapes,
                at.atom_bytes,
                at.atom_kv,
                at.atom_tensor,
                order,
                head_q,
                head_kv,
                r,
                cap,
                dedupe,
                rd_t,
                wr_t,
                costs[0],
                costs[1],
                sms,
            )
        gr, gw = _global_bytes(kt, problem, len(head_q))
        out.append(
            KernelL2(
                kt.name,
                nb * len(head_q),
                r,
                limits,
                int(rd),
                int(wr),
                int(dirty),
                {TENSOR_NAMES[i]: int(v) for i, v in enumerate(rd_t) if v},
                {TENSOR_NAMES[i]: int(v) for i, v in enumerate(wr_t) if v},
                gr,
                gw,
                int(rounds),
            )
        )
    return L2Result(schedule, prof.name, cap, out, lm, dedupe, time.perf_counter() - t0)


def _access_bytes(kt: KernelTrace, p: AttentionProblem) -> np.ndarray:
    """Bytes of each access of a trace."""
    nbytes = np.zeros(len(kt.tensor), dtype=np.int64)
    rows = kt.r1 - kt.r0
    for t in np.unique(kt.tensor):
        sel = kt.tensor == t
        name = TENSOR_NAMES[int(t)]
        if name in ("S", "P"):
            nbytes[sel] = rows[sel] * (kt.c1[sel] - kt.c0[sel]) * p.elem_bytes
        elif name in ("m", "l", "lse"):
            nbytes[sel] = rows[sel] * STAT_BYTES
        else:
            nbytes[sel] = rows[sel] * p.head_dim * p.elem_bytes
    return nbytes


def _global_bytes(kt: KernelTrace, p: AttentionProblem, n_heads: int) -> tuple[int, int]:
    """The trace's requested bytes (all heads): equal to the schedule's ``global`` count (tested)."""
    nbytes = _access_bytes(kt, p)
    return int(nbytes[~kt.write].sum()) * n_heads, int(nbytes[kt.write].sum()) * n_heads


# ----------------------------------------------------------------------------------------------------------------
# 4. Hooks for iosim.simulate


def _unsupported(result) -> str | None:
    """Why the L2 model cannot take this result (None if it can)."""
    if getattr(result, "pass_", "forward") != "forward":
        return f"pass {result.pass_!r}: the L2 model knows the forward kernels' launches only"
    if result.schedule not in ("naive", "flash1", "flash2"):
        return f"schedule {result.schedule!r}: no launch geometry known to the L2 model"
    if result.schedule != "flash2":  # traced by the Python tracer: bound its length
        p, t = result.problem, result.tiles
        tile_rows = min(t.block_q or p.seq_len, t.block_kv or p.kv_len)
        per_head = (result.counts.global_read_bytes + result.counts.global_write_bytes) // p.n_heads_total
        est = per_head // max(1, tile_rows * p.head_dim * p.elem_bytes) + p.seq_len
        if est > MAX_TRACED_ACCESSES:
            return (
                f"{result.schedule}: about {est:,} tile accesses per head, too many for the Python tracer "
                f"(limit {MAX_TRACED_ACCESSES:,})"
            )
    return None


MAX_TRACED_ACCESSES = 1_000_000  # about 2.5 s of Python tracing


def _with_model(result, text: str, **changes):
    names = {f.name for f in fields(result)}
    if "hbm_model" in names:
        return replace(result, hbm_model=text, **changes)
    new = replace(result, **changes)
    new.hbm_model = text
    return new


def apply_l2(
    result, *, capacity: int | None = None, dedupe: bool = True, miss_curve=None, strict: bool = False
):
    """A copy of an :class:`iosim.simulate.Result` whose ``hbm`` bytes (and predicted time) come from the L2 model.

    Where the model does not apply (backward pass, a schedule without a known launch, a trace too long for the
    Python tracer) the result is returned with ``hbm`` = ``global`` and ``hbm_model`` saying why (``strict``:
    raise :class:`L2ModelError` instead). ``hbm_model`` is set as a field when ``Result`` has one, else as an
    attribute; ``l2`` (the :class:`L2Result`) as an attribute."""
    from .roofline import predict

    reason = _unsupported(result)
    if reason:
        if strict:
            raise L2ModelError(reason)
        return _with_model(result, f"none: {reason}; hbm = global (two-level view)")
    l2 = simulate_l2(
        result.schedule,
        result.problem,
        result.tiles,
        result.profile,
        capacity=capacity,
        dedupe=dedupe,
        miss_curve=miss_curve,
    )
    if len(l2.kernels) != len(result.counts.kernels):
        raise L2ModelError(
            f"{result.schedule}: the L2 model saw {len(l2.kernels)} kernels, the counts "
            f"{len(result.counts.kernels)}"
        )
    hbm_read = [k.dram_read for k in l2.kernels]
    hbm_write = [k.dram_write for k in l2.kernels]
    time = predict(
        result.counts,
        [r + w for r, w in zip(hbm_read, hbm_write, strict=True)],
        result.problem.dtype,
        result.profile,
    )
    cap = l2.capacity
    text = (
        f"l2-lru: {cap:,} B L2, {l2.kernels[0].resident} blocks resident, L2 flushed before each kernel, "
        "dirty lines left at the end not written (Nsight Compute's conditions); iosim.l2"
    )
    new = _with_model(result, text, hbm_read=hbm_read, hbm_write=hbm_write, time=time)
    new.l2 = l2  # the model's details (per-tensor misses, residency, dirty bytes left at the end)
    return new


def simulate_hbm(schedule: str, problem: AttentionProblem, profile: str | Profile | None = None, **kw):
    """``iosim.simulate.simulate`` followed by :func:`apply_l2` (keywords ``capacity``, ``dedupe``, ``miss_curve``,
    ``strict`` go to the L2 model, the rest to ``simulate``)."""
    import inspect

    from .simulate import simulate

    l2kw = {k: kw.pop(k) for k in ("capacity", "dedupe", "miss_curve", "strict") if k in kw}
    if "l2" in inspect.signature(simulate).parameters:
        kw.setdefault("l2", False)  # applied once, below, with the keywords given here
    return apply_l2(simulate(schedule, problem, profile, **kw), **l2kw)


# ----------------------------------------------------------------------------------------------------------------
# 5. Reference: a plain line-level LRU over the exact trace (for tests; slow, small problems only)


def reference_lines(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    profile: str | Profile | None = None,
    *,
    capacity: int,
    line: int = 128,
    resident: int | list[int] | None = None,
    variant: str = "iosim",
    traces: list[KernelTrace] | None = None,
) -> list[tuple[int, int, int]]:
    """(dram_read, dram_write, dirty_at_end) per kernel from an OrderedDict LRU over lines of real addresses.

    Addresses follow the GPU layouts: Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); S, P (B, H, N, N_kv);
    lse, m, l (B, H, N). Every tensor is line-aligned in its own address range. Each access is walked row by
    row, line by line, in the round-robin order of :func:`simulate_l2` without de-duplication."""
    from collections import OrderedDict

    p = problem
    prof = get_profile(profile)
    lm = launch_model(schedule, p, tiles, variant=variant)
    if traces is None:
        traces = trace_program(schedule, p, tiles, kv_order=lm.kv_order)
    head_q, head_kv = _head_slots(p, lm.head_order)
    H, Hk, N, Nk, d, e = p.heads, p.kv_heads, p.seq_len, p.kv_len, p.head_dim, p.elem_bytes
    region = 1 << 40

    def addr(t, qh, kvh, r, c):
        name = TENSOR_NAMES[t]
        base = t * region
        if name in ("Q", "O"):
            b, h = divmod(qh, H)
            return base + (((b * N + r) * H + h) * d + c) * e
        if name in ("K", "V"):
            b, h = divmod(kvh, Hk)
            return base + (((b * Nk + r) * Hk + h) * d + c) * e
        if name in ("S", "P"):
            return base + ((qh * N + r) * Nk + c) * e
        return base + (qh * N + r) * STAT_BYTES

    out = []
    for ki, kt in enumerate(traces):
        klm = lm.kernels[ki]
        if resident is None:
            r_gpu, _ = resident_blocks(prof, klm.threads, klm.smem, klm.registers)
            R = max(1, r_gpu // klm.gpu_blocks_per_block)
        else:
            R = resident[ki] if isinstance(resident, (list, tuple)) else resident
        nb = kt.n_blocks
        order = list(range(nb))[::-1] if klm.block_order == "reverse" else list(range(nb))
        queue = [(h, order[b]) for h in range(len(head_q)) for b in range(nb)]
        cache: OrderedDict = OrderedDict()  # line -> dirty bytes
        lines_cap = capacity // line
        rd = wr = 0
        slots = [None] * min(R, len(queue))
        nxt_blk = 0
        for s in range(len(slots)):
            h, b = queue[nxt_blk]
            slots[s] = [h, int(kt.ptr[b]), int(kt.ptr[b + 1])]
            nxt_blk += 1
        while any(sl is not None for sl in slots):
            for s, sl in enumerate(slots):
                if sl is None:
                    continue
                h, pos, end = sl
                if pos < end:
                    t = int(kt.tensor[pos])
                    w = bool(kt.write[pos])
                    name = TENSOR_NAMES[t]
                    r0, r1 = int(kt.r0[pos]), int(kt.r1[pos])
                    if name in ("S", "P"):
                        c0, c1 = int(kt.c0[pos]), int(kt.c1[pos])
                    elif name in ("m", "l", "lse"):
                        c0, c1 = 0, 1
                    else:
                        c0, c1 = 0, d
                    el = STAT_BYTES if name in ("m", "l", "lse") else e
                    for r in range(r0, r1):
                        a0 = addr(t, int(head_q[h]), int(head_kv[h]), r, c0)
                        nbytes = (c1 - c0) * el
                        for ln in range(a0 // line, (a0 + nbytes - 1) // line + 1):
                            lo, hi = max(a0, ln * line), min(a0 + nbytes, (ln + 1) * line)
                            if ln in cache:
                                cache.move_to_end(ln)
                                if w:
                                    cache[ln] = min(line, cache[ln] + hi - lo)  # each byte is written once
                            else:
                                if not w:
                                    rd += hi - lo
                                cache[ln] = hi - lo if w else 0  # dirty bytes of the line
                                if len(cache) > lines_cap:
                                    _, dt = cache.popitem(last=False)
                                    wr += dt
                    sl[1] = pos + 1
                    pos += 1
                if pos >= end:
                    if nxt_blk < len(queue):
                        hh, b = queue[nxt_blk]
                        slots[s] = [hh, int(kt.ptr[b]), int(kt.ptr[b + 1])]
                        nxt_blk += 1
                    else:
                        slots[s] = None
        dirty_end = sum(cache.values())
        out.append((rd, wr, dirty_end))
    return out


def compulsory(schedule: str, problem: AttentionProblem, tiles: Tiles) -> list[tuple[int, int]]:
    """Unique bytes read and written per kernel (all heads): DRAM traffic when everything fits in L2 and the
    written bytes are all evicted (upper bound of written bytes under ncu)."""
    res = simulate_l2(schedule, problem, tiles, "h100-sxm5-80gb", capacity=1 << 62)
    return [(k.dram_read, k.dirty_at_end) for k in res.kernels]


__all__ = [
    "L2ModelError",
    "L2Result",
    "Tracer",
    "apply_l2",
    "compulsory",
    "head_program",
    "launch_model",
    "reference_lines",
    "resident_blocks",
    "simulate_hbm",
    "simulate_l2",
    "trace_program",
]
