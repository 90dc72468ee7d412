"""What every family's kernels share (cuTile device code, inlined where it is called).

- :mod:`.numbers`: the constants of the arithmetic (``LOG2_E``, the finite "minus infinity"
  ``NEG_BIG``) and the one spelling of an unbounded window side, ``UNBOUNDED`` (-1), with
  ``reach``, what such a side reaches; ``head_slots``, a packed tile's head slots.
- :mod:`.bounds`: which key tiles a query tile visits (and which query tiles a key tile
  visits) under the causal mask of either alignment and under a sliding window, and which of
  them need no mask.
- :mod:`.ranges`: a ragged batch's per-sequence views of the arrays, and a paged cache's key
  tiles.
- :mod:`.softmax`: the online-softmax step and the epilogue (normalisation, log-sum-exp).

Like FlashAttention-4's ``block_info.py``, ``mask.py`` and ``softmax.py``: the kernels of
``forward``, ``decode`` and ``backward`` import these, and each family counts these modules in
its template identity (``Family.template_modules``). Of these only :mod:`.numbers` (plain
Python; ``core`` shares its ``head_slots``) is imported by ``import tiledattention``: cuda.tile
loads with the kernels.
"""

#: The modules of the kernel core, for the families' template identities.
MODULES = ("tiledattention.kernel_core.numbers", "tiledattention.kernel_core.bounds",
           "tiledattention.kernel_core.ranges", "tiledattention.kernel_core.softmax")
