"""Calibration: the profile values the default L2 model uses, derived from measurements on the GPU.

* ``l2.room`` (private, shared, dirty) and ``l2.dirty_at_start``: from the calibration probes' DRAM bytes
  (:mod:`iosim.calibrate.l2`, the probes of :mod:`iosim.measure`, the model of :mod:`iosim.l2.probes`);
* ``sm.block_share``: from flash2's block timeline (:mod:`iosim.calibrate.blocks`);
* the ``calibration`` section (rates code reaches: tensor cores, exp, fp32, shared memory, L2, DRAM, launch costs):
  measured by our kernels of ``kernels/rates.cu`` (:mod:`iosim.calibrate.rates`, ``iosim calibrate rates``).

``iosim calibrate l2 RECORD`` and ``iosim calibrate block-share TIMELINE...`` print them from recorded data
(data/validation/ holds the data the built-in H200 profile was calibrated on); ``--measure`` measures first.
"""

from .blocks import block_share, median_block_share
from .l2 import (
    PAST_L2,
    ROOM_GRID,
    CalibrationError,
    ProbeCase,
    RoomFit,
    dirty_at_start,
    fit_room,
    misfit,
    probe_cases,
)
from .probes import CALIBRATION_PROBES, TIMELINE_RUNS

__all__ = [
    "CALIBRATION_PROBES",
    "PAST_L2",
    "ROOM_GRID",
    "TIMELINE_RUNS",
    "CalibrationError",
    "ProbeCase",
    "RoomFit",
    "block_share",
    "dirty_at_start",
    "fit_room",
    "median_block_share",
    "misfit",
    "probe_cases",
]
