"""Measure attention kernels and calibration probes on the GPU with Nsight Compute (``ncu``), and time them.

    >>> from iosim.measure import Attention, WriteProbe, measure
    >>> rec = measure([Attention("flash2", seq_len=4096, heads=32), WriteProbe(8 << 20, read_bytes=32 << 20)])
    >>> rec.entries[0]["measured"]["dram_read_bytes"]                      # needs a GPU and ncu

A run describes one kernel call (:mod:`iosim.measure.runs`): our schedules, torch SDPA's backends, or a
calibration probe (kernels/probes.cu). :mod:`~iosim.measure.ncu` names the counters and reads ncu's CSV;
:mod:`~iosim.measure.driver` runs the worker (:mod:`~iosim.measure.worker`) under ncu and merges the profiles;
:mod:`~iosim.measure.records` reads the records back (repeats, archives); :mod:`~iosim.measure.timeline` records
flash2's block timeline. Importing this package needs neither CuPy nor a GPU.
"""

from .driver import Options, Record, measure, require_gpu, to_csv, use_dram_pass
from .ncu import (
    CORE_METRICS,
    DRAM_METRICS,
    OPTIONAL_METRICS,
    choose_metrics,
    find_ncu,
    group_by_marker,
    parse_ncu_csv,
    sum_launches,
    summarize,
)
from .runs import (
    ATTENTION_KINDS,
    BACKWARD_KINDS,
    PROBE_KINDS,
    Attention,
    MeasureError,
    ReadProbe,
    Run,
    WriteProbe,
    from_dict,
    to_dict,
)
from .worker import device_identity

__all__ = [
    "ATTENTION_KINDS",
    "BACKWARD_KINDS",
    "CORE_METRICS",
    "DRAM_METRICS",
    "OPTIONAL_METRICS",
    "PROBE_KINDS",
    "Attention",
    "MeasureError",
    "Options",
    "ReadProbe",
    "Record",
    "Run",
    "WriteProbe",
    "choose_metrics",
    "device_identity",
    "find_ncu",
    "from_dict",
    "group_by_marker",
    "measure",
    "parse_ncu_csv",
    "require_gpu",
    "sum_launches",
    "summarize",
    "to_csv",
    "to_dict",
    "use_dram_pass",
]
