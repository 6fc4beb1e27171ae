"""Figures: functions that take result records and return plotly figures. Writing files is separate.

A record is one simulated case as a flat dict (``iosim.scenario.RECORD_FIELDS``: profile, schedule, problem
fields, tiles, bytes per boundary, FLOPs, predicted time ...), as ``iosim run`` saves it in ``results.json``,
so every figure can be redrawn from saved results without simulating again. :func:`figure_data` turns any
figure into rows for a CSV beside it. Bytes on axes and in hover text are decimal (1 MB = 10^6 B); hover text
also gives the exact integer.
"""

from .bars import bars
from .cpu import cpu_ratio, predicted_ratio
from .data import figure_data, write_figure_csv
from .parity import MEASUREMENT_COLUMNS, parity, read_measurement_file, read_measurements
from .records import TAGS, problem_line, tiles_line
from .roofline import roofline
from .speedups import BACKENDS as SPEEDUP_BACKENDS
from .speedups import SpeedupFigure, speedups
from .style import BOUNDARY_DASH, BOUNDARY_LABEL, SCHEDULE_COLORS, TEMPLATE, color
from .sweeps import lower_bound_elements, traffic_vs_block, traffic_vs_sram
from .timing import calibrated_on, time_hover, time_source, time_vs_n, with_time_source
from .traffic import by_tensor, footprint, traffic_vs_n

__all__ = [
    "BOUNDARY_DASH", "BOUNDARY_LABEL", "MEASUREMENT_COLUMNS", "SCHEDULE_COLORS", "SPEEDUP_BACKENDS", "TAGS", "TEMPLATE",
    "SpeedupFigure", "bars",
    "by_tensor", "calibrated_on", "color", "cpu_ratio", "figure_data", "footprint", "lower_bound_elements", "parity",
    "predicted_ratio", "problem_line",
    "read_measurement_file", "read_measurements", "roofline", "speedups", "tiles_line", "time_hover", "time_source", "time_vs_n",
    "traffic_vs_block", "traffic_vs_n", "traffic_vs_sram", "with_time_source", "write_figure_csv",
]
