"""How well the lookup serves shapes nobody tuned: two held-out shape sets (``shapes``) and the
offline evaluation of fallback policies against measured per-shape times (``policies``)."""

from ._shapes import FITTING, REPORT, HeldOutShape, shape_set
from ._policies import POLICIES, Policy, evaluate, regret_table

__all__ = ["FITTING", "REPORT", "HeldOutShape", "shape_set", "POLICIES", "Policy", "evaluate",
           "regret_table"]
