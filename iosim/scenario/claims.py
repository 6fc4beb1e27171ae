"""Published numbers checked against the simulator: select the cases a claim names, round the computed value
to the published digits and units, and compare the text."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .run import ScenarioRun
from .schema import Claim, ScenarioError


def select(records: list[dict], where: dict) -> list[dict]:
    def ok(rec):
        for k, want in where.items():
            have = rec.get(k)
            if isinstance(want, list):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True

    return [r for r in records if ok(r)]


def claim_value(records: list[dict], claim: Claim) -> float:
    rows = select(records, claim.where)
    if not rows:
        raise ScenarioError(f"claim {claim.label!r}: no case matches where={claim.where}; fix its 'where'")
    values = set()
    for r in rows:
        q = claim.quantity
        if q == "one_plus_n_over_d":
            v = 1 + r["kv_len"] / r["head_dim"]
        else:
            v = r[q]
        if v is None:
            raise ScenarioError(f"claim {claim.label!r}: {q} is not known for case {r['case']} ({r.get('error')})")
        values.add(round(v, 9) if isinstance(v, float) else v)
    if len(values) != 1:
        raise ScenarioError(f"claim {claim.label!r}: the {len(rows)} cases matching where={claim.where} give "
                            f"different values {sorted(values)}; narrow its 'where'")
    return values.pop()


def round_sig(x: float, digits: int) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def format_sig(x: float, digits: int, units: str) -> str:
    """``format_sig(4429185024, 3, 'decimal') == '4.43 GB'``; binary: '256 MiB'; ratio: '33x'."""
    if units == "ratio":
        return f"{_trim(round_sig(x, digits), digits)}x"
    if units == "plain":
        return _trim(round_sig(x, digits), digits)
    steps = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")) if units == "decimal" else \
        ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))
    for factor, prefix in steps:
        if abs(x) >= factor:
            return f"{_trim(round_sig(x / factor, digits), digits)} {prefix}B"
    return f"{_trim(round_sig(x, digits), digits)} B"


def _trim(v: float, digits: int) -> str:
    """Print with no more decimals than the significant digits need (no trailing '.0')."""
    if v == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    s = f"{v:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


@dataclass
class ClaimCheck:
    claim: Claim
    value: float | None
    shown: str
    ok: bool
    error: str | None = None


def check_claims(run_or_records, claims: list[Claim]) -> list[ClaimCheck]:
    records = run_or_records.records if isinstance(run_or_records, ScenarioRun) else run_or_records
    out = []
    for c in claims:
        try:
            v = claim_value(records, c)
        except ScenarioError as exc:
            out.append(ClaimCheck(c, None, "n/a", False, str(exc)))
            continue
        shown = format_sig(v, c.digits, c.units)
        out.append(ClaimCheck(c, v, shown, shown == c.expect))
    return out
