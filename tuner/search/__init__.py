"""The search: the Optuna driver that tunes one key at a time, its trial budget shared by
concurrent workers, and its study storage."""

from ._budget import Budget
from ._candidates import compile_sample
from ._driver import KeyResult, SearchConfig, Tuner, compile_job
from ._storage import open_storage, study_name
from ._trials import settled

__all__ = ["Budget", "KeyResult", "SearchConfig", "Tuner", "compile_job", "compile_sample",
           "open_storage", "settled", "study_name"]
