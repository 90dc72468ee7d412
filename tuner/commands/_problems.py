"""The problems a ``tiledtune`` command names: ``--shape`` (``B,H,S,D`` or ``B,HQ/HKV,SQ:SK,D``),
``--preset``, ``--problem FIELD=VALUE,...`` with ``--dtype`` / ``--causal``, and the argparse types
of those flags (``search`` and ``explain`` share them)."""

from __future__ import annotations

import argparse
import itertools
import re
from typing import NamedTuple

from tiledattention import ARCHITECTURES, InputTypeError, InputValueError, get_family
from tiledattention.tooling import check_arch

from ..errors import UsageError

__all__ = ["PRESETS", "SHAPE_SYNTAX", "ShapeArg", "parse_shape", "parse_choices", "parse_arch",
           "parse_arch_list", "parse_duration", "parse_problem_fields", "problems_from", "shape_text"]

#: Model presets: name -> (heads_q, heads_kv, head_dim, seqlens); batch = 16384 // seqlen.
PRESETS = {
    "llama-gqa": (32, 8, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d64": (32, 32, 64, (1024, 2048, 4096, 8192, 16384)),
    "mha-d128": (16, 16, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d256": (8, 8, 256, (1024, 2048, 4096, 8192, 16384)),
}


def parse_duration(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    seconds = (float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
               if match else 0.0)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a duration above zero like 90s, 10m or 1h; "
                                         f"got {text!r}")
    return seconds


class ShapeArg(NamedTuple):
    """One ``--shape``: ``heads_kv`` / ``seqlen_k`` are ``None`` where the text left them out
    (then they equal ``heads_q`` / ``seqlen_q``)."""

    text: str
    batch: int
    heads_q: int
    heads_kv: int | None
    seqlen_q: int
    seqlen_k: int | None
    head_dim: int


SHAPE_SYNTAX = "B,H,S,D or B,HQ/HKV,SQ:SK,D"


def parse_shape(text: str) -> ShapeArg:
    """``B,H,S,D``; ``H`` may be ``HQ/HKV`` (grouped-query: HKV K/V heads) and ``S`` may be
    ``SQ:SK`` (SQ queries against SK keys): ``4,32/8,4096,128``, ``1,16,1:4096,128``."""
    def number(part: str) -> int | None:
        part = part.strip()
        return int(part) if re.fullmatch(r"\d{1,30}", part) and int(part) >= 1 else None

    parts = text.split(",")
    if len(parts) == 4:
        hq, *hkv = parts[1].split("/")
        sq, *sk = parts[2].split(":")
        values = [number(p) for p in (parts[0], hq, sq, parts[3], *hkv, *sk)]
        if len(hkv) <= 1 and len(sk) <= 1 and None not in values:
            b, hq_n, sq_n, d, *rest = values
            return ShapeArg(text=text.strip(), batch=b, heads_q=hq_n,
                            heads_kv=rest.pop(0) if hkv else None, seqlen_q=sq_n,
                            seqlen_k=rest.pop(0) if sk else None, head_dim=d)
    raise argparse.ArgumentTypeError(
        f"expected {SHAPE_SYNTAX} (positive integers; HQ/HKV for grouped-query heads, "
        f"SQ:SK for queries against a different number of keys, e.g. 4,32/8,4096,128 or "
        f"1,16,1:4096,128); got {text!r}")


def parse_choices(allowed: dict[str, object]):
    def parse(text: str) -> list:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma list of {sorted(allowed)}; got {text!r}")
        return [allowed[v] for v in values]
    return parse


def parse_arch(text: str) -> str:
    """An argparse type: an architecture tileiras knows (``sm_90``), for every option that
    names one (``search``/``explain``/``profile --device``, ``list``/``export --arch``); the
    runtime's ``check_arch`` decides. argparse puts the flag in front of the message:
    ``argument --arch: expected one of sm_80, ...; got 'sm_999'``."""
    try:
        return check_arch(text)
    except InputValueError:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(ARCHITECTURES)}; got {text!r}") from None


def parse_arch_list(text: str) -> list[str]:
    """An argparse type: comma-separated architectures (``sm_90,sm_121``), each as
    :func:`parse_arch` takes it."""
    return [parse_arch(arch.strip()) for arch in text.split(",")]


def parse_problem_fields(text: str) -> dict:
    """``"n=1024,dtype=bf16,causal=yes,softcap=30.0"`` -> ``{"n": 1024, "dtype": "bf16",
    "causal": True, "softcap": 30.0}``."""
    found = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise argparse.ArgumentTypeError(f"expected FIELD=VALUE,...; got {text!r}")
        if re.fullmatch(r"[+-]?\d+", value):
            found[name] = int(value)
        elif re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?", value):
            found[name] = float(value)  # softcap=30.0
        elif value.lower() in ("yes", "true", "no", "false"):
            found[name] = value.lower() in ("yes", "true")
        else:
            found[name] = value
    return found


def problems_from(args: argparse.Namespace) -> list:
    """The problems of ``--kernel`` the arguments name (validated by the family's problem
    type; a problem it refuses is a ``UsageError`` naming the flag that gave it)."""
    family = get_family(args.kernel)
    _check_deprecated(args)
    shapes: list[tuple[str, tuple[int, int, int, int, int, int]]] = []
    for shape in args.shape:
        hkv = shape.heads_kv or args.kv_heads or shape.heads_q
        sk = shape.seqlen_k or args.seqlen_k or shape.seqlen_q
        source = f"--shape {shape.text}" + "".join(
            f" {flag} {value}" for flag, value, given in (
                ("--kv-heads", args.kv_heads, shape.heads_kv),
                ("--seqlen-k", args.seqlen_k, shape.seqlen_k)) if value and not given)
        shapes.append((source,
                       (shape.batch, shape.heads_q, hkv, shape.seqlen_q, sk, shape.head_dim)))
    for name in args.preset:
        hq, hkv, d, seqlens = PRESETS[name]
        shapes += [(f"--preset {name}", (max(1, 16384 // s), hq, hkv, s, s, d)) for s in seqlens]
    if not shapes and not args.problem:
        raise UsageError(f"give at least one --shape {SHAPE_SYNTAX}, --preset or --problem")
    fields = [("--problem " + ",".join(f"{k}={v}" for k, v in data.items()), data)
              for data in args.problem]
    for (source, (b, hq, hkv, sq, sk, d)), dtype, causal in itertools.product(
            shapes, args.dtype, args.causal):
        fields.append((source, dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq,
                                    seqlen_k=sk, head_dim=d, dtype=dtype, causal=causal)))
    problems = []
    for source, data in fields:
        try:
            problems.append(family.problem_type.from_dict(data))
        except (InputTypeError, InputValueError) as exc:
            raise UsageError(f"{source}: not a problem the {family.name} kernel takes: "
                             f"{exc}") from None
    return list(dict.fromkeys(problems))


def _check_deprecated(args: argparse.Namespace) -> None:
    """``--kv-heads`` / ``--seqlen-k`` apply to exactly one ``--shape`` that does not give the
    value itself; anything else is ambiguous and refused."""
    for flag, value, part in (("--kv-heads", args.kv_heads, "heads_kv"),
                              ("--seqlen-k", args.seqlen_k, "seqlen_k")):
        if value is None:
            continue
        syntax = "B,HQ/HKV,S,D" if part == "heads_kv" else "B,H,SQ:SK,D"
        if len(args.shape) != 1:
            raise UsageError(
                f"{flag} {value} needs exactly one --shape (got {len(args.shape)}); it is "
                f"deprecated: give it in each --shape as {syntax}")
        shape = args.shape[0]
        if getattr(shape, part) is not None:
            raise UsageError(f"{flag} {value}: --shape {shape.text} gives it already; drop "
                             f"{flag}")


def shape_text(shape: ShapeArg, kv_heads: int | None, seqlen_k: int | None) -> str:
    """``--shape`` in the new syntax, with the deprecated flags' values folded in."""
    hkv = shape.heads_kv or kv_heads
    sk = shape.seqlen_k or seqlen_k
    return (f"{shape.batch},{shape.heads_q}{f'/{hkv}' if hkv else ''},"
            f"{shape.seqlen_q}{f':{sk}' if sk else ''},{shape.head_dim}")
