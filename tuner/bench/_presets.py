"""What ``tiledtune bench`` measures, as data: a :class:`Preset` per kernel family names the grid
options it takes and their defaults, a small function that turns option values into problems of
the family's ``problem_type``, the contenders and how they are timed. A :class:`Grid` is the
result: a list of problems and the contenders to time at each.

Two grid shapes serve the three families: a model layer's (``_layer``: ``B·S`` and ``H·D`` held
fixed, ``B = tokens // S``, ``H = hidden // D``; forward and backward) and decode's (``_decode``: a
union of groups, each a cross product of batch sizes, query lengths, key lengths and masks, at
every head configuration, head dim and dtype; a problem in two groups is measured once).
``--problem`` (``build_grid(problems=...)``) replaces either shape with the problems named field
by field, for any family. ``--preset variants`` (:data:`VARIANT_PRESETS`) replaces it with
model-shaped variant problems (:data:`VARIANT_POINTS`: sliding windows, logit softcap, attention
sinks; issue 32), ``--preset ragged`` (:data:`RAGGED_PRESETS`) with model-shaped ragged
buckets (:data:`RAGGED_POINTS`: packed variable-length batches, ``Problem.ragged``; issue 33),
``--preset paged`` (:data:`PAGED_PRESETS`, decode only) with the shipped paged decode buckets
(:data:`PAGED_POINTS`: a decode step over a paged K/V cache, ``Problem.page_size``; issue 34).
Plain problems get the preset's contenders; variant problems get tiledattention's and those of
``_variants`` (FlexAttention, SDPA with the materialised mask, ``varlen_attn``), ragged problems
tiledattention's and those of ``_ragged`` (``varlen_attn`` on the packed batch, SDPA on the
padded batch with the padding mask), paged problems tiledattention's and those of ``_paged``
(``varlen_attn`` with a block table, cuDNN's SDPA on the padded caches with the key-padding
mask), and FlashAttention-4 (``_peers``) at every problem: :meth:`Grid.contenders_at`.
Everything here is pure (no GPU, no torch); a bad value
raises :class:`BenchConfigError` naming the flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import product
from typing import Any, Callable, Mapping, Sequence

from tiledattention import (InputTypeError, InputValueError, UnsupportedProblemError,
                            get_family)

from ..errors import UsageError
from ._paged import PAGED_CONTENDERS
from ._peers import PEER_CONTENDERS
from ._ragged import RAGGED_CONTENDERS
from ._variants import VARIANT_CONTENDERS, applies

__all__ = ["BenchConfigError", "FP8_POINTS", "FP8_PRESETS", "GRID_PRESETS", "Grid", "PAGED_POINTS",
           "PAGED_PRESETS", "Preset",
           "PRESETS", "RAGGED_POINTS", "RAGGED_PRESETS", "VARIANT_POINTS", "VARIANT_PRESETS",
           "build_grid", "parse_int_list", "parse_positive_float", "parse_positive_int"]

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
    (with the names of older runs' contenders); ``peers``: other libraries' contenders, after
    every other in tables (``_peers``: FlashAttention-4, whose row says ``unavailable`` where
    it is not installed).
    ``ceiling``: the rate the summary reads results
    against, ``"matmul"`` (TFLOP/s) or ``"copy"`` (GB/s); ``phase``: the rows' ``phase``."""

    kernel: str
    options: tuple[str, ...]
    build: Callable[["Preset", Mapping[str, Any], Mapping[str, Any]], list]
    defaults: tuple[Mapping[str, Any], Mapping[str, Any]]
    order: tuple[str, ...]
    baselines: tuple[str, ...]
    also: tuple[str, ...] = ()
    peers: tuple[str, ...] = PEER_CONTENDERS
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
        return tuple(name for name in self.order if name in runnable) + self.peers


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


# -- the variants preset (issue 32) ---------------------------------------------------------------

def _point(batch: int, heads: tuple[int, int], seqlen: int, head_dim: int, *,
           seqlen_k: int | None = None, window: tuple[int, int] = (-1, -1),
           softcap: float = 0.0, sinks: bool = False, bottom_right: bool = False,
           causal: bool = True) -> dict[str, Any]:
    return dict(batch=batch, heads_q=heads[0], heads_kv=heads[1], seqlen_q=seqlen,
                seqlen_k=seqlen if seqlen_k is None else seqlen_k, head_dim=head_dim,
                causal=causal, bottom_right=bottom_right, window_left=window[0],
                window_right=window[1], softcap=softcap, sinks=sinks)


#: Model-shaped variant problems (all but ``dtype``), by name: Mistral 7B's 4096-key sliding
#: window (window ``(4095, 0)``, causal; H 32/8, D 128) at 8k and 32k tokens; GPT-OSS's
#: 128-key sliding layers (H 64/8, D 64) without and with sinks; Gemma 2's global layers
#: (softcap 50; H 16/8, D 256) and its local ones (a 4096-key window and the softcap); decoding
#: one token over a 4096-key window of a 128k cache (bottom-right) at B 1 and 8, and GPT-OSS's
#: sliding layer with sinks at one token of a 128k cache. The backward's are at B 1: its case's
#: float32 reference gradients keep every score of a point (32 GiB at B 2 for GPT-OSS at 8k;
#: 128 GiB for Mistral at 32k, which the backward leaves out).
VARIANT_POINTS = {
    "mistral-8k": _point(2, (32, 8), 8192, 128, window=(4095, 0)),
    "mistral-32k": _point(1, (32, 8), 32768, 128, window=(4095, 0)),
    "gpt-oss-window128": _point(2, (64, 8), 8192, 64, window=(127, 0)),
    "gpt-oss-window128-sinks": _point(2, (64, 8), 8192, 64, window=(127, 0), sinks=True),
    "gemma2-softcap50": _point(2, (16, 8), 8192, 256, softcap=50.0),
    "gemma2-local-softcap50": _point(2, (16, 8), 8192, 256, window=(4095, 0), softcap=50.0),
    "decode-mistral-128k": _point(1, (32, 8), 1, 128, seqlen_k=131072, window=(4095, 0),
                                  bottom_right=True),
    "decode-mistral-128k-b8": _point(8, (32, 8), 1, 128, seqlen_k=131072, window=(4095, 0),
                                     bottom_right=True),
    "decode-gpt-oss-128k-sinks": _point(1, (64, 8), 1, 64, seqlen_k=131072, window=(127, 0),
                                        sinks=True, bottom_right=True),
}
_PREFILL = ("mistral-8k", "mistral-32k", "gpt-oss-window128", "gpt-oss-window128-sinks",
            "gemma2-softcap50", "gemma2-local-softcap50")
_PREFILL_QUICK = ("mistral-8k", "gpt-oss-window128-sinks", "gemma2-local-softcap50")
_BACKWARD_BATCH = 1  # see VARIANT_POINTS


def _variant_grid(preset: "Preset", o: Mapping[str, Any], base: Mapping[str, Any]) -> list:
    """The preset's named points (``base["points"]``), ordered dtype, point, batch; ``--batch``
    puts every point at each batch size given, ``--dtypes`` in each dtype."""
    dtypes = _option(o, base, "dtypes", lambda v: _dtypes(preset, v))
    batches = None if o.get("batch") is None else parse_int_list("--batch", o["batch"])
    table = base.get("table", VARIANT_POINTS)
    seen: dict[Any, None] = {}
    for dtype, name in product(dtypes, base["points"]):
        fields = dict(table[name], dtype=dtype)
        if base.get("batch") is not None:
            fields["batch"] = base["batch"]
        for b in batches or (fields["batch"],):
            seen.setdefault(_problem(preset, "--preset variants/--batch",
                                     dict(fields, batch=b)))
    return list(seen)


def _variants_of(preset: Preset, points: tuple[str, ...], quick: tuple[str, ...],
                 batch: int | None = None, table: Mapping[str, Any] = VARIANT_POINTS,
                 dtypes: tuple[str, ...] = ("bf16",)) -> Preset:
    """``preset``'s family, contenders and timing over the named points of ``table`` (the
    variant points unless given), in ``dtypes`` unless ``--dtypes`` says otherwise."""
    options = ("batch", "dtypes") + (("no_matmul",) if "no_matmul" in preset.options else ())
    return dataclasses.replace(preset, options=options, build=_variant_grid, defaults=tuple(
        dict(points=names, dtypes=dtypes, batch=batch, table=table)
        for names in (points, quick)))


#: ``--preset variants``: each family's benchmark over :data:`VARIANT_POINTS`.
VARIANT_PRESETS = {
    "forward": _variants_of(PRESETS["forward"], _PREFILL, _PREFILL_QUICK),
    "backward": _variants_of(PRESETS["backward"], tuple(n for n in _PREFILL if n != "mistral-32k"),
                             _PREFILL_QUICK, batch=_BACKWARD_BATCH),
    "decode": _variants_of(PRESETS["decode"], ("decode-mistral-128k", "decode-mistral-128k-b8",
                                               "decode-gpt-oss-128k-sinks"),
                           ("decode-mistral-128k", "decode-gpt-oss-128k-sinks")),
}


# -- the ragged preset (issue 33) -----------------------------------------------------------------

def _ragged_point(tokens: int, longest: int, heads: tuple[int, int], head_dim: int
                  ) -> dict[str, Any]:
    return dict(tokens=tokens, longest=longest, heads_q=heads[0], heads_kv=heads[1],
                head_dim=head_dim)


#: Model-shaped ragged batches (all but ``dtype``; causal, bottom-right: the bucket
#: ``varlen_attn(is_causal=True)`` and padding-free training look up; each sequence has as many
#: keys as queries), by name: a batch of ``tokens`` packed tokens whose longest sequence has
#: ``longest`` tokens, looked up and timed as its bucket (``ragged_problem``: the longest length
#: and the number of such sequences the tokens fill, rounded up to powers of two; the family's
#: ragged case packs that many sequences of 1, 3/4, 1/2 and 1/4 of the longest). Llama-shaped
#: layers (H 32/8, D 128) at 16k and 32k tokens with the longest sequence 1k-16k, a multi-head
#: D 64 layer (H 16) and a multi-query one (H 8/1, D 128): the shipped table's ragged buckets
#: (``scripts/tune_ragged_shipped.py`` tunes them; tuned bottom-right on 2026-12-04, forward and
#: backward).
RAGGED_POINTS = {
    "llama-1k@16k": _ragged_point(16384, 1024, (32, 8), 128),
    "llama-1k@32k": _ragged_point(32768, 1024, (32, 8), 128),
    "llama-2k@16k": _ragged_point(16384, 2048, (32, 8), 128),
    "llama-2k@32k": _ragged_point(32768, 2048, (32, 8), 128),
    "llama-4k@16k": _ragged_point(16384, 4096, (32, 8), 128),
    "llama-4k@32k": _ragged_point(32768, 4096, (32, 8), 128),
    "llama-8k@16k": _ragged_point(16384, 8192, (32, 8), 128),
    "llama-16k@32k": _ragged_point(32768, 16384, (32, 8), 128),
    "mha-d64-2k@16k": _ragged_point(16384, 2048, (16, 16), 64),
    "mqa-4k@16k": _ragged_point(16384, 4096, (8, 1), 128),
}
_RAGGED_QUICK = ("llama-1k@16k", "llama-8k@16k", "mha-d64-2k@16k", "mqa-4k@16k")
#: the backward's: training lengths at 16k tokens (its buckets the shipped table held)
_RAGGED_BACKWARD = ("llama-1k@16k", "llama-2k@16k", "llama-4k@16k", "llama-8k@16k",
                    "mha-d64-2k@16k")
_RAGGED_BACKWARD_QUICK = ("llama-1k@16k", "llama-4k@16k", "mha-d64-2k@16k")


def _ragged_grid(preset: "Preset", o: Mapping[str, Any], base: Mapping[str, Any]) -> list:
    """The buckets of the preset's named points (``base["points"]``), ordered dtype, point,
    token count; ``--tokens`` puts every point at each token count given (at least its longest
    sequence), ``--dtypes`` in each dtype; a bucket two points share is measured once."""
    from tiledattention.tooling import ragged_problem

    dtypes = _option(o, base, "dtypes", lambda v: _dtypes(preset, v))
    counts = None if o.get("tokens") is None else parse_int_list("--tokens", o["tokens"])
    seen: dict[Any, None] = {}
    for dtype, name in product(dtypes, base["points"]):
        point = RAGGED_POINTS[name]
        longest = point["longest"]
        for tokens in counts or (point["tokens"],):
            if tokens < longest:
                raise BenchConfigError(
                    f"--tokens: {tokens} tokens cannot hold point {name}'s longest sequence "
                    f"({longest} tokens); give at least {longest} (the preset's points go up "
                    f"to {max(RAGGED_POINTS[n]['longest'] for n in base['points'])})")
            try:
                problem = ragged_problem(
                    sequences=tokens, tokens_q=tokens, longest_q=longest, longest_k=longest,
                    heads_q=point["heads_q"], heads_kv=point["heads_kv"],
                    head_dim=point["head_dim"], dtype=dtype, causal=True, bottom_right=True)
            except UnsupportedProblemError as exc:
                raise BenchConfigError(f"--preset ragged/--tokens: {tokens} tokens of point "
                                       f"{name} is not a problem the kernels take: "
                                       f"{exc}") from None
            seen.setdefault(_problem(preset, "--preset ragged/--tokens", problem.to_dict()))
    return list(seen)


def _ragged_of(preset: Preset, points: tuple[str, ...], quick: tuple[str, ...]) -> Preset:
    """``preset``'s family, contenders and timing over the named ragged points."""
    options = ("tokens", "dtypes") + (("no_matmul",) if "no_matmul" in preset.options else ())
    return dataclasses.replace(preset, options=options, build=_ragged_grid, target=None,
                               defaults=tuple(dict(points=names, dtypes=("bf16",))
                                              for names in (points, quick)))


#: ``--preset ragged``: the forward's and the backward's benchmark over :data:`RAGGED_POINTS`
#: (decode takes no ragged problem).
RAGGED_PRESETS = {
    "forward": _ragged_of(PRESETS["forward"], tuple(RAGGED_POINTS), _RAGGED_QUICK),
    "backward": _ragged_of(PRESETS["backward"], _RAGGED_BACKWARD, _RAGGED_BACKWARD_QUICK),
}


# -- the paged preset (issue 34) ------------------------------------------------------------------

def _paged_point(batch: int, longest: int, page_size: int, heads: tuple[int, int] = (32, 8),
                 head_dim: int = 128) -> dict[str, Any]:
    return dict(batch=batch, longest=longest, page_size=page_size, heads_q=heads[0],
                heads_kv=heads[1], head_dim=head_dim)


#: The paged decode buckets of the shipped table (``scripts/tune_paged_shipped.py``'s
#: ``BUCKETS``; all but ``dtype``), by name: a decode step (one query row per entry, causal,
#: bottom-right) of Llama-shaped heads (H 32/8, D 128) over a paged K/V cache, ``batch``
#: entries whose longest cache has ``longest`` keys, in pages of ``page_size`` tokens. A point
#: is timed as its bucket (``paged_problem``: batch and longest cache rounded up to powers of
#: two, the page size exact); the decode family's paged case holds caches of 1, 3/4, 1/2 and
#: 1/4 of the longest in shuffled pages, as a continuous batch mixes them.
PAGED_POINTS = {
    "b16-32k-page64": _paged_point(16, 32768, 64),
    "b64-32k-page64": _paged_point(64, 32768, 64),
    "b32-16k-page64": _paged_point(32, 16384, 64),
    "b16-32k-page16": _paged_point(16, 32768, 16),
}
_PAGED_QUICK = ("b16-32k-page64", "b16-32k-page16")


def _powers_of_two(flag: str, text: Any, what: str) -> tuple[int, ...]:
    """Positive integers that are powers of two: a paged point is its lookup bucket, whose
    ``what`` is rounded up to one, so another value would be measured as the next power."""
    values = parse_int_list(flag, text)
    for v in values:
        if v & (v - 1):
            up = 1 << v.bit_length()
            raise BenchConfigError(f"{flag}: {v} is not a power of two; a paged point is its "
                                   f"lookup bucket, whose {what} is rounded up to a power of "
                                   f"two, so {v} would be measured as {up}: give {up}")
    return values


def _page_sizes(text: Any) -> tuple[int, ...]:
    """Page sizes the paged kernels take (``Problem.page_size``'s rule)."""
    from tiledattention import Problem

    values = parse_int_list("--page-sizes", text)
    for v in values:
        try:
            Problem(batch=1, heads_q=1, heads_kv=1, seqlen_q=1, seqlen_k=1, head_dim=64,
                    dtype="bf16", causal=False, ragged=True, page_size=v)
        except InputValueError as exc:
            raise BenchConfigError(f"--page-sizes: {v} is not supported: {exc}") from None
    return values


def _paged_grid(preset: "Preset", o: Mapping[str, Any], base: Mapping[str, Any]) -> list:
    """The buckets of the preset's named points (``base["points"]``), ordered dtype, point,
    batch, longest cache, page size; ``--batch``, ``--seqlens-k`` (the longest cache) and
    ``--page-sizes`` put every point at each value given (powers of two for the first two: the
    bucket's), ``--dtypes`` in each dtype; a bucket two points share is measured once."""
    from tiledattention.tooling import ragged_problem

    dtypes = _option(o, base, "dtypes", lambda v: _dtypes(preset, v))
    batches = None if o.get("batch") is None else _powers_of_two(
        "--batch", o["batch"], "entry count")
    longest = None if o.get("seqlens_k") is None else _powers_of_two(
        "--seqlens-k", o["seqlens_k"], "longest cache")
    pages = None if o.get("page_sizes") is None else _page_sizes(o["page_sizes"])
    seen: dict[Any, None] = {}
    for dtype, name in product(dtypes, base["points"]):
        point = PAGED_POINTS[name]
        for b, n, page in product(batches or (point["batch"],), longest or (point["longest"],),
                                  pages or (point["page_size"],)):
            try:
                problem = ragged_problem(
                    sequences=b, tokens_q=b, longest_q=1, longest_k=n,
                    heads_q=point["heads_q"], heads_kv=point["heads_kv"],
                    head_dim=point["head_dim"], dtype=dtype, causal=True, bottom_right=True,
                    page_size=page)
            except UnsupportedProblemError as exc:
                raise BenchConfigError(f"--preset paged: point {name} at B {b}, longest cache "
                                       f"{n}, pages of {page} is not a problem the kernels "
                                       f"take: {exc}") from None
            seen.setdefault(_problem(preset, "--preset paged/--batch/--seqlens-k/--page-sizes",
                                     problem.to_dict()))
    return list(seen)


def _paged_of(preset: Preset, points: tuple[str, ...], quick: tuple[str, ...]) -> Preset:
    """``preset``'s family (decode), timing and copy-rate ceiling over the named paged points;
    tiledattention's contenders are the lookup's schedule and the default (no other family
    reads a paged cache)."""
    return dataclasses.replace(preset, options=("batch", "seqlens_k", "page_sizes", "dtypes"),
                               build=_paged_grid, also=(), target=None,
                               defaults=tuple(dict(points=names, dtypes=("bf16",))
                                              for names in (points, quick)))


#: ``--preset paged``: the decode family's benchmark over :data:`PAGED_POINTS` (the forward
#: and backward read no paged cache: chunked prefill gathers the pages first).
PAGED_PRESETS = {"decode": _paged_of(PRESETS["decode"], tuple(PAGED_POINTS), _PAGED_QUICK)}
# -- the FP8 preset (issue 52) --------------------------------------------------------------------

#: Model-shaped FP8 calls (all but ``dtype``), by name: e4m3 prefill of Llama-3-8B (H 32/8),
#: Qwen2.5-7B (H 28/4), Mistral-7B, Llama-3-70B's tensor-parallel slice (H 8/1) and Gemma-2's
#: D 256 layers, causal and full; decode steps over an e4m3 K/V cache under bf16 queries
#: (``kv_dtype``) at batch 1 and in batches. Contenders: ours, and torch's backends on the
#: dequantised values in bf16 (the family case's ``baselines``).
FP8_POINTS = {
    "llama3-8b-8k": _point(1, (32, 8), 8192, 128),
    "qwen2.5-7b-4k": _point(4, (28, 4), 4096, 128),
    "mistral-7b-2k": _point(8, (32, 8), 2048, 128),
    "llama3-70b-tp8-16k": _point(1, (8, 1), 16384, 128),
    "gemma2-d256-8k": _point(2, (16, 8), 8192, 256),
    "qwen2.5-7b-8k-full": _point(1, (28, 4), 8192, 128, causal=False),
    "decode-fp8-cache-32k": dict(_point(1, (32, 8), 1, 128, seqlen_k=32768, causal=False),
                                 kv_dtype="e4m3"),
    "decode-fp8-cache-b32-4k": dict(_point(32, (32, 8), 1, 128, seqlen_k=4096, causal=False),
                                    kv_dtype="e4m3"),
    "decode-fp8-cache-b64-2k": dict(_point(64, (28, 4), 1, 128, seqlen_k=2048, causal=False),
                                    kv_dtype="e4m3"),
}
_FP8_PREFILL = tuple(n for n in FP8_POINTS if not n.startswith("decode"))
_FP8_DECODE = tuple(n for n in FP8_POINTS if n.startswith("decode"))
#: ``--preset fp8``: e4m3 prefill (``--kernel forward``) and decode over an e4m3 cache
#: (``--kernel decode``).
FP8_PRESETS = {
    "forward": _variants_of(PRESETS["forward"], _FP8_PREFILL, _FP8_PREFILL[:2],
                            table=FP8_POINTS, dtypes=("e4m3",)),
    "decode": _variants_of(PRESETS["decode"], _FP8_DECODE, _FP8_DECODE[:1],
                           table=FP8_POINTS),
}
#: The grids ``--preset`` names, each a preset per family (``--kernel``).
GRID_PRESETS = {"default": PRESETS, "variants": VARIANT_PRESETS, "ragged": RAGGED_PRESETS,
                "paged": PAGED_PRESETS, "fp8": FP8_PRESETS}
#: Why a ``--preset`` has no grid for some families (added to the refusal).
_NO_GRID_WHY = {"paged": "a paged K/V cache is read by the decode family's kernels (one "
                         "query row per entry); give --kernel decode",
                "ragged": "--kernel decode has --preset paged (decode steps over a paged "
                          "K/V cache)",
                "fp8": "FP8 has no backward pass (train in bf16)"}


@dataclass(frozen=True)
class Grid:
    """The problems of one family to measure, and the contenders to time (each at the problems
    it applies to: :meth:`contenders_at`); ``preset_name``: the ``--preset`` it came from."""

    kernel: str
    problems: tuple
    contenders: tuple[str, ...]
    preset_name: str = "default"

    @property
    def preset(self) -> Preset:
        return GRID_PRESETS[self.preset_name][self.kernel]

    def contenders_at(self, problem: Any) -> tuple[str, ...]:
        """The grid's contenders that run at ``problem``: all of them at a plain problem but
        the variant, ragged and paged contenders; tiledattention's and the variant contenders
        (those that can take it) at a variant problem, tiledattention's and the ragged
        contenders (those that can take it) at a ragged one, tiledattention's and the paged
        contenders at a paged one (``_variants.applies``)."""
        return tuple(name for name in self.contenders if applies(name, problem))


def _owner(option: str) -> str:
    owners = [name for name, preset in PRESETS.items() if option in preset.options]
    also = f"; the {' and '.join(owners[1:])} grid takes it too" if owners[1:] else ""
    return f"{owners[0]} grid (--kernel {owners[0]}{also})"


def _other_grids(option: str) -> str:
    """The ``--preset`` grids (not the default ones) that take ``option``."""
    return " or ".join(f"--preset {grid} (--kernel {', '.join(takers)})"
                       for grid, presets in GRID_PRESETS.items() if grid != "default"
                       if (takers := [k for k, p in presets.items() if option in p.options]))


def _preset_of(kernel: str, name: Any) -> Preset:
    """The preset ``--preset name`` gives ``--kernel kernel``."""
    if not isinstance(name, str) or name.strip().lower() not in GRID_PRESETS:
        raise BenchConfigError(f"--preset: unknown preset {name!r}; expected "
                               f"{' or '.join(GRID_PRESETS)}")
    presets = GRID_PRESETS[name.strip().lower()]
    if kernel not in presets:
        why = _NO_GRID_WHY.get(name.strip().lower())
        raise BenchConfigError(f"--preset {name}: no such grid for --kernel {kernel} (it has "
                               f"{', '.join(presets)})" + (f": {why}" if why else ""))
    return presets[kernel]


def build_grid(kernel: str = "forward", *, quick: bool = False,
               contenders: str | Sequence[str] | None = None,
               problems: Sequence[Mapping[str, Any]] | None = None, preset: str = "default",
               **options: Any) -> Grid:
    """Validate option values (strings as typed, or parsed sequences; ``None``: the preset's
    default) into the :class:`Grid` of ``kernel``'s preset (``preset``: ``--preset``, the
    family's own grid, its ``variants``, its ``ragged`` or its ``paged`` buckets). An option of
    another family's grid (or one the variants, ragged or paged grid does not take) is refused,
    naming it;
    every problem is built, so a bad combination is reported here. ``problems``
    (``--problem``: dicts of the family's problem fields) replaces the grid: its problems are
    exactly those, in order, each once, and no grid option (nor another ``--preset``) may come
    with it. The contenders are the preset's, the variant, the ragged and the paged
    contenders that run at some problem of the grid, in table order."""
    chosen_preset = _preset_of(kernel, preset)
    name = preset.strip().lower()
    if problems is not None:
        if name != "default":
            raise BenchConfigError(f"--preset {preset} cannot go with --problem: both choose "
                                   f"the problems; drop one")
        _refuse_grid_options(kernel, options)
    for option, value in options.items():
        if option not in chosen_preset.options and value not in (None, False):
            flag = "--" + option.replace("_", "-")
            if name != "default":
                takes = ", ".join("--" + o.replace("_", "-") for o in chosen_preset.options)
                raise BenchConfigError(f"{flag} does not go with --preset {name}: its points "
                                       f"are fixed model shapes; it takes {takes}")
            if not any(option in p.options for p in PRESETS.values()):
                raise BenchConfigError(f"{flag} goes only with {_other_grids(option)}; the "
                                       f"default grids do not take it")
            raise BenchConfigError(f"{flag} belongs to the {_owner(option)}; it does nothing "
                                   f"with --kernel {kernel}")
    points = tuple(chosen_preset.build(chosen_preset, options, chosen_preset.defaults[bool(quick)])
                   if problems is None else _given(chosen_preset, problems))
    own = tuple(c for c in chosen_preset.contenders if c not in chosen_preset.peers)
    known = own + VARIANT_CONTENDERS + RAGGED_CONTENDERS + PAGED_CONTENDERS + chosen_preset.peers
    runs = tuple(c for c in known if any(applies(c, p) for p in points))
    chosen = runs
    if contenders is not None and _text(contenders).strip().lower() != "all":
        items = _items("--contenders", _text(contenders))
        bad = [item for item in items if item not in known]
        if bad:
            raise BenchConfigError(f"--contenders: unknown contender {bad[0]!r} for --kernel "
                                   f"{kernel}; known: {', '.join(runs)} (or 'all')")
        idle = [item for item in items if item not in runs]
        if idle:
            where = ("variant problems (a window, a softcap or sinks: --preset variants)"
                     if idle[0] in VARIANT_CONTENDERS else
                     "ragged problems (packed variable-length batches: --preset ragged)"
                     if idle[0] in RAGGED_CONTENDERS else
                     "paged problems (a paged K/V cache: --kernel decode --preset paged)"
                     if idle[0] in PAGED_CONTENDERS else "plain problems (no window, "
                     "softcap, sinks, ragged batch or paged cache)")
            raise BenchConfigError(f"--contenders: {idle[0]!r} runs only at {where}, and this "
                                   f"grid has none it takes; its contenders: {', '.join(runs)}")
        chosen = tuple(c for c in runs if c in items)  # canonical order
    return Grid(kernel, points, chosen, name)
