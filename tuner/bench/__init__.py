"""``tiledtune bench``'s engine over any kernel family with a preset: ``_presets`` (each family's
grid as data, built into a ``Grid`` of its problems; ``--preset variants``: model-shaped window,
softcap and sink problems; ``--preset ragged``: model-shaped ragged buckets; ``--preset paged``:
the shipped paged decode buckets), ``_variants`` (the contenders of variant problems:
FlexAttention, SDPA with the materialised mask, ``varlen_attn``), ``_ragged`` (those of ragged
problems: ``varlen_attn`` on the packed batch, SDPA on the padded batch with the padding mask),
``_paged`` (those of paged problems: ``varlen_attn`` with a block table, cuDNN's SDPA on the
caches padded to the longest with the key-padding mask; valid K/V bytes), ``_peers`` (other
libraries' contenders at every problem: FlashAttention-4, ``unavailable`` where
``flash_attn.cute`` is not installed), ``_engine`` (the
contenders checked and timed through the family's GPU case), ``_results`` (rows, CSV, run
information), ``_report`` (one summary writer, a layout per family) and ``_plots``. The command is
``tuner.commands.bench_cmd``."""

from ._engine import (QUICK_TIMING, TIMING_DEFAULTS, BenchSettings, copy_gbps, environment,
                      gpu_clocks, matmul_tflops, measure_point, problem_bytes, result_fields,
                      run_grid)
from ._paged import (PAGED_CONTENDERS, applies_paged, paged_bytes, paged_flops,
                     varlen_paged_support)
from ._peers import FA4, PEER_CONTENDERS, PeerUnavailable, build_peer_contender, fa4_mask
from ._plots import (MAX_PNG_BYTES, PAGED_PLOTS, PLOTS, RAGGED_PLOTS, VARIANT_PLOTS, Plot,
                     PlotsUnavailable, new_figure, save_png, write_plots)
from ._presets import (GRID_PRESETS, PAGED_POINTS, PAGED_PRESETS, PRESETS, RAGGED_POINTS,
                       RAGGED_PRESETS, VARIANT_POINTS, VARIANT_PRESETS, BenchConfigError, Grid,
                       Preset, build_grid, parse_positive_float, parse_positive_int)
from ._ragged import RAGGED_CONTENDERS, applies_ragged, padded_mask, valid_tokens
from ._report import (LAYOUTS, Layout, contenders_of, geomean, kernel_of, paged_layout,
                      ragged_layout, render_markdown, rich_tables, speedup, variant_layout,
                      write_summary)
from ._results import (COPY_BYTES, CSV_COLUMNS, MATMUL_SIZE, STATUSES, BenchResult, RunInfo,
                       load_results, write_csv, write_run_info)
from ._variants import VARIANT_CONTENDERS, applies, flex_mask_mod, flex_score_mod, varlen_window

#: The forward family's contenders, in the order its tables show them.
CONTENDERS = PRESETS["forward"].contenders

__all__ = [
    "BenchConfigError", "BenchResult", "BenchSettings", "CONTENDERS", "COPY_BYTES", "CSV_COLUMNS",
    "FA4", "GRID_PRESETS", "Grid", "LAYOUTS", "Layout", "MATMUL_SIZE", "MAX_PNG_BYTES",
    "PAGED_CONTENDERS", "PAGED_PLOTS", "PAGED_POINTS", "PAGED_PRESETS", "PEER_CONTENDERS", "PLOTS",
    "PRESETS", "PeerUnavailable", "Plot", "PlotsUnavailable", "Preset", "QUICK_TIMING", "RAGGED_CONTENDERS", "RAGGED_PLOTS",
    "RAGGED_POINTS", "RAGGED_PRESETS", "RunInfo", "STATUSES", "TIMING_DEFAULTS",
    "VARIANT_CONTENDERS", "VARIANT_PLOTS", "VARIANT_POINTS", "VARIANT_PRESETS", "applies",
    "applies_paged", "applies_ragged", "build_grid", "build_peer_contender", "contenders_of", "copy_gbps", "environment",
    "fa4_mask", "flex_mask_mod", "flex_score_mod", "geomean", "gpu_clocks", "kernel_of", "load_results",
    "matmul_tflops", "measure_point", "new_figure", "paged_bytes", "paged_flops", "paged_layout",
    "padded_mask", "parse_positive_float", "parse_positive_int", "problem_bytes", "ragged_layout",
    "render_markdown", "result_fields", "rich_tables", "run_grid", "save_png", "speedup",
    "valid_tokens", "variant_layout", "varlen_paged_support", "varlen_window", "write_csv",
    "write_plots", "write_run_info", "write_summary",
]
