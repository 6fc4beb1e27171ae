"""Reference for the L2 model: a plain line-level LRU over the exact trace (slow; small problems only).

Addresses follow the GPU layouts: Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); S, P (B, H, N, N_kv); lse, m, l
(B, H, N). Every tensor is line-aligned in its own address range. Each access is walked row by row, line by line,
in the round-robin order of the model's round loop, in lockstep and without de-duplication.
"""

from __future__ import annotations

from collections import OrderedDict

from iosim.hardware.gpu import get_profile
from iosim.l2 import TENSOR_NAMES, head_slots, trace_program
from iosim.launch import launch_model, resident_blocks
from iosim.problem import STAT_BYTES, AttentionProblem

REGION = 1 << 40  # each tensor's address range


def _address(p: AttentionProblem, t: int, qh: int, kvh: int, r: int, c: int) -> int:
    name, e = TENSOR_NAMES[t], p.elem_bytes
    base = t * REGION
    if name in ("Q", "O"):
        b, h = divmod(qh, p.heads)
        return base + (((b * p.seq_len + r) * p.heads + h) * p.head_dim + c) * e
    if name in ("K", "V"):
        b, h = divmod(kvh, p.kv_heads)
        return base + (((b * p.kv_len + r) * p.kv_heads + h) * p.head_dim + c) * e
    if name in ("S", "P"):
        return base + ((qh * p.seq_len + r) * p.kv_len + c) * e
    return base + (qh * p.seq_len + r) * STAT_BYTES


class LineLRU:
    """An LRU of whole lines, each with its count of dirty bytes; DRAM bytes read and written."""

    def __init__(self, capacity: int, line: int):
        self.lines, self.line = OrderedDict(), line
        self.capacity_lines = capacity // line
        self.read = self.written = 0

    def touch(self, a0: int, nbytes: int, write: bool) -> None:
        line = self.line
        for ln in range(a0 // line, (a0 + nbytes - 1) // line + 1):
            lo, hi = max(a0, ln * line), min(a0 + nbytes, (ln + 1) * line)
            if ln in self.lines:
                self.lines.move_to_end(ln)
                if write:
                    self.lines[ln] = min(line, self.lines[ln] + hi - lo)  # each byte is written once
                continue
            if not write:
                self.read += hi - lo
            self.lines[ln] = hi - lo if write else 0
            if len(self.lines) > self.capacity_lines:
                self.written += self.lines.popitem(last=False)[1]


def _walk_access(p: AttentionProblem, kt, pos: int, qh: int, kvh: int, cache: LineLRU) -> None:
    t = int(kt.tensor[pos])
    name = TENSOR_NAMES[t]
    if name in ("S", "P"):
        c0, c1 = int(kt.c0[pos]), int(kt.c1[pos])
    else:
        c0, c1 = (0, 1) if name in ("m", "l", "lse") else (0, p.head_dim)
    el = STAT_BYTES if name in ("m", "l", "lse") else p.elem_bytes
    for r in range(int(kt.r0[pos]), int(kt.r1[pos])):
        cache.touch(_address(p, t, qh, kvh, r, c0), (c1 - c0) * el, bool(kt.write[pos]))


def _run_kernel(p: AttentionProblem, kt, queue: list, resident: int, cache: LineLRU) -> None:
    """Round robin over ``resident`` slots; a finished block hands its slot to the next one in ``queue``."""
    head_q, head_kv = head_slots(p, "batch_major")
    slots = [None] * min(resident, len(queue))
    nxt = 0
    for s in range(len(slots)):
        h, b = queue[nxt]
        slots[s] = [h, int(kt.ptr[b]), int(kt.ptr[b + 1])]
        nxt += 1
    while any(sl is not None for sl in slots):
        for s, sl in enumerate(slots):
            if sl is None:
                continue
            h, pos, end = sl
            if pos < end:
                _walk_access(p, kt, pos, int(head_q[h]), int(head_kv[h]), cache)
                sl[1] = pos = pos + 1
            if pos >= end:
                if nxt < len(queue):
                    hh, b = queue[nxt]
                    slots[s] = [hh, int(kt.ptr[b]), int(kt.ptr[b + 1])]
                    nxt += 1
                else:
                    slots[s] = None


def reference_lines(schedule: str, p: AttentionProblem, tiles, profile, *, capacity: int, line: int = 128,
                    resident: int | None = None) -> list[tuple[int, int, int]]:
    """(DRAM read, DRAM write, dirty bytes at the end) per kernel of ``schedule``, iosim's launch."""
    prof = get_profile(profile)
    lm = launch_model(schedule, p, tiles)
    out = []
    for klm, kt in zip(lm.kernels, trace_program(schedule, p, tiles, kv_order=lm.kv_order), strict=True):
        r = resident if resident is not None else resident_blocks(prof, klm.threads, klm.smem, klm.registers)[0]
        order = list(range(kt.n_blocks))
        if klm.block_order == "reverse":
            order.reverse()
        queue = [(h, b) for h in range(p.n_heads_total) for b in order]
        cache = LineLRU(capacity, line)
        _run_kernel(p, kt, queue, r, cache)
        out.append((cache.read, cache.written, sum(cache.lines.values())))
    return out
