"""Moving tuned rows between databases and programs: the CSV form of rows, the reading of
exchange files, and the ``ct.ByTarget`` module generator."""

from ._bytarget import build_schedules, choose_kernel_options, render_module
from ._restamp import RestampResult, describe_row, restamp
from ._rowfiles import CSV_COLUMNS, MAX_ROW_CHARS, MAX_TEXT, UnreadableFile, csv_chunks, \
    read_rows, rows_to_csv

__all__ = ["CSV_COLUMNS", "MAX_ROW_CHARS", "MAX_TEXT", "RestampResult", "UnreadableFile",
           "build_schedules", "choose_kernel_options", "csv_chunks", "describe_row", "read_rows",
           "render_module", "restamp", "rows_to_csv"]
