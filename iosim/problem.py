"""The attention problem: shapes, dtype, causality, scale.

Conventions (docs/concepts.md): Q, K, V, O, S, P are stored in the problem dtype; softmax statistics
(m, l, logsumexp) in fp32. Causal masking is aligned to the bottom-right corner when seq_len != kv_len, as
FlashAttention >= 2.1 does: query row i sees key j iff ``j <= i + (kv_len - seq_len)``. A query row that
sees no key (possible when seq_len > kv_len) produces zeros.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DType = Literal["fp32", "fp16", "bf16", "fp8"]  # fp8 = e4m3 (FlashAttention-3's fp8 forward)
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
STAT_BYTES = 4  # m, l, logsumexp are fp32 in every schedule

# The largest problem iosim takes. Sequence lengths: the tile walks sum visited score elements in 64-bit integers,
# exact while N·N_kv <= 2^62. Tensors: Q, K, V and O together at most 2^50 B (1.13 PB), thousands of times the
# memory of any GPU (iosim models one GPU); beyond it the L2 model's per-head arrays alone would not fit in RAM.
MAX_LEN = 2**31
MAX_TENSOR_BYTES = 2**50


class ProblemError(ValueError):
    """Invalid problem: the message names the field, the value and what is expected."""


class InputWarning(UserWarning):
    """A questionable input: the simulation runs, but its result may not mean what you expect (the message says
    why and what to change). ``warnings.simplefilter("error", InputWarning)`` turns these into errors."""


class AttentionProblem(BaseModel):
    """softmax(scale · Q Kᵀ) V for ``batch × heads`` heads, queries (seq_len, head_dim), keys (kv_len, head_dim)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int = Field(1, ge=1, description="independent sequences")
    heads: int = Field(1, ge=1, description="query heads")
    kv_heads: int | None = Field(None, ge=1, description="key/value heads (grouped-query); default = heads")
    seq_len: int = Field(ge=1, le=MAX_LEN, description="query length N (at most 2^31)")
    kv_len: int | None = Field(None, ge=1, le=MAX_LEN, description="key/value length; default = seq_len")
    head_dim: int = Field(128, ge=1, description="d")
    dtype: DType = "fp16"
    causal: bool = False
    scale: float | None = Field(None, gt=0, allow_inf_nan=False,
                                 description="softmax scale, finite and > 0; default 1/sqrt(head_dim)")

    @field_validator("batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", mode="before")
    @classmethod
    def _no_bools(cls, v):  # pydantic reads True as 1: seq_len=True would be a problem of length 1
        if isinstance(v, (bool, np.bool_)):
            raise ValueError("expected a whole number, not a bool")
        return v

    @model_validator(mode="after")
    def _fill_defaults(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kv_len is None:
            object.__setattr__(self, "kv_len", self.seq_len)
        if self.scale is None:
            object.__setattr__(self, "scale", 1.0 / math.sqrt(self.head_dim))
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}: "
                "each key/value head must serve a whole group of query heads"
            )
        if self.tensor_bytes > MAX_TENSOR_BYTES:
            raise ValueError(
                f"{self.describe()}: Q, K, V and O would take {self.tensor_bytes:,} B, more than the "
                f"{MAX_TENSOR_BYTES:,} B (2^50) iosim takes, thousands of times any GPU's memory; "
                "use fewer heads, a smaller batch or shorter sequences"
            )
        return self

    def __init__(self, **kwargs):
        """Validate the fields; a bad one raises :class:`ProblemError` (a ValueError) naming the field, the value
        given and what is expected, one clause per bad field (not pydantic's ValidationError)."""
        try:
            super().__init__(**kwargs)
        except ValidationError as err:
            raise ProblemError(_worded(err)) from None

    @classmethod
    def make(cls, **kwargs) -> AttentionProblem:
        """Build a problem (the same as ``AttentionProblem(**kwargs)``: errors are ProblemError)."""
        return cls(**kwargs)

    # -- derived sizes -------------------------------------------------------------------------------
    @property
    def elem_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    @property
    def n_heads_total(self) -> int:
        return self.batch * self.heads

    @property
    def causal_offset(self) -> int:
        """Query row i sees keys j <= i + causal_offset (bottom-right alignment)."""
        return self.kv_len - self.seq_len

    @property
    def tensor_bytes(self) -> int:
        """Bytes of Q, K, V and O in the problem dtype: what must sit in GPU memory while the kernel runs."""
        rows = self.heads * self.seq_len * 2 + self.kv_heads * self.kv_len * 2  # Q, O; K, V
        return self.batch * rows * self.head_dim * self.elem_bytes

    def visible_keys(self, row: int) -> int:
        """Number of keys query ``row`` attends to."""
        if not self.causal:
            return self.kv_len
        return max(0, min(self.kv_len, row + self.causal_offset + 1))

    def conventional_flops(self) -> int:
        """The field's throughput convention: 4·N·N_kv·d per head, halved for causal (FA2/FA3 benchmarks)."""
        f = 4 * self.seq_len * self.kv_len * self.head_dim * self.n_heads_total
        return f // 2 if self.causal else f

    def describe(self) -> str:
        kv = f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        nk = f", kv_len={self.kv_len}" if self.kv_len != self.seq_len else ""
        return (
            f"batch={self.batch}, heads={self.heads}{kv}, seq_len={self.seq_len}{nk}, "
            f"head_dim={self.head_dim}, {self.dtype}{', causal' if self.causal else ''}"
        )


def _worded(err: ValidationError) -> str:
    """pydantic's errors as one clause per bad field: ``field=value: what is expected``."""
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "problem"
        value, msg = e.get("input"), e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown field")
        elif not e["loc"]:  # a check across fields
            parts.append(msg)
        elif e["type"] == "less_than_equal" and field in ("seq_len", "kv_len"):
            parts.append(f"{field}={value!r}: at most {MAX_LEN:,} (2^31): iosim counts visited score "
                         "elements exactly in 64-bit integers up to N·N_kv = 2^62")
        else:
            parts.append(f"{field}={value!r}: {msg}")
    return "; ".join(parts)
