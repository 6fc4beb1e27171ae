"""Results on disk, figures from scenario specs, and the one-file HTML report.

``iosim run`` = :func:`run_scenario` + :func:`write_run` (tidy CSV + JSON + one HTML and one CSV per figure);
``iosim plot`` = :func:`load_run` + :func:`write_figures` (no simulation); ``iosim report`` =
:func:`render_report`: one self-contained HTML file with plotly's JavaScript embedded once, so it opens offline.
:mod:`.figures` and :mod:`.tables` turn a scenario's specs into figures and tables, :mod:`.measured` reads the
measurement records, :mod:`.speedups` draws the section "Measured speedups" (standard attention against FA2, cuDNN
and iosim's flash2 per GPU: measured, predicted, claimed), :mod:`.fp8` the section "FP8 forward" (fp8 against bf16:
simulated bytes, measured throughput, accuracy), :mod:`.cpu` the section "Attention on a CPU" (a
committed record, or data measured by ``iosim report --cpu``), :mod:`.run_io` writes and reads results, :mod:`.page` lays out the page.
"""

from .cpu import CpuMeasurement, committed_cpu_record, cpu_section, read_cpu_record
from .figures import PLOTLY_CONFIG, FigureOut, make_figure, make_figures
from .measured import Measured, load_measured
from .page import render_report
from .run_io import load_run, saved_runs, write_figures, write_results, write_run
from .speedups import GpuSpeedups, load_gpu, load_speedups, speedup_section, speedup_table
from .tables import make_tables

__all__ = [
    "PLOTLY_CONFIG", "CpuMeasurement", "FigureOut", "GpuSpeedups", "Measured", "committed_cpu_record", "cpu_section",
    "load_gpu", "load_measured", "load_run", "load_speedups", "make_figure", "make_figures", "make_tables",
    "read_cpu_record", "render_report", "saved_runs", "speedup_section", "speedup_table", "write_figures",
    "write_results", "write_run",
]
