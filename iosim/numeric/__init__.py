"""Numeric execution: the very tile programs the counter costs, run on NumPy arrays, and float64 references.

    >>> from iosim.numeric import execute, reference
    >>> O, stats = execute("flash2", problem, q, k, v)      # q: (batch, seq_len, heads, head_dim)
    >>> reference(problem, q, k, v)                          # softmax(scale · Q Kᵀ) V in float64
"""

from .execute import execute, execute_backward
from .machine import E4M3_MAX, F32, NumericMachine, round_to_dtype
from .reference import reference, reference_backward, reference_block_sparse

__all__ = ["E4M3_MAX", "F32", "NumericMachine", "execute", "execute_backward", "reference", "reference_backward",
           "reference_block_sparse", "round_to_dtype"]
