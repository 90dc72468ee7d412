"""How well the lookup serves shapes nobody tuned: held-out shape sets per kernel family
(``shapes``) and the offline evaluation of fallback policies against measured per-shape times
(``policies``)."""

from ._shapes import (DIMENSIONS, FITTING, REPORT, RETIRED_KEYS, SET_NAMES, VARIED,
                      HeldOutShape, dimensions_apart, shape_set)
from ._policies import (POLICIES, SLOWER_THAN_DEFAULT, STUDY_DEVICE, Policy, as_measured,
                        evaluate, pick, policies_for, previous_default, regret_table,
                        runtime_resolution, shipped_rows, summarise)

__all__ = ["DIMENSIONS", "FITTING", "REPORT", "RETIRED_KEYS", "SET_NAMES", "VARIED",
           "HeldOutShape", "dimensions_apart", "shape_set", "POLICIES", "SLOWER_THAN_DEFAULT",
           "STUDY_DEVICE", "Policy", "as_measured", "evaluate", "pick", "policies_for",
           "previous_default", "regret_table", "runtime_resolution", "shipped_rows", "summarise"]
