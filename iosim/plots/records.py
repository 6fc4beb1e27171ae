"""Records into series and words: which cases form one line, what a legend entry and a hover text say.

A record is one simulated case as a flat dict (``iosim.scenario.RECORD_FIELDS``). Hover text gives bytes in
decimal units with the exact integer beside them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..units import fmt_bytes
from .style import PROFILE_SYMBOLS

# Fields that tell two series apart; tiles are a property of a series only where they are swept.
GROUP_FIELDS = ["profile", "schedule", "pass", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal"]
TAGS = {"V": "verbatim in the source", "F": "read off a published figure",
        "T": "third-party transcription (unverified)", "D": "derived by arithmetic", "measured": "measured"}


def varying(records: list[dict], fields: Iterable[str]) -> list[str]:
    return [f for f in fields if len({r.get(f) for r in records}) > 1]


def follows(records: list[dict], field: str, x: str) -> bool:
    """Whether ``field`` takes one value per value of ``x`` (batch in a sweep that keeps batch × N fixed):
    then it moves along the line rather than telling lines apart."""
    seen: dict = {}
    return all(seen.setdefault(r.get(x), r.get(field)) == r.get(field) for r in records)


def series(records: list[dict], x: str) -> list[tuple[dict, list[dict]]]:
    """Split records into series: one per combination of the identity fields that vary, except x and the
    fields that follow x."""
    keys = [f for f in varying(records, GROUP_FIELDS) if f != x and not follows(records, f, x)]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for key, rows in groups.items():
        rows = sorted(rows, key=lambda r: (r.get(x) is None, r.get(x)))
        out.append((dict(zip(keys, key)), rows))
    return out


def label(ident: dict, schedule: str | None = None) -> str:
    """A legend entry: the schedule, then the fields that tell this series apart."""
    parts = [schedule] if schedule and "schedule" not in ident else []
    for k, v in ident.items():
        if k in ("schedule", "profile"):
            parts.append(str(v))
        elif k == "causal":
            parts.append("causal" if v else "non-causal")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def problem_line(r: dict) -> str:
    kv = f", kv_heads={r['kv_heads']}" if r.get("kv_heads") != r.get("heads") else ""
    nk = f", kv_len={r['kv_len']:,}" if r.get("kv_len") != r.get("seq_len") else ""
    return (f"batch={r['batch']}, heads={r['heads']}{kv}, N={r['seq_len']:,}{nk}, d={r['head_dim']}, "
            f"{r['dtype']}{', causal' if r.get('causal') else ''}")


def tiles_line(r: dict) -> str:
    if r.get("block_q") is None:
        return "untiled (each GEMM reads its operands once)"
    m = f" (M = {r['sram_elements']:,} elements)" if r.get("sram_elements") else ""
    return f"Br={r['block_q']}, Bc={r['block_kv']}{m}"


def hover(r: dict, lines: list[str]) -> str:
    head = f"<b>{r['schedule']}</b> on {r['profile']}<br>{problem_line(r)}<br>tiles: {tiles_line(r)}"
    if r.get("fits") is False:
        head += "<br><i>hypothetical: " + (r.get("note") or "tiles exceed the GPU's on-chip memory") + "</i>"
    return head + "<br>" + "<br>".join(lines)


def bytes_hover(n) -> str:
    return "n/a" if n is None else f"{fmt_bytes(n)} ({int(n):,} B)"


def profile_symbols(records: list[dict]) -> dict:
    """Marker symbol per profile when several profiles share a figure."""
    profiles = sorted({r["profile"] for r in records})
    return {p: PROFILE_SYMBOLS[i % len(PROFILE_SYMBOLS)] for i, p in enumerate(profiles)}


def length_axis(records: list[dict]) -> tuple[str, str]:
    """N along x, or N_kv when only the key/value length varies (decoding: one query, a growing cache)."""
    if len({r["seq_len"] for r in records}) == 1 and len({r["kv_len"] for r in records}) > 1:
        return "kv_len", "key/value length N_kv (tokens)"
    return "seq_len", "sequence length N (tokens)"


def case_key(r: dict) -> tuple:
    """The problem and profile of a case, without its schedule: the key to compare two schedules on."""
    return tuple(r.get(k) for k in ("profile", "pass", "batch", "heads", "kv_heads", "seq_len", "kv_len",
                                     "head_dim", "dtype", "causal"))
