"""What ``tiledtune bench`` measures, as data: a :class:`Preset` per kernel family names the grid
options it takes and their defaults, a small function that turns option values into problems of
the family's ``problem_type``, the contenders and how they are timed. A :class:`Grid` is the
result: a list of problems and the contenders to time at each.

Two grid shapes serve the three families: a model layer's (``_layer``: ``B·S`` and ``H·D`` held
fixed, ``B = tokens // S``, ``H = hidden // D``; forward and backward) and decode's (``_decode``: a
union of groups, each a cross product of batch sizes, query lengths, key lengths and masks, at
every head configuration, head dim and dtype; a problem in two groups is measured once).
``--problem`` (``build_grid(problems=...)``) replaces either shape with the problems named field
by field, for any family. Everything here is pure (no GPU, no torch); a bad value raises
:class:`BenchConfigError` naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Any, Callable, Mapping, Sequence

from tiledattention import (InputTypeError, InputValueError, UnsupportedProblemError,
                            get_family)

from ..errors import UsageError

__all__ = ["BenchConfigError", "Grid", "Preset", "PRESETS", "build_grid", "parse_int_list",
           "parse_positive_float", "parse_positive_int"]

MASKS = ("none", "top-left", "bottom-right")
_MASK_WORDS = {"none": "none", "no": "none", "full": "none", "top-left": "top-left",
               "top_left": "top-left", "causal": "top-left", "yes": "top-left",
               "bottom-right": "bottom-right", "bottom_right": "bottom-right",
               "br": "bottom-right"}
_CAUSAL_WORDS = {"yes": True, "no": False, "causal": True, "full": False}


class BenchConfigError(UsageError):
    """A ``tiledtune bench`` option has an impossible value (the message names the flag)."""


# -- flag values ---------------------------------------------------------------------------------

def _items(flag: str, text: str) -> list[str]:
    if not isinstance(text, str) or not text.strip():
        raise BenchConfigError(f"{flag} needs a comma-separated list; got {text!r}")
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise BenchConfigError(f"{flag} has an empty item in {text!r}; write e.g. 'a,b'")
    if len(set(items)) != len(items):
        raise BenchConfigError(f"{flag} lists a value twice: {text!r}")
    return items


def _text(value: Any) -> str:
    """Option values as typed, or already parsed sequences written back as text."""
    if isinstance(value, str):
        return value
    words = {True: "yes", False: "no"}
    return ",".join(f"{v[0]}/{v[1]}" if isinstance(v, tuple) else words.get(v, str(v))
                    if isinstance(v, bool) else str(v) for v in value)


def parse_positive_int(flag: str, text: str | int, *, least: int = 1) -> int:
    """An integer of at least ``least`` (1: "positive", 0: "non-negative"), as typed."""
    kind = "positive" if least == 1 else "non-negative"
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < least or str(text).strip() not in (str(value), f"+{value}"):
        raise BenchConfigError(f"{flag} must be a {kind} integer; got {text!r}")
    return value


def parse_positive_float(flag: str, text: str | float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{flag} must be a positive number; got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise BenchConfigError(f"{flag} must be a finite positive number; got {text!r}")
    return value


def parse_int_list(flag: str, text: Any) -> tuple[int, ...]:
    return tuple(parse_positive_int(flag, item) for item in _items(flag, _text(text)))


def _choices(flag: str, text: Any, words: Mapping[str, Any], expected: str) -> tuple:
    """The values ``words`` gives the comma-separated items, in the order given, once each."""
    items = [item.lower() for item in _items(flag, _text(text))]
    bad = [item for item in items if item not in words]
    if bad:
        raise BenchConfigError(f"{flag}: unknown value {bad[0]!r}; expected {expected}")
    values = tuple(words[item] for item in items)
    if len(set(values)) != len(values):
        raise BenchConfigError(f"{flag} lists a value twice: {text!r}")
    return values


def _heads(text: Any) -> tuple[tuple[int, int], ...]:
    """``H_q/H_kv`` pairs (``H`` alone: as many K/V heads), comma-separated."""
    pairs = []
    for item in _items("--heads", _text(text)):
        parts = item.split("/")
        if len(parts) > 2 or not all(p.strip() for p in parts):
            raise BenchConfigError(f"--heads: {item!r} is not H_q/H_kv (e.g. 32/8)")
        hq, hkv = (parse_positive_int("--heads", p) for p in (parts[0], parts[-1]))
        if hq % hkv:
            raise BenchConfigError(f"--heads: in {item!r} H_q ({hq}) must be a multiple of "
                                   f"H_kv ({hkv})")
        pairs.append((hq, hkv))
    if len(set(pairs)) != len(pairs):
        raise BenchConfigError(f"--heads lists a head configuration twice: {text!r}")
    return tuple(pairs)


def _supported(preset: "Preset", flag: str, name: str, values: tuple) -> tuple:
    """``values`` once the family's problem type takes each as its field ``name``."""
    probe = dict(batch=1, heads_q=1, heads_kv=1, seqlen_q=1, seqlen_k=1, head_dim=64,
                 dtype="bf16", causal=False)
    for value in values:
        try:
            preset.family.problem_type(**{**probe, name: value})
        except InputValueError as exc:
            raise BenchConfigError(f"{flag}: {value!r} is not supported: {exc}") from None
    return values


def _problem(preset: "Preset", flags: str, fields: dict) -> Any:
    try:
        return preset.family.problem_type(**fields)
    except UnsupportedProblemError as exc:
        raise BenchConfigError(f"{flags}: {_shape(fields)} is not a problem the kernels take: "
                               f"{exc}") from None


def _shape(f: dict) -> str:
    if f["seqlen_q"] == f["seqlen_k"] and f["heads_q"] == f["heads_kv"]:
        return f"B={f['batch']} H={f['heads_q']} S={f['seqlen_q']} D={f['head_dim']}"
    return (f"B={f['batch']} H={f['heads_q']}/{f['heads_kv']} S_q={f['seqlen_q']} "
            f"S_k={f['seqlen_k']} D={f['head_dim']}")


# -- the two grid shapes ---------------------------------------------------------------------------

def _option(o: Mapping[str, Any], base: Mapping[str, Any], name: str,
            parse: Callable[[Any], Any]) -> Any:
    return base[name] if o.get(name) is None else parse(o[name])


def _dtypes(preset: "Preset", text: Any) -> tuple[str, ...]:
    items = tuple(d.lower() for d in _items("--dtypes", _text(text)))
    return _supported(preset, "--dtypes", "dtype", items)


def _layer(preset: "Preset", o: Mapping[str, Any], base: Mapping[str, Any]) -> list:
    """Self-attention problems of a model layer, ordered dtype, mask, head dim, length."""
    tokens = _option(o, base, "tokens", lambda v: parse_positive_int("--tokens", v))
    hidden = _option(o, base, "hidden", lambda v: parse_positive_int("--hidden", v))
    dims = _option(o, base, "head_dims", lambda v: parse_int_list("--head-dims", v))
    lens = _option(o, base, "seqlens", lambda v: parse_int_list("--seqlens", v))
    dtypes = _option(o, base, "dtypes", lambda v: _dtypes(preset, v))
    causal = _option(o, base, "causal", lambda v: _choices("--causal", v, _CAUSAL_WORDS,
                                                           "yes, no or yes,no"))
    for d in _supported(preset, "--head-dims", "head_dim", dims):
        if hidden % d:
            raise BenchConfigError(f"--head-dims: {d} does not divide --hidden {hidden} (H = "
                                   f"hidden // D must be exact); pick head dims that divide "
                                   f"{hidden} or change --hidden")
    for s in lens:
        if tokens % s:
            raise BenchConfigError(f"--seqlens: {s} does not divide --tokens {tokens} (B = "
                                   f"tokens // S must be exact); pick sequence lengths that "
                                   f"divide {tokens} or change --tokens")
    return [_problem(preset, "--tokens/--hidden/--seqlens/--head-dims",
                     dict(batch=tokens // s, heads_q=hidden // d, heads_kv=hidden // d,
                          seqlen_q=s, seqlen_k=s, head_dim=d, dtype=dtype, causal=c))
            for dtype, c, d, s in product(dtypes, causal, dims, lens)]


def _decode(preset: "Preset", o: Mapping[str, Any], base: Mapping[str, Any]) -> list:
    """Decode problems, ordered dtype, group, heads, head dim, B, S_q, mask, S_k; each once."""
    axes = {}
    for name, flag in (("batch", "--batch"), ("seqlens_q", "--seqlens-q"),
                       ("seqlens_k", "--seqlens-k")):
        if o.get(name) is not None:
            axes[name] = parse_int_list(flag, o[name])
    if o.get("masks") is not None:
        masks = _choices("--masks", o["masks"], _MASK_WORDS,
                         f"a comma-separated subset of {','.join(MASKS)}")
        axes["masks"] = tuple(m for m in MASKS if m in masks)
    heads = _option(o, base, "heads", _heads)
    dims = _option(o, base, "head_dims", lambda v: _supported(
        preset, "--head-dims", "head_dim", parse_int_list("--head-dims", v)))
    dtypes = _option(o, base, "dtypes", lambda v: _dtypes(preset, v))
    seen: dict[Any, None] = {}
    for dtype, group in product(dtypes, base["groups"]):
        g = {**group, **axes}
        for (hq, hkv), d, b, sq, mask, sk in product(heads, dims, g["batch"], g["seqlens_q"],
                                                     g["masks"], g["seqlens_k"]):
            if mask == "bottom-right" and sq > sk:
                raise BenchConfigError(
                    f"--seqlens-q: S_q {sq} > S_k {sk} with a bottom-right mask leaves query "
                    f"rows without any key; pick S_q <= S_k (--seqlens-k) or another mask "
                    f"(--masks)")
            seen.setdefault(_problem(preset, "--batch/--heads/--seqlens-q/--seqlens-k", dict(
                batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                dtype=dtype, causal=mask != "none", bottom_right=mask == "bottom-right")))
    return list(seen)


# -- problems named field by field (--problem) ----------------------------------------------------

#: Options ``build_grid`` takes that shape no grid (they may go with ``--problem``).
_NOT_GRID = ("no_matmul",)


def _fields_text(data: Any) -> str:
    """A ``--problem``'s fields as typed (``FIELD=VALUE,...``; booleans as yes/no)."""
    if not isinstance(data, Mapping):
        return repr(data)
    words = {True: "yes", False: "no"}
    return ",".join(f"{name}={words[value] if isinstance(value, bool) else value}"
                    for name, value in data.items())


def _refuse_grid_options(kernel: str, options: Mapping[str, Any]) -> None:
    """``--problem`` replaces the grid: any grid option given with it is refused, naming it."""
    for option, value in options.items():
        if option not in _NOT_GRID and value not in (None, False):
            flag = "--" + option.replace("_", "-")
            raise BenchConfigError(f"{flag} cannot go with --problem: --problem replaces the "
                                   f"{kernel} grid with the problems it names; drop {flag} or "
                                   f"give its value in each --problem")


def _given_problem(preset: "Preset", data: Any) -> Any:
    """One ``--problem``'s fields as the family's problem type (what it refuses, named)."""
    try:
        return preset.family.problem_type.from_dict(data)
    except (InputTypeError, InputValueError) as exc:
        raise BenchConfigError(f"--problem {_fields_text(data)}: not a problem the "
                               f"{preset.kernel} kernel takes: {exc}") from None


def _given(preset: "Preset", problems: Sequence[Mapping[str, Any]]) -> list:
    """The problems ``--problem`` names, in the order given, each once."""
    if isinstance(problems, (str, Mapping)) or not problems:
        raise BenchConfigError(f"--problem needs a non-empty list of problems, each a dict of "
                               f"fields; got {problems!r}")
    return list(dict.fromkeys(_given_problem(preset, data) for data in problems))


# -- presets -------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Preset:
    """One family's benchmark: ``build(preset, options, defaults)`` makes the problems from the
    grid ``options`` it takes (attribute names of ``tiledtune bench``'s flags; ``None``: the
    default, from ``defaults``, ``(full, quick)``). Contenders: ``tiledattention`` (the lookup's
    schedule), ``tiledattention-default`` (the family's default, where it differs),
    ``tiledattention-<f>`` for each family ``f`` of ``also`` (its lookup's schedule, on the same
    problems) and the family case's ``baselines``; ``order`` is the order tables show them in
    (with the names of older runs' contenders). ``ceiling``: the rate the summary reads results
    against, ``"matmul"`` (TFLOP/s) or ``"copy"`` (GB/s); ``phase``: the rows' ``phase``."""

    kernel: str
    options: tuple[str, ...]
    build: Callable[["Preset", Mapping[str, Any], Mapping[str, Any]], list]
    defaults: tuple[Mapping[str, Any], Mapping[str, Any]]
    order: tuple[str, ...]
    baselines: tuple[str, ...]
    also: tuple[str, ...] = ()
    interleave: tuple[int, int] = (0, 0)  # default rounds (full, --quick); 0: one by one
    ceiling: str = "matmul"
    gbps: bool = True  # whether rows carry GB/s (Q, K, V read and the output written)
    phase: str = ""
    target: tuple | None = None  # (contender, phase, baseline, goal, source)

    @property
    def family(self) -> Any:
        return get_family(self.kernel)

    @property
    def contenders(self) -> tuple[str, ...]:
        runnable = {"tiledattention", "tiledattention-default", *self.baselines,
                    *(f"tiledattention-{f}" for f in self.also)}
        return tuple(name for name in self.order if name in runnable)


_LAYER = dict(tokens=16384, hidden=2048, head_dims=(64, 128, 256), dtypes=("bf16", "fp16"),
              causal=(False, True))
_LAYER_QUICK = dict(_LAYER, head_dims=(64, 128), seqlens=(1024, 4096), dtypes=("bf16",))
_LAYER_OPTIONS = ("tokens", "hidden", "seqlens", "causal", "head_dims", "dtypes", "no_matmul")
_TORCH = ("torch-cudnn", "torch-flash")
_DECODE_GROUPS = (dict(batch=(1,), seqlens_q=(1,), masks=("none",),
                       seqlens_k=(4096, 8192, 16384, 30000, 32768, 65536, 100000, 131072)),
                  dict(batch=(8, 32), seqlens_q=(1,), seqlens_k=(2048, 8192), masks=("none",)),
                  dict(batch=(8,), seqlens_q=(16,), seqlens_k=(8192,), masks=("bottom-right",)))
_DECODE = dict(heads=((32, 8),), head_dims=(128,), dtypes=("bf16",), groups=_DECODE_GROUPS)

#: The benchmark of each family with one, by ``--kernel`` name.
PRESETS = {
    "forward": Preset(
        kernel="forward", options=_LAYER_OPTIONS, build=_layer,
        defaults=(dict(_LAYER, seqlens=(512, 1024, 2048, 4096, 8192, 16384)), _LAYER_QUICK),
        order=("tiledattention", "tiledattention-default", "torch-auto", "torch-flash",
               "torch-cudnn", "torch-efficient", "torch-math", "eager"), baselines=_TORCH),
    "decode": Preset(
        kernel="decode", build=_decode, ceiling="copy", interleave=(30, 10),
        options=("batch", "seqlens_q", "seqlens_k", "masks", "heads", "head_dims", "dtypes"),
        defaults=(_DECODE, dict(_DECODE, groups=(
            dict(batch=(1,), seqlens_q=(1,), seqlens_k=(4096, 32768), masks=("none",)),
            dict(batch=(8,), seqlens_q=(1,), seqlens_k=(8192,), masks=("none",)),
            _DECODE_GROUPS[2]))),
        order=("tiledattention", "tiledattention-default", "tiledattention-forward",
               "torch-cudnn", "torch-flash", "torch-efficient"),
        baselines=_TORCH, also=("forward",)),
    "backward": Preset(
        kernel="backward", options=_LAYER_OPTIONS, build=_layer, interleave=(30, 10),
        defaults=(dict(_LAYER, seqlens=(1024, 4096, 16384)), _LAYER_QUICK), gbps=False,
        order=("tiledattention", "tiledattention-default", "torch-cudnn", "torch-flash",
               "torch-efficient"), baselines=_TORCH, phase="backward",
        target=("tiledattention", "backward", "torch-flash", 1.2, "issue 17")),
}


@dataclass(frozen=True)
class Grid:
    """The problems of one family to measure, and the contenders to time at each."""

    kernel: str
    problems: tuple
    contenders: tuple[str, ...]

    @property
    def preset(self) -> Preset:
        return PRESETS[self.kernel]


def _owner(option: str) -> str:
    owners = [name for name, preset in PRESETS.items() if option in preset.options]
    also = f"; the {' and '.join(owners[1:])} grid takes it too" if owners[1:] else ""
    return f"{owners[0]} grid (--kernel {owners[0]}{also})"


def build_grid(kernel: str = "forward", *, quick: bool = False,
               contenders: str | Sequence[str] | None = None,
               problems: Sequence[Mapping[str, Any]] | None = None, **options: Any) -> Grid:
    """Validate option values (strings as typed, or parsed sequences; ``None``: the preset's
    default) into the :class:`Grid` of ``kernel``'s preset. An option of another family's grid
    is refused, naming it; every problem is built, so a bad combination is reported here.
    ``problems`` (``--problem``: dicts of the family's problem fields) replaces the grid: its
    problems are exactly those, in order, each once, and no grid option may come with it."""
    preset = PRESETS[kernel]
    if problems is not None:
        _refuse_grid_options(kernel, options)
    for option, value in options.items():
        if option not in preset.options and value not in (None, False):
            flag = "--" + option.replace("_", "-")
            raise BenchConfigError(f"{flag} belongs to the {_owner(option)}; it does nothing "
                                   f"with --kernel {kernel}")
    points = tuple(preset.build(preset, options, preset.defaults[bool(quick)])
                   if problems is None else _given(preset, problems))
    chosen = preset.contenders
    if contenders is not None and _text(contenders).strip().lower() != "all":
        items = _items("--contenders", _text(contenders))
        bad = [item for item in items if item not in chosen]
        if bad:
            raise BenchConfigError(f"--contenders: unknown contender {bad[0]!r} for --kernel "
                                   f"{kernel}; known: {', '.join(chosen)} (or 'all')")
        chosen = tuple(name for name in chosen if name in items)  # canonical order
    return Grid(kernel, points, chosen)
