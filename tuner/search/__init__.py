"""The search: the Optuna driver that tunes one key at a time, its trial budget shared by
concurrent workers, its study storage, the seeds it starts from, and its offline replay on a
measured landscape (``replay_tuner``, for studies of the search strategy)."""

from ._budget import Budget
from ._candidates import compile_sample, seeds
from ._driver import KeyResult, SearchConfig, Tuner, compile_job
from ._identity import StudyIdentity
from ._replay import Landscape, replay_random, replay_tuner
from ._storage import open_storage, study_name
from ._trials import settled

__all__ = ["Budget", "KeyResult", "Landscape", "SearchConfig", "StudyIdentity", "Tuner",
           "compile_job", "compile_sample", "open_storage", "replay_random", "replay_tuner",
           "seeds", "settled", "study_name"]
