"""``tiledtune bench``'s engine: tiledattention's kernels against PyTorch's attention backends
over a model-like grid per kernel family.

``_grid`` builds the forward grid from flag values, ``_decode_grid`` the decode grid;
``_contenders`` and ``_decode_contenders`` hold what is timed, ``_contenders`` also the float32
reference; ``_measure`` checks then times every contender at one point of either grid; ``_run``
runs a whole grid with its environment (device, versions, clocks, the matrix-product and copy
ceilings); ``_report`` holds the result records, their CSV form and the forward markdown summary,
``_decode_report`` the decode summary and tables; ``_plots`` the PNG plots. The backward grid
(``--kernel backward``) has its own ``_backward_grid``, ``_backward_contenders`` (with the
float32 reference gradients), ``_backward_measure`` (two phases per contender: the backward
alone and forward + backward), ``_backward_report`` and ``_backward_plots``.
The command itself (flags, progress bar, tables) is ``tuner.commands.bench_cmd``.
"""

from ._backward_contenders import (BackwardContender, BackwardPrepared, SameSchedule,
                                   make_backward_contenders, reference_gradients,
                                   torch_backward)
from ._backward_grid import (BACKWARD_CONTENDERS, BACKWARD_INTERLEAVE, BACKWARD_PHASES,
                             QUICK_BACKWARD_INTERLEAVE, BackwardGrid, BackwardPoint,
                             build_backward_grid)
from ._backward_measure import measure_backward_point, phase_flops
from ._backward_plots import write_backward_plots
from ._backward_report import (BASELINES, TARGET, backward_points, backward_rich_tables,
                               backward_speedup_table, by_shape_table, is_backward,
                               render_backward_markdown, write_backward_summary)
from ._contenders import (Contender, Prepared, make_contenders, reference_attention,
                          torch_sdpa, torch_sdpa_kwargs)
from ._decode_contenders import make_decode_contenders
from ._decode_grid import (DECODE_CONTENDERS, DECODE_GROUPS, DECODE_INTERLEAVE, MASKS,
                           QUICK_DECODE_GROUPS, QUICK_DECODE_INTERLEAVE, DecodeGrid, DecodeGroup,
                           DecodePoint, build_decode_grid, parse_heads, parse_masks)
from ._decode_report import (FA_BACKENDS, baseline, decode_key, decode_points,
                             decode_rich_tables, is_decode, mask_name, point_label,
                             render_decode_markdown, speedup, speedup_table,
                             write_decode_summary)
from ._grid import (CONTENDERS, DEFAULT_GRID, QUICK_GRID, QUICK_TIMING, TIMING_DEFAULTS,
                    BenchConfigError, BenchGrid, BenchPoint, build_grid, parse_causal,
                    parse_contenders, parse_dtypes, parse_int_list, parse_positive_float,
                    parse_positive_int, point_gbps, point_tflops, problem_bytes)
from ._measure import TOLERANCES, BenchSettings, measure_point
from ._plots import MAX_PNG_BYTES, PlotsUnavailable, write_decode_plots, write_plots
from ._report import (COPY_BYTES, CSV_COLUMNS, MATMUL_SIZE, STATUSES, BenchResult, RunInfo,
                      by_point, contenders_of, geomean, header_lines, load_results, ratio_table,
                      render_markdown, write_csv, write_run_info, write_summary)
from ._run import copy_gbps, environment, gpu_clocks, matmul_tflops, run_grid

__all__ = [
    "BACKWARD_CONTENDERS", "BACKWARD_INTERLEAVE", "BACKWARD_PHASES", "BASELINES",
    "BackwardContender", "BackwardGrid", "BackwardPoint", "BackwardPrepared",
    "QUICK_BACKWARD_INTERLEAVE", "SameSchedule", "TARGET", "backward_points",
    "backward_rich_tables", "backward_speedup_table", "build_backward_grid", "by_shape_table", "is_backward",
    "make_backward_contenders", "measure_backward_point", "phase_flops", "reference_gradients",
    "render_backward_markdown", "torch_backward", "write_backward_plots",
    "write_backward_summary",
    "BenchConfigError", "BenchGrid", "BenchPoint", "BenchResult", "BenchSettings", "CONTENDERS",
    "COPY_BYTES", "CSV_COLUMNS", "Contender", "DECODE_CONTENDERS", "DECODE_GROUPS",
    "DECODE_INTERLEAVE", "DEFAULT_GRID", "DecodeGrid", "DecodeGroup", "DecodePoint",
    "FA_BACKENDS", "MASKS", "MATMUL_SIZE", "MAX_PNG_BYTES", "PlotsUnavailable", "Prepared",
    "QUICK_DECODE_GROUPS", "QUICK_DECODE_INTERLEAVE", "QUICK_GRID", "QUICK_TIMING", "RunInfo",
    "STATUSES", "TIMING_DEFAULTS", "TOLERANCES", "baseline", "build_decode_grid", "build_grid",
    "by_point", "contenders_of", "copy_gbps", "decode_key", "decode_points",
    "decode_rich_tables", "environment", "geomean", "gpu_clocks", "header_lines", "is_decode",
    "load_results", "make_contenders", "make_decode_contenders", "mask_name", "matmul_tflops",
    "measure_point", "parse_causal", "parse_contenders", "parse_dtypes", "parse_heads",
    "parse_int_list", "parse_masks", "parse_positive_float", "parse_positive_int",
    "point_gbps", "point_label", "point_tflops", "problem_bytes", "ratio_table",
    "reference_attention", "render_decode_markdown", "render_markdown", "run_grid",
    "speedup", "speedup_table", "torch_sdpa", "torch_sdpa_kwargs", "write_csv",
    "write_decode_plots", "write_decode_summary", "write_plots", "write_run_info",
    "write_summary",
]
