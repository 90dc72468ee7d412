"""From a (Problem, Schedule) pair to a cuTile launch: hinted kernel objects, grid, arguments.

Kernel arguments go by name. ``kernel_constants`` maps each compile-time parameter of
``attention_fwd`` (``TILE_M`` ... ``STORE_LSE``) to its value, and ``ordered_args`` lays the named
runtime arguments and constants out in the order of the kernel's own signature, refusing a
missing, unknown or doubly supplied name. The launcher (``kernel_args``) and the compile-only
exporter (``_compile.compile_schedule``) both go through ``ordered_args``, so the order is
written nowhere by hand and a swapped pair of flags cannot compile quietly.

One kernel serves the forward with and without the log-sum-exp output: ``STORE_LSE`` is off
unless an ``lse`` array is given (``launch_with_lse``), and then ``Lse`` gets the placeholder
:data:`NO_LSE`, an int32 scalar the kernel never reads. A scalar and not an unused array: the
``Lse`` parameter comes after the other launch-time values, and there a trailing int leaves the
forward's machine code exactly as it was before the parameter existed, while a trailing unused
array does not (sm_90, cuda-tile 1.7.0 / tileiras 13.4).

The variants' values follow ``Lse``, last: ``window_left`` and ``window_right`` (read under
``WINDOW``), ``softcap`` (``SOFTCAP``), ``Sinks`` (``SINKS``, the float32 ``[H_q]`` sink
logits), ``Ranges`` (``RAGGED``, the int32 ``[4, sequences]`` query and key ranges of a
ragged batch; ``PACKED`` says whether its sequences lie end to end in one batch entry, a
property of the call's layout that the launcher passes, not of the problem) and ``Work``
(``WORK_TABLE``, a ragged call's int32 ``[2, items]`` table of query tiles, which the launcher
builds where the lengths are skewed: ``launch_ragged``), then ``Pages`` (``PAGED``, a paged
cache's int32 ``[sequences, max_pages]`` block table; K and V are page pools and the ranges'
key rows count each sequence's keys), and ``QDescale``, ``KDescale``, ``VDescale`` (``FP8``:
the float32 ``[B, H_kv]`` descale factors of e4m3 q, k and v). A value its constant leaves
unread gets :data:`UNUSED`, an empty tuple, which takes no bytes of the kernel's parameter space. Not
an int like ``Lse``'s: on sm_90 the TMA descriptors sit after the parameters at the next
64-byte boundary, and the plain forward's parameters end exactly on one (176 bytes from 0x210),
so one more int32 moves every descriptor by 64 bytes and changes the machine code; an empty
tuple leaves it byte-identical.

``normalise`` gives each schedule flag that cannot change the kernel's work for a problem its
canonical value (the ``Schedule`` default). The constants are a plain function of the problem
and the normalised schedule, so two schedules with one normalised key compile one kernel.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from ...core import _aot
from ...core._lazy import lazy_module
from ...core._signature import KernelParameters
from ...core._dtypes import FP8_DTYPES
from ...core._problem import Problem, head_dim_parts, head_slots, packable, page_load_rows
from ...core._work_table import make_work_table, use_work_table, work_items
from ...errors import KernelArgumentError
from ._schedule import Schedule

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["hinted_kernel", "kernel_for", "grid_for", "kernel_args", "kernel_constants",
           "constant_args", "ordered_args", "kernel_parameters", "normalise", "no_effect_flags",
           "default_scale", "transpose_values", "transposed_value_strides", "VALUE_ROW_ALIGN",
           "launch", "launch_with_lse", "launch_ragged", "ragged_grid", "packable",
           "packed_heads", "query_rows",
           "ragged_launch", "PreparedLaunch", "Slot", "slots",
           "RUNTIME_PARAMETERS", "NO_LSE", "UNUSED"]

#: The parameters of ``attention_fwd`` that are launch-time values, not compile-time constants.
RUNTIME_PARAMETERS = ("Q", "K", "V", "Out", "qk_scale", "heads_q", "group", "Lse",
                      "window_left", "window_right", "softcap", "Sinks", "Ranges", "Work",
                      "Pages", "QDescale", "KDescale", "VDescale")

#: What ``Lse`` receives when ``STORE_LSE`` is off: an int32 scalar that no code reads.
NO_LSE = 0
#: What ``window_left`` / ``window_right`` (without ``WINDOW``), ``softcap`` (without
#: ``SOFTCAP``) and ``Sinks`` (without ``SINKS``) receive: an empty tuple, a parameter of no
#: bytes, so the parameter space (and the machine code) of a forward without them is unchanged.
UNUSED = ()
#: the variants' runtime values, each with the constant under which the kernel reads it
_VARIANT_VALUES = (("window_left", "WINDOW"), ("window_right", "WINDOW"), ("softcap", "SOFTCAP"),
                   ("Sinks", "SINKS"), ("Ranges", "RAGGED"), ("Work", "WORK_TABLE"),
                   ("Pages", "PAGED"), ("QDescale", "FP8"), ("KDescale", "FP8"),
                   ("VDescale", "FP8"))


# -- the kernel and its signature ----------------------------------------------------------------
def _kernel() -> ct.kernel:
    """``attention_fwd``, imported on first use: the kernel module loads cuda.tile, which
    ``import tiledattention`` does not pay for."""
    from ._kernel import attention_fwd

    return attention_fwd


_SIGNATURE = KernelParameters(_kernel, RUNTIME_PARAMETERS)


def kernel_parameters() -> tuple[str, ...]:
    """The parameter names of ``attention_fwd``, in the order of its signature."""
    return _SIGNATURE.names


def ordered_args(runtime: Mapping[str, Any], constants: Mapping[str, Any]) -> tuple:
    """The positional argument tuple of ``attention_fwd``: each value placed by its name.

    ``runtime`` must name exactly the launch-time parameters (:data:`RUNTIME_PARAMETERS`) and
    ``constants`` exactly the ``ct.Constant`` ones; the order of either mapping does not matter.
    ``runtime`` may leave ``Lse`` out while ``constants["STORE_LSE"]`` is false: it then gets
    the placeholder, :data:`NO_LSE` for a launch, or its int32 ``ScalarConstraint`` for a
    compile-only build (whose runtime values are ``cuda.tile.compilation`` constraints). Likewise
    each variant value (``window_left``, ``window_right``, ``softcap``, ``Sinks``) its constant
    leaves unread: :data:`UNUSED` for a launch; for a compile-only build a constant (the
    ``cutile_python_v1`` convention of ``export_cubin`` takes no tuple), also of no bytes and
    compiling the same machine code (``tests/cpu/test_forward_variants.py`` checks it).
    Raises :class:`KernelArgumentError` naming what is missing, unknown, supplied twice or in
    the wrong mapping.
    """
    compile_only = _is_constraint(runtime.get("qk_scale"))
    if "Lse" not in runtime and constants.get("STORE_LSE") is False:
        runtime = {**runtime, "Lse": _no_lse(compile_only)}
    for name, flag in _VARIANT_VALUES:
        if name not in runtime and constants.get(flag) is False:
            runtime = {**runtime, name: _unused(compile_only)}
    return _SIGNATURE.ordered(runtime, constants)


def _is_constraint(value: Any) -> bool:
    """Whether ``value`` is a compile-only build's ``ScalarConstraint`` (not a launch value)."""
    from cuda.tile import compilation as ctc

    return isinstance(value, ctc.ScalarConstraint)


def _no_lse(compile_only: bool) -> Any:
    """The ``Lse`` placeholder: :data:`NO_LSE`, or for compile-only builds the
    ``ScalarConstraint`` that ``ct.launch`` makes of a Python int."""
    if compile_only:
        from cuda.tile import compilation as ctc

        return ctc.ScalarConstraint(ct.int32)
    return NO_LSE


def _unused(compile_only: bool) -> Any:
    """An unread variant value: :data:`UNUSED`, or for compile-only builds a zero-byte
    constant."""
    if compile_only:
        from cuda.tile import compilation as ctc

        return ctc.ConstantConstraint(0)
    return UNUSED


# -- normalisation ------------------------------------------------------------------------------
_DEFAULTS = Schedule()


def packed_heads(problem: Problem, schedule: Schedule) -> int:
    """The query heads one CTA's tile holds: the group size where ``schedule.pack_gqa`` runs
    (:func:`packable` with idle slots), else 1."""
    if schedule.pack_gqa and packable(problem, schedule.tile_m, idle_slots=True):
        return problem.group_size
    return 1


def query_rows(problem: Problem, schedule: Schedule) -> int:
    """The query positions of one tile: ``tile_m``, or ``tile_m`` over the head slots of a
    tile that holds a whole group's heads (:func:`packed_heads`, rounded up to a power of
    two)."""
    return schedule.tile_m // head_slots(packed_heads(problem, schedule))


def page_parts(problem: Problem, schedule: Schedule) -> int:
    """The parts a key tile walks as over ``problem``'s pages (a page load each); 1 where one
    load takes the whole tile, or without pages."""
    rows = page_load_rows(problem.page_size, schedule.tile_n)
    return schedule.tile_n // rows if rows else 1


def no_effect_flags(problem: Problem, schedule: Schedule) -> dict[str, str]:
    """The flags of ``schedule`` that are off their canonical value (the ``Schedule`` default)
    yet cannot change the work the kernel does for ``problem``, each with the reason."""
    rows = query_rows(problem, schedule)
    num_q_tiles = math.ceil(problem.seqlen_q / rows)
    num_k_tiles = math.ceil(problem.seqlen_k / schedule.tile_n)
    even_k = problem.seqlen_k % schedule.tile_n == 0
    even_all = (even_k and problem.seqlen_q % rows == 0
                and sum(head_dim_parts(problem.head_dim, schedule.split_d)) == problem.head_dim)
    # query tiles do unequal work under the causal mask or a window (whose ends clip the rows
    # near the first and last keys)
    unequal = problem.causal or problem.windowed
    any_mask = problem.causal or problem.windowed or not even_k
    paired = schedule.paired_tiles and unequal and num_q_tiles > 1 and not problem.ragged
    rules = (
        # paired_tiles: pairs (n-1-i, i) even out causal work; without the mask every tile costs
        # the same, and a single query tile is its own pair (one slot, tile 0 either way).
        # Bottom-right causal shifts every tile's key count by S_k - S_q, so the pairs still even
        # out (exactly while every row sees a key; where S_q > S_k leaves early tiles with none,
        # only the balance suffers, never the result). The same holds for longest_first. With a
        # window, tiles differ only near the ends; the flags stay open to the tuner there.
        ("paired_tiles", not unequal, "only causal or windowed problems have unequal query "
         "tiles"),
        ("paired_tiles", num_q_tiles == 1, "one query tile: the pair is the tile itself"),
        # longest_first: reverses the tile order, which balances unequal work only; the kernel
        # reads LONGEST_FIRST only when not PAIRED (a pair already starts with the longer tile).
        ("longest_first", not unequal, "only causal or windowed problems have a longest query "
         "tile"),
        ("longest_first", paired, "paired tiles start each pair with the longer tile already"),
        ("longest_first", num_q_tiles == 1, "reversing one query tile changes nothing"),
        # kv_sawtooth: odd query tiles walk their key tiles backwards; needs a tile 1 to exist
        # and more than one key tile to reverse.
        ("kv_sawtooth", num_q_tiles == 1, "one query tile: there is no odd tile to reverse"),
        ("kv_sawtooth", num_k_tiles == 1, "one key tile: walking it backwards changes nothing"),
        # unchecked_loads: dropping bounds checks is safe only if no tile crosses an edge; the
        # launcher keeps the checks otherwise.
        ("unchecked_loads", not even_all,
         "a tile crosses an edge (S_q % tile_m, S_k % tile_n or a padded head_dim): loads stay "
         "bounds-checked"),
        # split_masked: the kernel reads SPLIT_MASKED only under ANY_MASK = causal or ragged keys,
        # or with a window (whose edge tiles take the mask)
        ("split_masked", not any_mask,
         "no key tile needs a mask (not causal, no window, S_k % tile_n == 0)"),
        ("split_masked", page_parts(problem, schedule) > 1,
         "a key tile in parts of pages always walks its masked tiles apart"),
        # a ragged batch's sequences have tiles of their own counts: the kernel walks its grid
        # of the longest's tiles per sequence, one tile a CTA (longest_first mirrors that
        # grid), and checks every load's bounds
        ("persistent", problem.ragged, "a ragged batch runs one query tile per CTA"),
        ("paired_tiles", problem.ragged, "a ragged batch runs one query tile per CTA"),
        ("unchecked_loads", problem.ragged, "a ragged batch's sequences end inside tiles"),
        ("k_transposed", problem.ragged,
         "a ragged batch's keys load by row (a view of rows, or rows of pages), not transposed"),
        # split_d: two parts only where they cover fewer columns than one padded part
        ("split_d", head_dim_parts(problem.head_dim, True)[1] == 0,
         "the head dim is a power of two, or two parts would pad as much as one"),
        ("pv_wide", problem.dtype not in FP8_DTYPES, "only FP8 inputs have a narrower P·V"),
        ("fast_acc", problem.dtype not in FP8_DTYPES,
         "only e4m3 products have a narrower accumulator"),
        ("pack_gqa", not packable(problem, schedule.tile_m, idle_slots=True),
         "a tile packs a whole K/V group's query heads only where the group has more than one "
         "head and the power of two at or above its size is at most tile_m"),
    )
    reasons: dict[str, str] = {}
    for flag, applies, reason in rules:
        if (applies and flag not in reasons
                and getattr(schedule, flag) != getattr(_DEFAULTS, flag)):
            reasons[flag] = reason
    return reasons


@functools.lru_cache(maxsize=4096)
def normalise(problem: Problem, schedule: Schedule) -> Schedule:
    """``schedule`` with every flag that cannot change the kernel's work for ``problem`` set to
    its canonical value (the ``Schedule`` default). Key schedules after normalising them: two
    schedules get the same kernel constants for ``problem`` exactly when their normalised forms
    agree in the flags (the other fields reach the kernel as they are). Idempotent; returns
    ``schedule`` itself when nothing changes.

    Architecture-blind: tileiras may still emit the same code for different constants on some
    targets (unchecked_loads with TMA loads on sm_90 and sm_120, for one); pruning those is the
    business of the architecture's search space. Cached: every launch asks."""
    changes = {flag: getattr(_DEFAULTS, flag) for flag in no_effect_flags(problem, schedule)}
    return schedule.replace(**changes) if changes else schedule


# -- constants, grid, arguments -----------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _constants(problem: Problem, schedule: Schedule) -> dict[str, Any]:
    """``kernel_constants``, cached (the launch path asks on every call): never mutate it and
    never hand it out (``kernel_constants`` returns a copy)."""
    s = normalise(problem, schedule)
    tile_d, tile_d2 = head_dim_parts(problem.head_dim, s.split_d)
    return {
        "TILE_M": s.tile_m,
        "TILE_N": s.tile_n,
        "PACK": packed_heads(problem, s),
        "TILE_D": tile_d,
        "TILE_D2": tile_d2,
        "CAUSAL": problem.causal,
        "BOTTOM_RIGHT": problem.bottom_right,
        "EVEN_K": problem.seqlen_k % s.tile_n == 0 and not problem.ragged,
        "EXP2": s.exp2,
        "APPROX_DIV": s.approx_div,
        "K_TRANSPOSED": s.k_transposed,
        "K_LATENCY": s.k_latency or 0,  # 0: the kernel lets the compiler infer it
        "V_LATENCY": s.v_latency or 0,
        "ALLOW_TMA": s.allow_tma,
        "KV_SAWTOOTH": s.kv_sawtooth,
        "LONGEST_FIRST": s.longest_first,
        "CHECK_BOUNDS": not s.unchecked_loads,
        # a tile in parts walks masked tiles apart: in one loop every step kept the mask's
        # selects (sm_90, pages of 64 under 128-key tiles: 779 instructions a step against 511
        # unmasked and 780 masked walked apart; a tile of one load gets both from tileiras)
        "SPLIT_MASKED": s.split_masked or page_parts(problem, s) > 1,
        "PERSISTENT": s.persistent,
        "PAIRED": s.paired_tiles,
        "STORE_LSE": False,  # kernel_args turns it on when given an lse array
        "WINDOW": problem.windowed,
        "SOFTCAP": problem.softcap > 0,
        "SINKS": problem.sinks,
        "RAGGED": problem.ragged,
        "PACKED": False,  # kernel_args turns it on for a packed layout
        "WORK_TABLE": False,  # kernel_args turns it on with a ragged call's work table
        "PAGED": problem.page_size > 0,
        # keys per load from a page: a load never straddles two pages
        "PAGE_ROWS": page_load_rows(problem.page_size, s.tile_n),
        # a page's keys as a constant: the producer finds a key's page and row in it by
        # shifts, not by two divisions on its way to each load
        "PAGE_SIZE": problem.page_size,
        # FP8: the descale factors; V comes transposed ([B, H_kv, D, S_k]: e4m3 P·V reads it
        # from memory with keys innermost; as stored, the compiler transposed every tile
        # through shared memory, 0.69-0.80x on an H200 at D 128)
        "FP8": problem.dtype in FP8_DTYPES,
        "V_TRANSPOSED": problem.dtype in FP8_DTYPES,
        "PV_WIDE": s.pv_wide,
        "FAST_ACC": s.fast_acc,
    }


def kernel_constants(problem: Problem, schedule: Schedule, *, store_lse: bool = False,
                     packed: bool = False, work_table: bool = False) -> dict[str, Any]:
    """The compile-time constants of ``attention_fwd`` by parameter name: the problem's shape
    facts and the flags of ``normalise(problem, schedule)``, passed through unchanged,
    ``STORE_LSE`` (``store_lse``: also store each row's log-sum-exp), ``PACKED`` (``packed``:
    a ragged problem's sequences lie end to end) and ``WORK_TABLE`` (``work_table``: a ragged
    call walks a table of work items, :func:`launch_ragged`)."""
    return {**_constants(problem, schedule), "STORE_LSE": bool(store_lse),
            "PACKED": bool(packed) and problem.ragged,
            "WORK_TABLE": bool(work_table) and problem.ragged}


def constant_args(problem: Problem, schedule: Schedule) -> tuple:
    """The constants of :func:`kernel_constants` in the kernel's parameter order (the tail of
    :func:`kernel_args` after the runtime values)."""
    return _SIGNATURE.constant_values(_constants(problem, schedule))


def kernel_args(q: Any, k: Any, v: Any, out: Any, problem: Problem, schedule: Schedule,
                scale: float, lse: Any = None, sinks: Any = None, ranges: Any = None,
                packed: bool = False, work: Any = None, pages: Any = None,
                descales: tuple | None = None) -> tuple:
    """The positional arguments of ``attention_fwd`` for ``ct.launch``. With ``lse`` (a float32
    ``[B, H_q, S_q]`` array) the kernel also stores each query row's log-sum-exp there
    (``STORE_LSE``); without it ``Lse`` gets the placeholder :data:`NO_LSE`. ``sinks``: the
    float32 ``[H_q]`` sink logits, given exactly when ``problem.sinks``; ``ranges``: the int32
    ``[4, sequences]`` ranges, given exactly when ``problem.ragged`` (``packed``: the arrays
    are ``[1, H, tokens, D]`` views of packed sequences; ``work``: a ragged call's int32
    ``[2, items]`` work table, ``tiledattention.core._work_table``, for a 1-D grid of
    ``items x H_q`` CTAs; ``pages``: a paged problem's int32 block table, ``k`` and ``v`` then
    page pools; ``descales``: an FP8 problem's float32 ``[B, H_kv]`` (q, k, v) descale
    factors). The window and the softcap come from ``problem``; values the kernel does not
    read get :data:`UNUSED`."""
    if work is not None and ranges is None:
        raise KernelArgumentError(f"a work table comes only with a ragged call's ranges; got one "
                                  f"without them for {problem.describe()}")
    for name, given, wanted in (("sinks", sinks, problem.sinks),
                                ("ranges", ranges, problem.ragged),
                                ("pages", pages, problem.page_size > 0),
                                ("descales", descales, problem.dtype in FP8_DTYPES)):
        if (given is not None) != wanted:
            raise KernelArgumentError(
                f"{name} must be given exactly when the problem has {name}; got "
                f"{'an array' if given is not None else 'None'} for {problem.describe()}")
    windowed = problem.windowed
    runtime = {"Q": q, "K": k, "V": v, "Out": out, "qk_scale": float(scale),
               "heads_q": problem.heads_q, "group": problem.group_size,
               "Lse": NO_LSE if lse is None else lse,
               "window_left": problem.window_left if windowed else UNUSED,
               "window_right": problem.window_right if windowed else UNUSED,
               "softcap": problem.softcap if problem.softcap > 0 else UNUSED,
               "Sinks": UNUSED if sinks is None else sinks,
               "Ranges": UNUSED if ranges is None else ranges,
               "Work": UNUSED if work is None else work,
               "Pages": UNUSED if pages is None else pages}
    for name, factors in zip(("QDescale", "KDescale", "VDescale"),
                             descales or (UNUSED, UNUSED, UNUSED)):
        runtime[name] = factors
    constants = _constants(problem, schedule)
    if lse is not None or packed or work is not None:
        constants = kernel_constants(problem, schedule, store_lse=lse is not None,
                                     packed=packed, work_table=work is not None)
    return ordered_args(runtime, constants)


@functools.lru_cache(maxsize=None)
def hinted_kernel(occupancy: int, num_ctas: int, opt_level: int,
                  num_worker_warps: int | None) -> ct.kernel:
    """The template with these kernel options. Cached: each object owns a JIT cache, so making
    a new one per launch would recompile every time."""
    return _kernel().replace_hints(occupancy=occupancy, num_ctas=num_ctas, opt_level=opt_level,
                                   num_worker_warps=num_worker_warps)


def kernel_for(schedule: Schedule) -> ct.kernel:
    """``attention_fwd`` with ``schedule``'s kernel options, with or without ``STORE_LSE`` (a
    constant: each value compiles its own specialisation under the one kernel object)."""
    return hinted_kernel(schedule.occupancy, schedule.num_ctas, schedule.opt_level,
                         schedule.num_worker_warps)


def grid_for(problem: Problem, schedule: Schedule, sm_count: int) -> tuple[int, int, int]:
    """The launch grid; ``sm_count`` is the device's number of SMs (persistent schedules). A
    ragged problem's grid is its call's (:func:`ragged_grid`)."""
    constants = _constants(problem, schedule)
    # work items per (batch x tile's heads): one head's query tiles, or a packed group's
    slots = math.ceil(problem.seqlen_q / query_rows(problem, schedule))
    heads = problem.heads_q // constants["PACK"]
    if constants["PAIRED"]:
        slots = math.ceil(slots / 2)
    if constants["PERSISTENT"]:
        work = slots * problem.batch * heads
        return (min(work, sm_count * schedule.occupancy), 1, 1)
    return (slots, problem.batch * heads, 1)


def ragged_grid(rows: int, heads: int, sequences: int, longest_q: int) -> tuple[int, int, int]:
    """The grid of a ragged call of ``rows``-position query tiles of ``heads`` tiles' heads
    (query heads, or packed groups): the longest sequence's query tiles for every (sequence x
    head); a CTA past its own sequence's queries does nothing."""
    return (max(1, math.ceil(longest_q / rows)), sequences * heads, 1)


#: FP8's transposed values keep each head-dim row's start 16-byte aligned (TMA's rule): the key
#: axis is stored padded to a multiple of this many elements.
VALUE_ROW_ALIGN = 16


def transposed_value_strides(batch: int, heads_kv: int, head_dim: int,
                             seqlen_k: int) -> tuple[int, int, int, int]:
    """The strides (in elements) of an FP8 call's ``[B, H_kv, D, S_k]`` transposed values: the
    key axis stored padded to :data:`VALUE_ROW_ALIGN`."""
    row = -(-seqlen_k // VALUE_ROW_ALIGN) * VALUE_ROW_ALIGN
    return (heads_kv * head_dim * row, head_dim * row, row, 1)


def transpose_values(v: Any) -> Any:
    """``v`` (``[B, H_kv, S_k, D]``) as the FP8 kernel reads it: a ``[B, H_kv, D, S_k]`` copy
    with :func:`transposed_value_strides` (one copy kernel on the current stream)."""
    import torch

    b, h, sk, d = v.shape
    strides = transposed_value_strides(b, h, d, sk)
    vt = torch.empty(b * strides[0], dtype=v.dtype, device=v.device).as_strided(
        (b, h, d, sk), strides)
    # torch copies no float8 tensors between layouts: copy their bytes
    vt.view(torch.uint8).copy_(v.view(torch.uint8).transpose(2, 3))
    return vt


def default_scale(problem: Problem) -> float:
    return 1.0 / math.sqrt(problem.head_dim)


def launch(stream: Any, q: Any, k: Any, v: Any, out: Any, problem: Problem,
           schedule: Schedule, scale: float, sm_count: int, sinks: Any = None) -> None:
    """Enqueue one forward pass on ``stream`` (validated inputs, preallocated ``out``;
    ``sinks``: the float32 ``[H_q]`` sink logits when ``problem.sinks``)."""
    _aot.launch(stream, grid_for(problem, schedule, sm_count), kernel_for(schedule),
                kernel_args(q, k, v, out, problem, schedule, scale, sinks=sinks))


def launch_with_lse(stream: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, problem: Problem,
                    schedule: Schedule, scale: float, sm_count: int, sinks: Any = None) -> None:
    """:func:`launch`, also storing each query row's log-sum-exp into ``lse`` (a float32
    ``[B, H_q, S_q]`` array) for the backward pass (with sinks, their term included)."""
    _aot.launch(stream, grid_for(problem, schedule, sm_count), kernel_for(schedule),
                kernel_args(q, k, v, out, problem, schedule, scale, lse=lse, sinks=sinks))


class Slot:
    """Stands for an array of a prepared launch's arguments until the launch brings it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def slots(*names: str) -> dict[str, Slot]:
    """A :class:`Slot` for each parameter name."""
    return {name: Slot(name) for name in names}


class PreparedLaunch:
    """A forward launch prepared for every call of one problem, schedule, scale and set of
    counts (:func:`ragged_launch`, and the FP8 plan's, ``_plan.fp8_forward_plan``): the kernel,
    its grid, and its argument tuple with the :class:`Slot` s each call's arrays fill; with a
    ragged call's work table, the table's size (``items``; 0: none)."""

    __slots__ = ("kernel", "grid", "args", "slots", "items", "tile_m")

    def __init__(self, kernel: Any, grid: tuple, args: tuple, items: int = 0,
                 tile_m: int = 0) -> None:
        self.kernel, self.grid, self.items, self.tile_m = kernel, grid, items, tile_m
        self.args = args
        self.slots = {a.name: i for i, a in enumerate(args) if isinstance(a, Slot)}

    def run(self, stream: Any, arrays: Mapping[str, Any]) -> None:
        """Enqueue the launch on ``stream`` with ``arrays`` by parameter name (``Q, K, V,
        Out`` and those of the slots it has: ``Lse``, ``Sinks``, ``Ranges``, ``Pages``, the
        descale factors); with a work table, the table first (built from ``Ranges``)."""
        args = list(self.args)
        for name, at in self.slots.items():
            if name != "Work":
                args[at] = arrays[name]
        if self.items:
            args[self.slots["Work"]] = make_work_table(stream, arrays["Ranges"], self.tile_m,
                                                       self.items)
        _aot.launch(stream, self.grid, self.kernel, tuple(args))


@functools.lru_cache(maxsize=1024)
def ragged_launch(problem: Problem, schedule: Schedule, scale: float, sequences: int,
                  longest_q: int, rows: int, *, packed: bool, lse: bool, sinks: bool,
                  pages: bool, table: bool = False) -> PreparedLaunch:
    """The :class:`PreparedLaunch` of a ragged batch (``problem.ragged``) of ``sequences``
    sequences whose longest has at most ``longest_q`` queries, in ``rows`` query rows in all
    (``packed``: end to end in one batch entry), storing the log-sum-exp with ``lse``, with
    sink logits (``sinks``) and a paged cache's block table (``pages``) where the problem has
    them. Cached: a training loop launches the same few every step.

    Where the grid of the longest sequence's tiles would launch many idle CTAs (skewed lengths,
    ``_work_table``) or not fit (sequences x heads past a grid's second dimension), and always
    with ``table``, the launch walks a work table instead: one CTA per (query tile a sequence
    has x head), the heaviest sequences first."""
    schedule = normalise(problem, schedule)
    tile = query_rows(problem, schedule)  # query positions per tile
    heads = problem.heads_q // packed_heads(problem, schedule)  # tiles per (sequence x tile)
    items = work_items(sequences=sequences, longest=longest_q, rows=rows, tile=tile)
    table = table or use_work_table(sequences=sequences, longest=longest_q, items=items,
                                    heads=heads, tile=tile)
    slot = slots("Q", "K", "V", "Out", "Lse", "Sinks", "Ranges", "Work", "Pages")
    args = kernel_args(slot["Q"], slot["K"], slot["V"], slot["Out"], problem, schedule, scale,
                       lse=slot["Lse"] if lse else None, sinks=slot["Sinks"] if sinks else None,
                       ranges=slot["Ranges"], packed=packed,
                       work=slot["Work"] if table else None,
                       pages=slot["Pages"] if pages else None)
    grid = ((items * heads, 1, 1) if table
            else ragged_grid(tile, heads, sequences, longest_q))
    return PreparedLaunch(kernel_for(schedule), grid, args, items if table else 0, tile)


def launch_ragged(stream: Any, q: Any, k: Any, v: Any, out: Any, ranges: Any, problem: Problem,
                  schedule: Schedule, scale: float, longest_q: int, *, packed: bool,
                  lse: Any = None, sinks: Any = None, pages: Any = None,
                  table: bool = False) -> None:
    """Enqueue the forward of a ragged batch (``problem.ragged``): ``q, k, v, out`` (and
    ``lse``) as ``[B, H, S, D]`` arrays (``packed``: ``[1, H, tokens, D]`` views), ``ranges``
    the int32 ``[4, sequences]`` query and key ranges, ``longest_q`` at least the longest
    sequence's query count (``pages``: a paged problem's block table, ``k`` and ``v`` then page
    pools; ``table``: a work table whatever the grid would idle): :func:`ragged_launch`'s.
    Rows outside every sequence are not written."""
    sequences = ranges.shape[1]
    rows = q.shape[2] * (1 if packed else sequences)
    ragged_launch(problem, schedule, float(scale), sequences, longest_q, rows, packed=packed,
                  lse=lse is not None, sinks=sinks is not None, pages=pages is not None,
                  table=table).run(
        stream, {"Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "Sinks": sinks,
                 "Ranges": ranges, "Pages": pages})
