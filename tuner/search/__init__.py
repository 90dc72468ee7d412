"""The search: the Optuna driver that tunes one key at a time, its trial budget shared by
concurrent workers, and its study storage."""

from ._budget import Budget
from ._driver import KeyResult, SearchConfig, Tuner, compile_job
from ._storage import open_storage, study_name

__all__ = ["Budget", "KeyResult", "SearchConfig", "Tuner", "compile_job", "open_storage",
           "study_name"]
