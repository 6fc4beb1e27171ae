"""A scenario run as ``iosim run`` saves it in ``results.json`` (docs/json.md, "Scenario results"), as a typed model:
written from it, validated against it when ``iosim plot`` reads it back, its JSON Schema published as
``docs/schema/results.schema.json`` (``iosim schema results``).

A record is one case's flat row (the columns of ``results.csv``, which the figures read); a result is the case's
full :class:`~iosim.result.ResultJSON`, or null where the case could not run (its record's ``error`` says why).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..problem import DType
from ..result import ResultJSON, TensorBytes
from .schema import Scenario


class _Saved(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Record(_Saved):
    """One case, flat: what ``results.csv`` holds (every field but ``by_tensor``) and the figures read. The
    counts are null where the case could not run (``error``)."""

    case: int
    profile: str
    schedule: str
    pass_: Literal["forward", "backward", "both"] = Field(alias="pass")
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    kv_len: int
    head_dim: int
    dtype: DType
    causal: bool
    block_q: int | None
    block_kv: int | None
    sram_elements: int | None
    fits: bool
    hbm_model: Literal["l2", "none"] | None
    global_read_bytes: int | None
    global_write_bytes: int | None
    global_bytes: int | None
    hbm_read_bytes: int | None
    hbm_write_bytes: int | None
    hbm_bytes: int | None
    sram_read_bytes: int | None
    sram_write_bytes: int | None
    sram_bytes: int | None
    compulsory_bytes: int = Field(description="Q, K, V read once and O written once")
    global_over_compulsory: float | None
    hbm_over_compulsory: float | None
    matrix_bytes: int = Field(description="one N x N_kv matrix (S or P) of one head")
    linear_bytes: int = Field(description="Q, K, V and O of one head")
    flops_matmul: int | None
    flops_exp: int | None
    flops_other: int | None
    flops_total: int | None
    conventional_flops: int | None
    predicted_s: float | None
    bound: str | None
    time_kernel: str | None
    time_calibration: str | None
    roofline_s: float | None
    arithmetic_intensity: float | None
    attained_flops_per_s: float | None
    energy_j: float | None = Field(None, description="joules of one call (time.energy_j: at the clock the power "
                                   "limiter leaves the records' median call); absent in runs saved before it")
    clock_hz: float | None = Field(None, description="the SM clock of the records' median call under the power "
                                   "limiter (time.clock; the mean where it straddles two); absent where none")
    sram_peak_bytes: int | None
    note: str | None
    error: str | None
    by_tensor: dict[str, TensorBytes] | None = Field(None, description="global bytes per tensor (by_tensor.csv); "
                                                      "absent where the case could not run")

    @model_serializer(mode="wrap")
    def _by_tensor_where_known(self, handler):
        data = handler(self)
        if "by_tensor" not in self.model_fields_set:
            data.pop("by_tensor", None)
        return data


RECORD_FIELDS = [f.alias or name for name, f in Record.model_fields.items() if name != "by_tensor"]


class ProfileRates(_Saved):
    """What a figure needs from a profile, so that ``iosim plot`` needs no profile files."""

    name: str
    display_name: str
    dram_bandwidth: float | None
    l2_bandwidth: float | None
    matmul: dict[str, float | None] = Field(description="tensor-core FLOP/s per dtype (fp32: the plain rate)")
    fp32: float | None
    smem_per_block: int | None


class ClaimOutcome(_Saved):
    label: str
    expect: str = Field(description="the published text")
    shown: str = Field(description="the simulated value, rounded as the claim says ('n/a' where none)")
    value: int | float | None
    ok: bool
    error: str | None


class SavedRun(_Saved):
    """The whole of ``results.json``."""

    iosim_version: str
    scenario: Scenario
    scenario_file: str
    profiles: dict[str, ProfileRates]
    claims: list[ClaimOutcome]
    records: list[Record]
    results: list[ResultJSON | None]

    def to_json(self) -> dict:
        """Plain values in the file's key order (``json.dumps`` writes it)."""
        return self.model_dump(by_alias=True, mode="json")
