"""The records of ``tiledtune bench``: one :class:`BenchResult` per contender and grid point, the
run's :class:`RunInfo`, and their files (``bench.csv``, ``run.json``). Nothing here touches a GPU,
so reports can be re-rendered from a CSV (:func:`load_results`)."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

from db import write_text_atomic

from ..errors import TunerValueError, UnreadableFile

__all__ = ["BenchResult", "RunInfo", "COPY_BYTES", "MATMUL_SIZE", "STATUSES", "CSV_COLUMNS",
           "load_results", "write_csv", "write_run_info"]

#: ``ok``: measured and correct; ``wrong``: ran but failed the accuracy check (not timed);
#: ``unavailable``: raised (unsupported shape, no kernel, out of memory...); ``skipped``: not
#: run on purpose (e.g. it would time what another contender times).
STATUSES = ("ok", "wrong", "unavailable", "skipped")
#: Side of the square bf16 matrix product whose rate compute-bound summaries compare with.
MATMUL_SIZE = 8192
#: Bytes of the device-to-device copy whose rate memory-bound summaries compare with (1 GiB).
COPY_BYTES = 1 << 30


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """One contender at one grid point. Timing fields are ``None`` unless ``status == "ok"``.

    ``heads`` is H_q and ``seqlen`` S_k; ``heads_kv`` and ``seqlen_q`` may be ``None`` (rows of
    older forward and backward runs: H_kv = H_q, S_q = S_k)."""

    contender: str
    status: str
    reason: str = ""
    kernel: str = "forward"  # the family whose grid the row belongs to (``--kernel``)
    #: what was timed when a family times more than one thing per point (older backward runs:
    #: "backward" or "forward+backward"; the backward family's rows: "backward"); else ""
    phase: str = ""
    batch: int
    heads: int
    heads_kv: int | None = None
    seqlen_q: int | None = None
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool
    bottom_right: bool = False  # causal aligned bottom-right (torch's causal_lower_right)
    #: the variant fields of the problem (issue 32): a sliding window (-1: unbounded side),
    #: the logit softcap (0: none) and whether sink logits join the softmax
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sinks: bool = False
    #: a ragged bucket (``Problem.ragged``, issue 33): ``batch`` packed sequences of 1, 3/4,
    #: 1/2 and 1/4 of the longest length ``seqlen_q`` (the family's ragged case), TFLOP/s and
    #: GB/s counted on their valid tokens only
    ragged: bool = False
    #: a paged bucket (``Problem.page_size``, issue 34; ``ragged`` too): a decode step of
    #: ``batch`` caches of 1, 3/4, 1/2 and 1/4 of the longest ``seqlen`` keys in pages of that
    #: many tokens (the family's paged case), TFLOP/s and GB/s counted on their valid keys
    #: (GB/s: the K/V bytes only); 0: no pages
    page_size: int = 0
    #: an FP8 K/V cache under 16-bit queries (``Problem.kv_dtype``, issue 52): its dtype; "":
    #: K and V in ``dtype``
    kv_dtype: str = ""
    median_ms: float | None = None
    spread_ms: float | None = None
    samples: int | None = None
    tflops: float | None = None
    gbps: float | None = None  # Q+K+V read and the output written, once each, per second / 1e9
    rel_err: float | None = None
    schedule: str = ""  # Schedule.describe() of tiledattention rows
    lookup_source: str = ""  # Resolution.source ("exact-device", ..., "default"), or "forced"
    lookup_detail: str = ""
    device: str = ""
    arch: str = ""
    driver: str = ""
    torch_version: str = ""
    cuda_tile_version: str = ""
    sm_clock: str = ""  # as nvidia-smi reports it, e.g. "1980 MHz"; "" when unknown
    mem_clock: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise TunerValueError(f"BenchResult.status must be one of {STATUSES}; "
                             f"got {self.status!r}")
        if self.status == "ok" and (self.tflops is None or self.median_ms is None):
            raise TunerValueError("an ok BenchResult needs median_ms and tflops")

    @property
    def point(self) -> tuple:
        """Every field of the grid point (rows of one point share it)."""
        return (self.dtype, self.batch, self.heads, self.heads_kv, self.seqlen_q, self.seqlen,
                self.head_dim, self.causal, self.bottom_right, self.window_left,
                self.window_right, self.softcap, self.sinks, self.ragged, self.page_size,
                self.kv_dtype)

    @property
    def variant(self) -> bool:
        """Whether the point has a window, a softcap or sinks."""
        return self.window_left >= 0 or self.window_right >= 0 or self.softcap > 0 or self.sinks

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """(dtype, head_dim, causal, seqlen): the point of a grid at fixed B·S and H·D."""
        return (self.dtype, self.head_dim, self.causal, self.seqlen)

    @property
    def mask(self) -> str:
        """``full``, ``causal`` or ``causal-br``; a variant's also names its window
        (``causal-win(4095,-1)``, ``win(4095,-1)-br``), softcap (`` cap50``) and sinks; an FP8
        cache's point ends in `` kv-e4m3``."""
        cache = f" kv-{self.kv_dtype}" if self.kv_dtype else ""
        if not self.variant:
            return (("causal-br" if self.bottom_right else "causal") if self.causal
                    else "full") + cache
        parts = (["causal"] if self.causal else []) + (
            [f"win({self.window_left},{self.window_right})"]
            if self.window_left >= 0 or self.window_right >= 0 else [])
        parts += ["br"] if self.bottom_right else []
        return ("-".join(parts) or "full") + (f" cap{self.softcap:g}" if self.softcap > 0
                                              else "") + (" sinks" if self.sinks else "") + cache

    @property
    def note(self) -> str:
        """``status: reason`` for rows that were not measured."""
        return f"{self.status}: {self.reason}" if self.reason else self.status


CSV_COLUMNS = tuple(f.name for f in fields(BenchResult))
_INT_FIELDS = ("batch", "heads", "heads_kv", "seqlen_q", "seqlen", "head_dim", "samples",
               "window_left", "window_right", "page_size")
_FLOAT_FIELDS = ("median_ms", "spread_ms", "tflops", "gbps", "rel_err", "softcap")
_BOOL_FIELDS = ("causal", "bottom_right", "sinks", "ragged")
#: Columns an empty cell leaves at their default (CSVs written before they were filled).
_DEFAULTED = ("window_left", "window_right", "softcap", "page_size")


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What the summary header says about the run besides what the rows carry."""

    command: str
    date: str
    #: bf16 matrix-product rates measured in the run (before and after the grid), TFLOP/s
    matmul_tflops: tuple[float, ...] = ()
    #: device-to-device copy rates measured in the run (before and after the grid), GB/s of
    #: bytes read plus bytes written
    copy_gbps: tuple[float, ...] = ()
    #: the git commit of the checkout the code that ran came from (``source_commit``): ``None``
    #: in a run.json written before runs recorded one, ``""`` when the code did not run from a
    #: git checkout (an installed package) or git could not say
    commit: str | None = None
    #: whether tracked files differed from ``commit`` when the run started; ``None`` unknown
    dirty: bool | None = None

    def __post_init__(self) -> None:
        if not (self.commit is None or isinstance(self.commit, str)) or \
                not (self.dirty is None or isinstance(self.dirty, bool)):
            raise TunerValueError(f"RunInfo: 'commit' must be a string and 'dirty' true or "
                                  f"false (or None); got {self.commit!r} and {self.dirty!r}")

    def describe_commit(self) -> str | None:
        """The summary header's words for the commit; ``None`` when the run recorded none."""
        if self.commit is None:
            return None
        if not self.commit:
            return "none (not run from a git checkout)"
        state = {True: " with uncommitted changes to tracked files", False: "",
                 None: " (uncommitted changes unknown)"}[self.dirty]
        return f"{self.commit[:12]}{state}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "RunInfo":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise UnreadableFile("run info must be a JSON object")
        try:  # __post_init__ checks 'commit' and 'dirty'
            return cls(command=str(data.get("command", "")), date=str(data.get("date", "")),
                       matmul_tflops=tuple(float(x) for x in data.get("matmul_tflops", ())),
                       copy_gbps=tuple(float(x) for x in data.get("copy_gbps", ())),
                       commit=data.get("commit"), dirty=data.get("dirty"))
        except TunerValueError as exc:
            raise UnreadableFile(f"run info: {exc}") from None


def write_csv(results: Iterable[BenchResult], path: str | os.PathLike) -> Path:
    """Write one row per result (atomically); floats keep full precision (``repr``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for result in results:
        row = asdict(result)
        for name, value in row.items():
            if value is None:
                row[name] = ""
            elif isinstance(value, bool):
                row[name] = "yes" if value else "no"
            elif isinstance(value, float):
                row[name] = repr(value)
        writer.writerow(row)
    path = Path(path)
    write_text_atomic(path, buffer.getvalue())
    return path


def load_results(path: str | os.PathLike) -> list[BenchResult]:
    """Read a CSV written by :func:`write_csv` back into results (to re-render reports)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UnreadableFile(f"cannot read bench results {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UnreadableFile(f"{path} is not a tiledtune bench CSV: it is not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("contender", "status", "batch", "heads", "seqlen", "head_dim",
                           "dtype", "causal") if c not in (reader.fieldnames or ())]
    if missing:
        raise UnreadableFile(f"{path} is not a tiledtune bench CSV: it lacks columns {missing}")
    results = []
    for line, row in enumerate(reader, start=2):
        try:
            results.append(BenchResult(**_values(row)))
        except (TypeError, ValueError) as exc:
            raise UnreadableFile(f"{path}, line {line}: {exc}") from None
    return results


def _values(row: dict) -> dict:
    values: dict = {}
    for name, raw in row.items():
        raw = raw or ""
        if name not in CSV_COLUMNS or (name in ("kernel", *_DEFAULTED) and not raw):
            continue  # a column of a newer version, or left empty: the default
        if name in _INT_FIELDS:
            values[name] = int(raw) if raw else None
        elif name in _FLOAT_FIELDS:
            values[name] = float(raw) if raw else None
        elif name in _BOOL_FIELDS:
            if raw == "" and name != "causal":
                continue
            if raw not in ("yes", "no"):
                raise TunerValueError(f"{name} must be yes or no; got {raw!r}")
            values[name] = raw == "yes"
        else:
            values[name] = raw
    return values


def write_run_info(info: RunInfo, path: str | os.PathLike) -> Path:
    path = Path(path)
    write_text_atomic(path, info.to_json() + "\n")
    return path
