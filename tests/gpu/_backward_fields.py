"""A GPU test's way to make every ragged backward run given schedule fields."""

from __future__ import annotations

from tiledattention.kernels.backward import _family
from tiledattention.kernels.backward._launch import normalise


def force_backward_fields(monkeypatch, **fields) -> list:
    """Every backward plan the family makes (``varlen_attn``'s ragged backward asks for one
    each call) runs the schedule its lookup gave with ``fields`` replaced; returns the list
    each plan's ``(problem, normalised schedule)`` is appended to, for the test to check that
    the fields took effect."""
    plain = _family.launches
    plans = []

    def forced(problem, schedule, scale):
        schedule = schedule.replace(**fields)
        plans.append((problem, normalise(problem, schedule)))
        return plain(problem, schedule, scale)
    monkeypatch.setattr(_family, "launches", forced)
    return plans
