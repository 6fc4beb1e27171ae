"""Reading measurement records back: from a JSON file, a folder, or a compressed archive (``.tar.xz``), with the
repeated launches of one run merged (medians, and each launch's DRAM bytes for the range).

Records written before the runs had their own descriptions (one ``config`` dict of 21 fields, kinds that are no
longer measured) are read too: their kept kinds become runs, the others are skipped.
"""

from __future__ import annotations

import json
import statistics
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from .runs import ATTENTION_KINDS, Attention, MeasureError, ReadProbe, Run, WriteProbe, from_dict, to_dict

_ATTENTION_FIELDS = ("kind", "seq_len", "heads", "kv_heads", "batch", "kv_len", "head_dim", "dtype", "causal",
                     "block_q", "block_kv")


def _legacy_run(c: dict) -> Run | None:
    """The run a legacy ``config`` described, or None for a kind or variant no longer measured."""
    kind = c.get("kind")
    if kind in ATTENTION_KINDS:
        return Attention(**{k: c[k] for k in _ATTENTION_FIELDS if k in c})
    if kind == "l2probe":
        return ReadProbe(c["nbytes"], c.get("blocks_per_sm", 8), c.get("threads", 256))
    if kind == "l2write" and not (c.get("read_written") or c.get("spin_us")):
        return WriteProbe(c["nbytes"], c.get("read_bytes", 0), c.get("read_shared", False), c.get("interleave", False))
    return None  # copy, l2bw, l2reuse, read-back and idling probes: tried and not adopted


def run_of(entry: dict) -> Run | None:
    """The run an entry measured (``run``, or a legacy ``config``)."""
    if "run" in entry:
        return from_dict(entry["run"])
    return _legacy_run(entry["config"])


@dataclass
class Measured:
    """One run's launches merged: ``measured`` the median of each counter over the launches without error,
    ``launches`` each one's DRAM bytes read and written, ``time_ms`` the median time."""

    run: Run
    device: dict
    measured: dict
    launches: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    launch: dict | None = None
    time_ms: float | None = None
    error: str | None = None


def _entries(data: dict) -> list[dict]:
    return data.get("entries", data.get("configs", []))


def merge_repeats(data: dict) -> list[Measured]:
    """The record's entries grouped by run (in first-seen order), each group merged (see :class:`Measured`)."""
    groups: dict[str, list[dict]] = {}
    runs: dict[str, Run] = {}
    for e in _entries(data):
        run = run_of(e)
        if run is None:
            continue
        key = json.dumps(to_dict(run), sort_keys=True)
        runs[key] = run
        groups.setdefault(key, []).append(e)
    out = []
    for key, es in groups.items():
        ok = [e for e in es if not e.get("error") and e.get("measured")]
        first = ok[0] if ok else es[0]
        med = dict(first.get("measured") or {})
        for k, v in med.items():
            vals = [e["measured"].get(k) for e in ok]
            if isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
                med[k] = statistics.median(vals)
        times = [e["time_ms"] for e in ok if e.get("time_ms")]
        launches = [{"dram_read_bytes": e["measured"]["dram_read_bytes"],
                     "dram_write_bytes": e["measured"]["dram_write_bytes"]} for e in ok]
        out.append(Measured(runs[key], data.get("device", {}), med, launches, first.get("kernels", []),
                            first.get("launch"), statistics.median(times) if times else None,
                            None if ok else first.get("error", "no measurement")))
    return out


def read_records(source: str | Path, parts: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Every ``measured_<part>.json`` of ``source`` (a JSON file, a folder, or a ``.tar.xz``/``.tgz`` archive of
    them), by part name; ``parts`` keeps only those."""
    p = Path(source)
    found: dict[str, dict] = {}
    if p.is_file() and p.suffix == ".json":
        found[p.stem.removeprefix("measured_")] = json.loads(p.read_text())
    elif p.is_dir():
        for f in sorted(p.glob("measured_*.json")):
            found[f.stem.removeprefix("measured_")] = json.loads(f.read_text())
    elif p.is_file() and tarfile.is_tarfile(p):
        with tarfile.open(p) as tar:
            for m in tar.getmembers():
                name = Path(m.name).name
                if m.isfile() and name.startswith("measured_") and name.endswith(".json"):
                    found[name[len("measured_"):-len(".json")]] = json.load(tar.extractfile(m))
    else:
        raise MeasureError(f"{source}: not a measured_*.json, a folder of them or a tar archive of them")
    return {k: v for k, v in found.items() if parts is None or k in parts}


def read_member(archive: str | Path, suffix: str) -> dict[str, bytes]:
    """The raw bytes of every member of ``archive`` whose name ends with ``suffix`` (e.g. ``.npz``), by name."""
    with tarfile.open(archive) as tar:
        return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers()
                if m.isfile() and m.name.endswith(suffix)}
