"""Summarise the studies in an Optuna storage: measured candidates per key and per worker.

    python scripts/check_study.py sqlite:///path/to/tiledtune-studies.sqlite
"""

from __future__ import annotations

import collections
import sys

import optuna

from tuner.measure import FAILURES


def main(url: str) -> None:
    storage = optuna.storages.RDBStorage(url)
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        # measured: a ticket, finished, and a measurement's status (a trial failed as stale
        # or cancelled gave its ticket back)
        measured = [t for t in study.trials if t.user_attrs.get("ticket")
                    and t.state.is_finished()
                    and t.user_attrs.get("status") in ("ok", *FAILURES)]
        keys = [t.user_attrs["schedule_key"] for t in measured]
        workers = collections.Counter(
            t.user_attrs.get("worker") + (f" (GPU {t.user_attrs['device']})"
                                          if "device" in t.user_attrs else "")
            for t in measured)
        print(f"{summary.study_name}: {len(measured)} measured, {len(set(keys))} distinct, "
              f"{len(study.trials)} trials in all; by worker: {dict(workers)}")


if __name__ == "__main__":
    main(sys.argv[1])
