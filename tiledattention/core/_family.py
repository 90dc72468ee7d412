"""Kernel families: what the tuner, the database, the lookup and the exporters need of a kernel.

A :class:`Family` bundles one kernel template's problem type (the key), schedule type, per-
architecture default, schedule normalisation, lookup metric, compile-only build and GPU test case
(inputs, float32 reference, launcher, PyTorch baselines). Its search space lives in
``search_spaces``; everything else in the project takes a family as a parameter. Families are
registered by name (the prefill forward, ``"forward"``, on ``import tiledattention``).
"""

from __future__ import annotations

import abc
import math
from typing import Any, Callable, ClassVar, Mapping

import db

from ._call import Call
from ._compile import CompileResult, generation
from ._device import DeviceInfo
from ._dtypes import DTYPES, FP8_DTYPES
from ._identity import module_identity
from ..errors import (InputTypeError, InputValueError, UnknownFamilyError,
                      UnsupportedOperationError, UnsupportedProblemError)

__all__ = ["Family", "Case", "register_family", "unregister_family", "get_family", "families",
           "codecs", "serving"]


class Case(abc.ABC):
    """One problem's inputs on a GPU, its float32 reference and its output buffer."""

    @abc.abstractmethod
    def launcher(self, schedule: Any) -> Callable[[], None]:
        """A function that enqueues one run of ``schedule`` on the current stream."""

    @abc.abstractmethod
    def error(self, run: Callable[[], None]) -> float:
        """Poison the outputs, ``run()`` once, and return the relative L2 error against the
        float32 reference (``nan`` or ``inf`` when the output is not finite)."""

    def baselines(self) -> Mapping[str, Callable[[], Any]]:
        """Contenders outside this project (PyTorch's backends) by name, each a function that
        runs once; a baseline that cannot take this problem raises when called."""
        return {}


def lookup_shape(problem: Any) -> Any:
    """The shape the lookup measures ``problem`` by: its own, or what its problem type says
    (``lookup_shape()``: a sliding window's problem is measured by the window's span)."""
    shape = getattr(problem, "lookup_shape", None)
    return problem if shape is None else shape()


def _log2_apart(a: Any, b: Any, names: tuple[str, ...]) -> float:
    """|log2 prod(a.names) - log2 prod(b.names)|: how far two problems are on one term."""
    return abs(math.log2(math.prod(getattr(a, n) for n in names))
               - math.log2(math.prod(getattr(b, n) for n in names)))


#: GPU generations without FP8 in cuda-tile ("float8_e4m3fn is not supported on sm_89":
#: export_kernel for sm_80, sm_86 and sm_89, cuda-tile 1.7.0).
NO_FP8_GENERATIONS = ("ampere", "ada")


def arch_dtype_refusal(arch: str, problem: Any) -> str | None:
    """Why ``arch`` cannot run ``problem``'s element types, or ``None``: FP8 inputs or an FP8
    K/V cache need Hopper or later."""
    fp8 = problem.dtype in FP8_DTYPES or getattr(problem, "kv_dtype", "")
    if fp8 and generation(arch) in NO_FP8_GENERATIONS:
        return (f"FP8 attention needs sm_90 or later (cuda-tile has no float8_e4m3fn before "
                f"Hopper); got {arch} for {problem.describe()}")
    return None


def check_arch_dtype(arch: str, problem: Any) -> None:
    """Raise an :class:`UnsupportedProblemError` with :func:`arch_dtype_refusal`'s reason."""
    why = arch_dtype_refusal(arch, problem)
    if why is not None:
        raise UnsupportedProblemError(why)


class Family(abc.ABC):
    """A kernel template and everything the tuner and the runtime need to use it.

    Class attributes: ``name`` (the key in the database and on the command line),
    ``problem_type`` / ``schedule_type`` (frozen dataclasses with ``to_dict`` / ``from_dict``,
    ``describe()`` and, for schedules, ``key``), ``template_modules`` (the modules whose code
    decides what a schedule compiles to: their parsed code is the template's identity),
    ``bucket_fields`` (the problem fields a stored row must share with a problem to be used for
    it; the database indexes them), ``seed_across`` (bucket fields whose winners still make
    good first guesses for each other when tuning: the tuner seeds across them), and the lookup
    metric as data (so exported tables can carry it): ``match_ratios``, pairs of fields whose
    ratio a stored problem must share, ``distance_terms``, ``(fields, weight)`` pairs adding
    ``weight * |log2 prod(a.fields) - log2 prod(b.fields)|``, and ``nearest_limit``, the
    largest distance at which a stored problem still answers for another (farther: the
    family's default does).
    """

    name: ClassVar[str]
    problem_type: ClassVar[type]
    schedule_type: ClassVar[type]
    template_modules: ClassVar[tuple[str, ...]]
    bucket_fields: ClassVar[tuple[str, ...]]
    seed_across: ClassVar[tuple[str, ...]] = ()
    match_ratios: ClassVar[tuple[tuple[str, str], ...]] = ()
    distance_terms: ClassVar[tuple[tuple[tuple[str, ...], float], ...]] = ()
    nearest_limit: ClassVar[float] = math.inf
    # The transfer rule (``transfer_refusal``), as data too: a row tuned for one problem answers
    # for another only if, on its own key, it beat the family's default by ``transfer_margin``
    # (more than the tuner's timing noise); if the two problems differ by at most ``max_log2``
    # in each ``transfer_limits`` term (``((fields...), max_log2)``: |log2 prod(fields) -
    # log2 prod(fields')|, the dimensions that decide a schedule's grid); and if that gain,
    # scaled by how much more padding its tiles add on the new problem (``padding_terms``:
    # ``(problem field, schedule tile field, schedule field dividing the problem field first
    # or None)``), still reaches the margin. A ragged row (``Problem.ragged``) answers only for
    # problems with its own values of the fields ``ragged_exact`` names (field -> what it is,
    # for messages: it was tuned on a mix of lengths up to them).
    transfer_margin: ClassVar[float] = 1.03
    transfer_limits: ClassVar[tuple[tuple[tuple[str, ...], float], ...]] = ()
    padding_terms: ClassVar[tuple[tuple[str, str, str | None], ...]] = ()
    ragged_exact: ClassVar[Mapping[str, str]] = {}
    #: The input dtypes the family's kernels take (short names of ``tiledattention.core._dtypes``),
    #: each with the relative L2 error against the float32 reference a correct schedule may
    #: have on it: the family's one declaration of its dtypes. ``register_family`` checks the
    #: names; dispatch refuses a problem of another dtype (:meth:`dtype_refusal`), and
    #: :meth:`tolerance` reads its bound here.
    tolerances: ClassVar[Mapping[str, float]] = {}
    #: The FP8 dtypes the family reads K and V in under 16-bit queries (``Problem.kv_dtype``:
    #: an FP8 K/V cache), their tolerance the queries' dtype's.
    kv_dtypes: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return f"<kernel family {self.name!r}>"

    # -- identity and storage -------------------------------------------------------------------
    def template_identity(self) -> str:
        """12 hex digits over the parsed code of ``template_modules`` (comments, docstrings and
        formatting do not count): rows measured under another identity are stale."""
        return module_identity(*self.template_modules)

    def codec(self) -> db.FamilyCodec:
        # a problem's variant fields (a window, a softcap, sinks: its own computation) join the
        # bucket when set, so a row answers only for problems of the same variant
        bucket = tuple(self.bucket_fields) + tuple(getattr(self.problem_type, "VARIANT_FIELDS",
                                                           ()))
        return db.FamilyCodec(self.name, self.problem_type.from_dict,
                              self.schedule_type.from_dict, bucket,
                              tuple(self.match_ratios), tuple(self.distance_terms),
                              getattr(self.problem_type, "lookup_terms", None))

    # -- schedules ------------------------------------------------------------------------------
    @abc.abstractmethod
    def default_schedule(self, arch: str, problem: Any) -> Any:
        """The schedule to run when nothing tuned is known (per architecture)."""

    def device_default(self, device: DeviceInfo, problem: Any) -> Any:
        """The default the lookup runs on ``device``: :meth:`default_schedule` for its
        architecture; a family whose rules measured apart on devices of one architecture
        refines it by the device's name, one whose rules count waves by its own SMs."""
        return self.default_schedule(device.arch, problem)

    def normalise(self, problem: Any, schedule: Any) -> Any:
        """``schedule`` with every choice that cannot matter for ``problem`` at its canonical
        value: two schedules that compile the same kernel normalise to one value."""
        return schedule

    # -- lookup ---------------------------------------------------------------------------------
    def comparable(self, stored: Any, problem: Any) -> bool:
        """Whether a row tuned for ``stored`` may answer for ``problem`` (beyond sharing
        ``bucket_fields``, which the database already ensured): equal ``match_ratios``."""
        return all(getattr(stored, n) * getattr(problem, d) == getattr(problem, n) *
                   getattr(stored, d) for n, d in self.match_ratios)

    def near_enough(self, stored: Any, problem: Any) -> bool:
        """Whether a row tuned for ``stored`` (sharing ``problem``'s bucket) may answer the
        lookup's nearest step for ``problem``: comparable and within ``nearest_limit``."""
        return (self.comparable(stored, problem)
                and self.distance(stored, problem) <= self.nearest_limit)

    def distance(self, a: Any, b: Any) -> float:
        """How far apart two comparable problems are (0: the same on every term), taken on
        their lookup shapes (:func:`lookup_shape`)."""
        a, b = lookup_shape(a), lookup_shape(b)
        return sum(weight * _log2_apart(a, b, names) for names, weight in self.distance_terms)

    def padding_efficiency(self, problem: Any, schedule: Any) -> float:
        """The share of the work ``schedule``'s tiles do on ``problem`` that is not padding (1:
        every tile full), over ``padding_terms``."""
        share = 1.0
        problem = lookup_shape(problem)
        for field, tile_field, divisor_field in self.padding_terms:
            length = getattr(problem, field)
            parts = getattr(schedule, divisor_field) if divisor_field else 1
            tile = getattr(schedule, tile_field)
            per_part = -(-length // parts)
            share *= length / (parts * tile * -(-per_part // tile))
        return share

    def transfer_refusal(self, stored: Any, schedule: Any, median_ms: float,
                         default_ms: float | None, problem: Any) -> str | None:
        """Why the row tuned for ``stored`` (``schedule`` at ``median_ms``, the default at
        ``default_ms`` on the same key) must not answer for ``problem``, a comparable problem
        within ``nearest_limit``: ``None`` when it may (the class comment above says when)."""
        if default_ms is None:
            return "its key's default time is not recorded"
        if getattr(problem, "ragged", False):
            for name, what in self.ragged_exact.items():
                if getattr(stored, name) != getattr(problem, name):
                    return (f"a ragged row answers only for its own {what} "
                            f"({getattr(stored, name)}, not {getattr(problem, name)})")
        gain = default_ms / median_ms
        if gain < self.transfer_margin:
            return (f"it ran {gain:.3f}x the default on its own key (a row transfers from "
                    f"{self.transfer_margin:g}x)")
        for names, max_log2 in self.transfer_limits:
            apart = _log2_apart(lookup_shape(stored), lookup_shape(problem), names)
            if apart > max_log2 + 1e-9:
                return (f"its {'*'.join(names)} is {2 ** apart:.3g}x apart (at most "
                        f"{2 ** max_log2:g}x transfers)")
        scaled = gain * (self.padding_efficiency(problem, schedule)
                         / self.padding_efficiency(stored, schedule))
        if scaled < self.transfer_margin:
            return (f"its tiles pad this problem more: its {gain:.3f}x over the default "
                    f"scales to {scaled:.3f}x")
        return None

    @abc.abstractmethod
    def flops(self, problem: Any) -> float:
        """Floating-point operations of one call (for TFLOP/s)."""

    # -- building and running ------------------------------------------------------------------
    @abc.abstractmethod
    def compile(self, problem: Any, schedule: Any, arch: str) -> CompileResult:
        """Compile-only build for ``arch`` (no GPU needed); raises ``CompileError``."""

    def compile_launchable(self, problem: Any, schedule: Any, arch: str) -> None:
        """Compile every kernel variant a call of ``problem`` with ``schedule`` may launch
        (``tiledtune aot`` ships what these builds make): :meth:`compile`'s by default."""
        self.compile(problem, schedule, arch)

    def launch_ctas(self, problem: Any, schedule: Any, sms: int) -> tuple[int, ...] | None:
        """The CTAs each kernel of :meth:`compile` (in its cubins' order) launches for
        ``problem`` under ``schedule`` on a GPU of ``sms`` SMs (a grid sized by the SMs), or
        ``None`` where a call decides them (a ragged batch's work) or the family does not say
        (``tiledtune explain --resources`` then gives no waves)."""
        return None

    @abc.abstractmethod
    def case(self, problem: Any, device_index: int) -> Case:
        """Random inputs (fixed seed) for ``problem`` on CUDA device ``device_index``."""

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The input dtypes the family takes (those of ``tolerances``, in its order)."""
        return tuple(self.tolerances)

    def dtype_refusal(self, problem: Any) -> str | None:
        """Why this family cannot take ``problem``'s dtype (one outside its declared
        ``tolerances``) or its K/V cache's (``kv_dtype``, outside ``kv_dtypes``), or
        ``None``."""
        dtype = problem.dtype
        if dtype not in self.tolerances:
            return (f"the {self.name} family takes dtype {' or '.join(self.dtypes) or 'none'}; "
                    f"got {dtype} ({problem.describe()})")
        kv_dtype = getattr(problem, "kv_dtype", "")
        if kv_dtype and kv_dtype not in self.kv_dtypes:
            return (f"the {self.name} family reads K and V in the queries' dtype only; got an "
                    f"FP8 ({kv_dtype}) cache ({problem.describe()})")
        return None

    def check_dtype(self, problem: Any) -> None:
        """Raise an :class:`UnsupportedProblemError` with :meth:`dtype_refusal`'s reason."""
        why = self.dtype_refusal(problem)
        if why is not None:
            raise UnsupportedProblemError(why)

    def tolerance(self, problem: Any) -> float:
        """Largest relative L2 error against the float32 reference a correct schedule has
        (the family's ``tolerances`` for ``problem``'s dtype)."""
        self.check_dtype(problem)
        return self.tolerances[problem.dtype]

    # -- serving the entry points ------------------------------------------------------------------
    # ``serves`` names the operations of the runtime's entry points this family computes:
    # "sdpa" (attention's output: ``tiledattention.sdpa``), "sdpa_with_lse" (the output and each
    # row's log-sum-exp: the forward a backward pass follows), "sdpa_backward" (dQ, dK, dV).
    # Among the families serving one operation, ``choose_family`` asks them in decreasing
    # ``dispatch_priority`` and takes the first whose ``takes`` accepts the problem.
    serves: ClassVar[tuple[str, ...]] = ()
    dispatch_priority: ClassVar[int] = 0

    #: Whether the family's kernels read a paged K/V cache (``Problem.page_size``).
    reads_pages: ClassVar[bool] = False

    def takes(self, arch: str, problem: Any) -> bool:
        """Whether this family runs ``problem`` on ``arch`` when its schedule is left to the
        lookup (a family of lower priority gets it otherwise), beyond its declared dtypes,
        which :meth:`accepts` checks first for every family."""
        return self.pages_refusal(problem) is None

    def accepts(self, arch: str, problem: Any) -> bool:
        """Whether dispatch gives ``problem`` on ``arch`` to this family: a dtype it declares
        (:meth:`dtype_refusal`, once for every family) that ``arch`` has
        (:func:`arch_dtype_refusal`) and its own predicate, :meth:`takes`."""
        return (self.dtype_refusal(problem) is None
                and arch_dtype_refusal(arch, problem) is None and self.takes(arch, problem))

    def why_accepted(self, arch: str, problem: Any) -> str:
        """Why :meth:`accepts` decided as it did, in words (``explain``): the dtype refusal,
        or the family's own reason (:meth:`why_taken`)."""
        return (self.dtype_refusal(problem) or arch_dtype_refusal(arch, problem)
                or self.why_taken(arch, problem))

    def pages_refusal(self, problem: Any) -> str | None:
        """Why this family cannot run ``problem``'s paged cache, or ``None``."""
        if getattr(problem, "page_size", 0) and not self.reads_pages:
            return (f"the {self.name} family reads no paged cache; got {problem.describe()} "
                    f"(the decode family runs paged calls)")
        return None

    #: Whether the family's tuner case takes paged problems (its paged buckets can be tuned).
    tunes_pages: ClassVar[bool] = False

    def reads_pages_with(self, problem: Any, schedule: Any) -> bool:
        """Whether this family's kernels read ``problem``'s pages in place under ``schedule``
        (else the caller gathers them into a contiguous cache first)."""
        return self.reads_pages

    def paged_lookup(self, bucket: Any, shape: Any) -> Any:
        """The problem a paged call's schedule is looked up for: ``bucket`` its paged bucket,
        ``shape`` that bucket at the call's own batch and lengths (:meth:`plan_problem` of
        ``shape`` unless the family says otherwise)."""
        return self.plan_problem(shape)

    def check_pages(self, problem: Any) -> None:
        """Raise an :class:`UnsupportedProblemError` with :meth:`pages_refusal`'s reason."""
        why = self.pages_refusal(problem)
        if why is not None:
            raise UnsupportedProblemError(why)

    def why_taken(self, arch: str, problem: Any) -> str:
        """Why ``takes`` decided as it did, in words (``explain``)."""
        return f"the {self.name} family serves every problem it is asked"

    def deterministic_schedule(self, arch: str, problem: Any, schedule: Any) -> Any:
        """The schedule to run on ``arch`` where bitwise-reproducible results are asked for
        (``torch.use_deterministic_algorithms(True)``, ``sdpa_backward(deterministic=True)``):
        ``schedule`` itself for a family whose every schedule is deterministic."""
        return schedule

    def determinism(self, problem: Any, schedule: Any) -> str | None:
        """In words, whether ``schedule``'s results are bitwise reproducible run to run and
        what a deterministic run uses instead (``explain``); ``None``: nothing to say."""
        return None

    def plan_problem(self, problem: Any) -> Any:
        """The problem a launch plan for ``problem`` is resolved and kept for (its schedule is
        looked up for this one): ``problem`` itself unless plans cover a band of problems."""
        return problem

    def plan(self, call: Call, schedule: Any, device_index: int) -> Any:
        """A launch plan (:class:`tiledattention.Plan`) of ``schedule`` for the calls like
        ``call`` (its problem with the variant, its scale, the caller's mask: a plan kept for a
        band of problems may need an alignment or a window side that the problem's canonical
        form drops) on CUDA device ``device_index`` (families serving "sdpa")."""
        raise UnsupportedOperationError(f"the {self.name} family runs no sdpa call")

    def plan_key(self, signature: tuple, k: Any, v: Any) -> tuple:
        """What, besides the call's ``signature`` (q, the arguments), a kept plan depends on:
        the key ``sdpa``'s warm path finds it by for a torch call with ``k`` and ``v``."""
        return (signature, k.shape, k.stride(), v.shape, v.stride())

    def forward_with_lse(self, stream: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                         problem: Any, schedule: Any, scale: float, device_index: int,
                         sinks: Any = None, ragged: Any = None) -> None:
        """Enqueue the forward that also writes each row's log-sum-exp into ``lse`` (families
        serving "sdpa_with_lse"); ``sinks``: float32 ``[H_q]`` sink logits when
        ``problem.sinks``; ``ragged``: the call's ``tiledattention.core._ragged.RaggedLayout``
        when ``problem.ragged`` (``lse`` may then be ``None``: a forward that keeps none)."""
        raise UnsupportedOperationError(f"the {self.name} family keeps no log-sum-exp")

    def prepare_with_lse(self, problem: Any, schedule: Any, scale: float,
                         device_index: int) -> Callable[..., None]:
        """:meth:`forward_with_lse` of one dense problem, schedule, scale and device, prepared
        for every later call: ``run(stream, q, k, v, out, lse, sinks)`` (a training call's
        warm path keeps one per signature). Here: a call of :meth:`forward_with_lse`; a family
        may prepare the launch's arguments once."""
        def run(stream: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, sinks: Any) -> None:
            self.forward_with_lse(stream, q, k, v, out, lse, problem, schedule, scale,
                                  device_index, sinks=sinks)
        return run

    def fp8_plan(self, call: Any, schedule: Any, device_index: int, q: Any, k: Any, v: Any,
                 out: Any) -> Any:
        """The launch plan of an FP8 call (``call.problem``: an FP8 ``dtype`` the family's
        ``tolerances`` declare, or a ``kv_dtype`` of its ``kv_dtypes``) for these arrays
        (``out``: the caller's, or None), kept by ``sdpa`` per call signature: its ``run(
        scratch, q, k, v, device, out, sinks=, descales=)`` enqueues the call on the device's
        current stream with the float32 ``[B, H_kv]`` factors of q, k and v and returns the
        output (None where the arrays fail the plan's own checks)
        (``tiledattention.entry_points._fp8``)."""
        raise UnsupportedOperationError(f"the {self.name} family takes no FP8 inputs")

    def prepare_backward(self, problem: Any, schedule: Any, scale: float) -> Callable[..., None]:
        """:meth:`backward` of one dense problem, schedule and scale, prepared for every later
        call: ``run(stream, q, k, v, out, grad_out, lse, delta, grads)`` (a training call's warm
        path keeps one per signature). Here: a call of :meth:`backward`; a family may prepare
        its launches once."""
        def run(stream: Any, q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any,
                delta: Any, grads: tuple[Any, Any, Any]) -> None:
            self.backward(stream, problem, schedule, scale, q, k, v, out, grad_out, lse, delta,
                          grads)
        return run

    def backward(self, stream: Any, problem: Any, schedule: Any, scale: float, q: Any, k: Any,
                 v: Any, out: Any, grad_out: Any, lse: Any, delta: Any,
                 grads: tuple[Any, Any, Any], sinks: Any = None, ragged: Any = None) -> None:
        """Enqueue dQ, dK, dV into ``grads`` (families serving "sdpa_backward"); ``delta`` is
        float32 scratch shaped like ``lse``; ``sinks``: float32 ``[H_q]`` sink logits when
        ``problem.sinks`` (the stored ``lse`` already holds their term); ``ragged``: the
        call's ``RaggedLayout`` when ``problem.ragged`` (rows and keys outside every sequence
        are not written)."""
        raise UnsupportedOperationError(f"the {self.name} family computes no gradients")


_REGISTRY: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Make ``family`` known by its name to the tuner, the database and the lookup."""
    if not isinstance(family, Family):
        raise InputTypeError(f"register_family() takes a Family; got {type(family).__name__}")
    family.codec()  # checks the name
    unknown = [name for name in family.tolerances if name not in DTYPES]
    if unknown:
        raise InputValueError(f"{family.name}'s tolerances must name dtypes among {DTYPES} "
                              f"(tiledattention/core/_dtypes.py); got {unknown}")
    if _REGISTRY.get(family.name, family) is not family:
        raise InputValueError(f"a kernel family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    _SERVING.clear()
    return family


def unregister_family(name: str) -> None:
    """Forget the family ``name`` (tests register families of their own)."""
    _REGISTRY.pop(name, None)
    _SERVING.clear()


def get_family(name: Any) -> Family:
    """The registered family ``name``; :class:`UnknownFamilyError` lists the known ones."""
    family = _REGISTRY.get(name) if isinstance(name, str) else None
    if family is None:
        raise UnknownFamilyError(f"kernel must be one of {sorted(_REGISTRY)}; got {name!r}")
    return family


def families() -> tuple[Family, ...]:
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


_SERVING: dict[str, tuple[Family, ...]] = {}  # operation -> serving(operation), until a change


def serving(operation: str) -> tuple[Family, ...]:
    """The registered families that serve ``operation``, in the order ``choose_family`` asks
    them (decreasing ``dispatch_priority``, then by name)."""
    found = _SERVING.get(operation)
    if found is None:
        found = tuple(sorted((f for f in families() if operation in f.serves),
                             key=lambda f: -f.dispatch_priority))
        _SERVING[operation] = found
    return found


def codecs() -> dict[str, db.FamilyCodec]:
    """The database codec of every registered family."""
    return {family.name: family.codec() for family in families()}
