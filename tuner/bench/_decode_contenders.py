"""The contenders of ``tiledtune bench --kernel decode`` (``DECODE_CONTENDERS``).

Ours: ``tiledattention`` is ``tiledattention.sdpa`` as a user calls it (it picks the family by
the shape, then looks the schedule up); ``tiledattention-default`` passes the decode family's
per-architecture default schedule explicitly; ``tiledattention-forward`` passes the forward
family's looked-up schedule explicitly (what the dispatch buys over running the prefill kernel).
PyTorch's: ``F.scaled_dot_product_attention`` with one backend pinned (grouped-query through
``enable_gqa=True``, bottom-right causal through ``causal_lower_right``); a backend that cannot
run a point raises, and the point records it as unavailable with torch's reason.
tiledattention is imported where it is used, so a family that is missing makes its contenders
unavailable rather than the module unimportable.
"""

from __future__ import annotations

from ._contenders import Contender, Prepared, torch_sdpa
from ._decode_grid import DECODE_CONTENDERS, DecodePoint

__all__ = ["make_decode_contenders"]


def _family_of(schedule) -> str:
    import tiledattention

    if isinstance(schedule, tiledattention.Schedule):
        return "forward"
    decode_type = getattr(tiledattention, "DecodeSchedule", None)
    if decode_type is not None and isinstance(schedule, decode_type):
        return "decode"
    return type(schedule).__name__


def _dispatched(q, k, v, point: DecodePoint, arch: str) -> Prepared:
    from tiledattention import explain, sdpa

    causal = point.causal_arg
    schedule = source = ""
    detail = "timed: tiledattention.sdpa with no schedule (dispatch + lookup)"
    try:  # what explain() says the call runs; the timing does not depend on it
        resolution = explain(q, k, v, causal)
    except Exception as exc:  # noqa: BLE001 - an explain() that cannot say is no failure
        detail += f"; explain() failed: {type(exc).__name__}: {exc}"
    else:
        family = getattr(resolution, "family", "") or _family_of(resolution.schedule)
        schedule = f"{family}: {resolution.schedule.describe()}"
        source = resolution.source
        detail += f"; explain(): {resolution.detail}"
    return Prepared(lambda: sdpa(q, k, v, causal), schedule=schedule, lookup_source=source,
                    lookup_detail=detail)


def _decode_default(q, k, v, point: DecodePoint, arch: str) -> Prepared:
    from tiledattention import DECODE, sdpa

    schedule = DECODE.default_schedule(arch, point.problem)
    causal = point.causal_arg
    return Prepared(lambda: sdpa(q, k, v, causal, schedule=schedule),
                    schedule=f"decode: {schedule.describe()}", lookup_source="forced",
                    lookup_detail=f"DECODE.default_schedule({arch!r})")


def _forward_lookup(q, k, v, point: DecodePoint, arch: str) -> Prepared:
    from tiledattention import FORWARD, runtime, sdpa

    resolution = runtime().resolution(FORWARD, point.problem, q.device.index)
    schedule = resolution.schedule
    causal = point.causal_arg
    return Prepared(lambda: sdpa(q, k, v, causal, schedule=schedule),
                    schedule=f"forward: {schedule.describe()}",
                    lookup_source=resolution.source,
                    lookup_detail=f"FORWARD lookup: {resolution.detail}")


def make_decode_contenders() -> dict[str, Contender]:
    """Every decode-grid contender, by name (``DECODE_CONTENDERS`` order)."""
    table = {
        "tiledattention": Contender("tiledattention", _dispatched),
        "tiledattention-default": Contender("tiledattention-default", _decode_default),
        "tiledattention-forward": Contender("tiledattention-forward", _forward_lookup),
        "torch-cudnn": Contender("torch-cudnn", torch_sdpa("CUDNN_ATTENTION")),
        "torch-flash": Contender("torch-flash", torch_sdpa("FLASH_ATTENTION")),
        "torch-efficient": Contender("torch-efficient", torch_sdpa("EFFICIENT_ATTENTION")),
    }
    assert tuple(table) == DECODE_CONTENDERS
    return table
