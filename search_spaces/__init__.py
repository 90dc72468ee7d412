"""Search spaces: per kernel family and GPU architecture, the candidate values of each schedule
dimension, static feasibility checks that run before anything compiles, the dimensions that
cannot matter for a problem, and (optionally) an analytic time model for the simulated backend.

``space_for(family, arch, name)`` returns a :class:`SearchSpace`; a family registers its spaces
with :func:`register_space` (the forward family's are in ``search_spaces.forward``, the decode
and backward families' in ``search_spaces.decode`` and ``search_spaces.backward``).
"""

from ._space import (
    ArchLimits,
    FamilySpace,
    SearchSpace,
    arch_limits,
    family_space,
    register_space,
    space_for,
    unregister_space,
)
from .backward import BACKWARD_SPACE
from .decode import DECODE_SPACE
from .forward import FORWARD_SPACE

__all__ = ["ArchLimits", "BACKWARD_SPACE", "DECODE_SPACE", "FORWARD_SPACE", "FamilySpace",
           "SearchSpace", "arch_limits", "family_space", "register_space", "space_for",
           "unregister_space"]
