"""``tiledtune profile``: a family's kernels for one problem and schedule (or a PyTorch
baseline's kernels for the same call) under Nsight Compute (``ncu``), summarised as one table
(time, TFLOP/s and GB/s against the GPU's measured ceilings, pipe utilisation, DRAM and L2
throughput, occupancy and its limiter, registers, spills, the top stall reasons, the grid) and
a roofline picture.

Modules, in the order data flows: ``_metrics`` (the fixed metric set), ``_ncu`` (running ncu on
``_target`` and telling why it cannot run), ``_parse`` (ncu's raw CSV page into per-kernel
records), ``_report`` (the summary, its table, the side-by-side comparison, JSON) and
``_roofline`` (the PNG)."""

from ._metrics import METRICS, STALL_REASONS
from ._ncu import ProfileUnavailable, check_profilable, run_profile
from ._parse import KernelRecord, parse_raw_csv
from ._report import Ceilings, Profile, compare_table, paired_rows, profile_table
from ._roofline import roofline_png

__all__ = ["METRICS", "STALL_REASONS", "ProfileUnavailable", "check_profilable", "run_profile",
           "KernelRecord", "parse_raw_csv", "Ceilings", "Profile", "profile_table",
           "compare_table", "paired_rows", "roofline_png"]
