"""What the benchmark studies share: measure each named point in turn, keep every result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import torch


def run_points(points: Sequence[tuple], only: Sequence[str], measure: Callable[[tuple], list],
               failed: Callable[[tuple, str], dict],
               write: Callable[[list, Path], str], out: Path) -> str:
    """``measure(point)`` for every point (named by ``point[0]``; only those in ``only`` when
    it is not empty). A point that raises becomes ``failed(point, reason)``, so one failure
    loses none of the others; the records are written after every point (a run cut short
    keeps what it measured). Returns the last written text."""
    records: list[dict] = []
    text = ""
    for point in points:
        if only and point[0] not in only:
            continue
        try:
            records += measure(point)
        except Exception as exc:  # one point's failure must not lose the others
            records.append(failed(point, f"{type(exc).__name__}: {exc}"[:200]))
            print(f"{point[0]}: {exc}", file=sys.stderr)
        torch.cuda.empty_cache()
        text = write(records, out)
        print(f"{point[0]} done", file=sys.stderr, flush=True)
    return text
