"""What every backward pass shares: the reduction of grouped-query gradients.

With grouped-query heads (``group`` query heads per key/value head) each query head's backward program
produces its own dK, dV (N_kv×d, problem dtype), as FlashAttention-2 does in an expanded buffer; a final
kernel sums them over the group. That kernel is the same whatever the schedule, and it works per kv head,
so it is counted here for the whole problem rather than inside a one-head program:

    reads  batch·heads·N_kv·d elements of dK and of dV    (every query head's copy)
    writes batch·kv_heads·N_kv·d elements of dK and of dV (the sums)

A program whose unit is a whole kv head (flash2's ``gqa="grouped"``, iosim's own kernel) sums dK, dV over the
group on chip and writes them once: no copies, so no reduction kernel.
"""

from __future__ import annotations

from ..blocks import cdiv
from ..counts import KernelCounts
from ..problem import AttentionProblem

REDUCE_ROWS = 128  # rows of dK, dV one thread block of the reduction sums (sets its grid only)


def group_sum(p: AttentionProblem, unit: str = "head") -> list[KernelCounts]:
    """The dK/dV group reduction for the whole problem after a backward program of ``unit`` ([] without
    grouped-query heads, or when the unit is a kv head: its program wrote the sums)."""
    if p.group == 1 or unit == "kv_head":
        return []
    b, d, Nk = p.elem_bytes, p.head_dim, p.kv_len
    copies, sums = p.batch * p.heads * Nk * d * b, p.batch * p.kv_heads * Nk * d * b
    k = KernelCounts("bwd_dkdv_group_sum", grid=p.batch * p.kv_heads * cdiv(Nk, REDUCE_ROWS))
    k.global_read.update(dK=copies, dV=copies)
    k.global_write.update(dK=sums, dV=sums)
    k.flops.update(other=2 * p.batch * p.kv_heads * Nk * d * (p.group - 1))  # group - 1 adds per element
    k.sram_write = k.sram_read = 2 * copies
    return [k]
