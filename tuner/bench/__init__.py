"""``tiledtune bench``'s engine: tiledattention's forward kernel against PyTorch's attention
backends over a model-like grid.

``_grid`` builds the grid from flag values; ``_contenders`` holds what is timed and the float32
reference; ``_measure`` checks then times every contender at one point; ``_run`` runs a whole
grid with its environment (device, versions, clocks, the matrix-product ceiling); ``_report``
holds the result records, their CSV form and the markdown summary; ``_plots`` the PNG plots.
The command itself (flags, progress bar, tables) is ``tuner.commands.bench_cmd``.
"""

from ._contenders import Contender, Prepared, make_contenders, reference_attention
from ._grid import (CONTENDERS, DEFAULT_GRID, QUICK_GRID, QUICK_TIMING, TIMING_DEFAULTS,
                    BenchConfigError, BenchGrid, BenchPoint, build_grid, parse_causal,
                    parse_contenders, parse_dtypes, parse_int_list, parse_positive_float,
                    parse_positive_int, point_tflops)
from ._measure import TOLERANCES, BenchSettings, measure_point
from ._plots import MAX_PNG_BYTES, PlotsUnavailable, write_plots
from ._report import (CSV_COLUMNS, MATMUL_SIZE, STATUSES, BenchResult, RunInfo, by_point,
                      contenders_of, geomean, load_results, ratio_table, render_markdown,
                      write_csv, write_run_info, write_summary)
from ._run import environment, gpu_clocks, matmul_tflops, run_grid

__all__ = [
    "BenchConfigError", "BenchGrid", "BenchPoint", "BenchResult", "BenchSettings", "CONTENDERS",
    "CSV_COLUMNS", "Contender", "DEFAULT_GRID", "MATMUL_SIZE", "MAX_PNG_BYTES", "PlotsUnavailable",
    "Prepared", "QUICK_GRID", "QUICK_TIMING", "RunInfo", "STATUSES", "TIMING_DEFAULTS",
    "TOLERANCES", "build_grid", "by_point", "contenders_of", "environment", "geomean",
    "gpu_clocks", "load_results", "make_contenders", "matmul_tflops", "measure_point",
    "parse_causal", "parse_contenders", "parse_dtypes", "parse_int_list", "parse_positive_float",
    "parse_positive_int", "point_tflops", "ratio_table", "reference_attention",
    "render_markdown", "run_grid", "write_csv", "write_plots", "write_run_info", "write_summary",
]
