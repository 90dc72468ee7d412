"""The lookup's nearest step, tested directly: the nearest of several rows answers whatever
their order and times, equal distances go to the faster row (``tiledattention.core._lookup``'s
docstring: "ties go to the faster row"), and a row at exactly ``Family.nearest_limit`` answers
while one just beyond it does not (the family's default does).

The forward family's metric: |log2 S_q - log2 S_q'| + |log2 S_k - log2 S_k'| +
0.5 |log2(B H_q) - log2(B' H_q')|, limit 1.0. Distances below are exact in binary floating
point (powers of two), so "exactly at the limit" is exactly at it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

import db
from tiledattention import BACKWARD, DECODE, FORWARD, DeviceInfo, Problem, Schedule
from tiledattention.tooling import Resolver, codecs, current_provenance, pick

DEVICE = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
TARGET = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                 dtype="bf16", causal=True)
#: each row's default time over its own: it beat the default, so it may transfer
GAIN = 1.2
#: one schedule per row, so the answer names the row
SCHEDULES = [Schedule(tile_m=m, tile_n=n, occupancy=o)
             for m, n, o in itertools.product((64, 128), (32, 64, 128), (1, 2))]


def near(**changes) -> Problem:
    return dataclasses.replace(TARGET, **changes)


def row(problem: Problem, schedule: Schedule, ms: float = 1.0, *,
        device: str = DEVICE.name, backend: str = "gpu") -> db.ScheduleRow:
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, backend=backend,
                          problem=problem, schedule=schedule, median_ms=ms, spread_ms=0.01,
                          tflops=100.0, trials=5, provenance=current_provenance(FORWARD),
                          default_ms=ms * GAIN)


def resolve(rows, *, shipped=()) -> tuple[str, Schedule]:
    """The resolver's answer for TARGET with ``rows`` in a user table and ``shipped`` in the
    shipped one."""
    def table(found, source):
        return db.RowTable(list(found), source=source, codecs=codecs()) if found else None

    resolver = Resolver(open_user=lambda: table(rows, "user"),
                        open_shipped=lambda arch: table(shipped, "shipped"))
    answer = resolver(FORWARD, TARGET, DEVICE)
    return answer.source, answer.schedule


# -- the metric ---------------------------------------------------------------------------------
def test_the_forward_metric_and_limit_are_what_the_code_says():
    assert FORWARD.nearest_limit == 1.0
    assert FORWARD.distance(near(seqlen_q=8192), TARGET) == 1.0
    assert FORWARD.distance(near(seqlen_q=2048, seqlen_k=8192), TARGET) == 2.0
    assert FORWARD.distance(near(batch=16), TARGET) == 1.0  # B·H: 4x, weight 0.5
    assert FORWARD.distance(near(batch=1, seqlen_q=8192), TARGET) == 2.0
    assert FORWARD.distance(TARGET, TARGET) == 0.0
    # symmetric
    assert FORWARD.distance(TARGET, near(seqlen_k=1024)) == FORWARD.distance(
        near(seqlen_k=1024), TARGET) == 2.0


def test_other_families_have_no_limit():
    assert DECODE.nearest_limit == math.inf and BACKWARD.nearest_limit == math.inf


@pytest.mark.parametrize("stored, answers", [
    (near(seqlen_q=8192), True),  # exactly 1.0
    (near(batch=16), True),  # exactly 1.0 from the B·H term
    (near(seqlen_q=2048), True),
    (near(seqlen_q=8200), False),  # 1.0014
    (near(batch=17), False),  # 1.0437
    (near(seqlen_q=4097, batch=16), False),  # 1.00035
    (near(heads_kv=4), False),  # another GQA group: not comparable at any distance
], ids=["sq-x2", "bh-x4", "sq-half", "sq-8200", "b-17", "sq-4097-bh-x4", "other-gqa"])
def test_near_enough_is_the_limit_inclusive(stored, answers):
    assert FORWARD.near_enough(stored, TARGET) is answers


# -- pick: steps 1, 2 and 4 over one source's rows -------------------------------------------
def test_the_nearest_of_several_rows_wins_whatever_their_order_and_times():
    rows = [row(near(seqlen_q=8192), SCHEDULES[0], ms=0.1),  # 1.0, fastest
            row(near(seqlen_q=2048, batch=8), SCHEDULES[1], ms=5.0),  # 1.5 -> out of limit
            row(near(batch=8), SCHEDULES[2], ms=3.0),  # 0.5: the nearest, slowest of the near
            row(near(seqlen_k=8192), SCHEDULES[3], ms=0.2)]  # 1.0
    for order in itertools.permutations(rows):
        found = pick(FORWARD, order, TARGET, DEVICE.name)
        assert found is not None and found[1] == "nearest"
        assert found[0].schedule == SCHEDULES[2]


@pytest.mark.parametrize("faster_first", [True, False])
def test_equal_distances_go_to_the_faster_row(faster_first):
    faster = row(near(seqlen_q=8192), SCHEDULES[0], ms=0.5)  # 1.0
    slower = row(near(seqlen_q=2048), SCHEDULES[1], ms=0.6)  # 1.0
    rows = [faster, slower] if faster_first else [slower, faster]
    assert pick(FORWARD, rows, TARGET, DEVICE.name) == (faster, "nearest")


def test_a_row_at_exactly_the_limit_answers_and_one_just_beyond_does_not():
    at = row(near(seqlen_q=8192), SCHEDULES[0])
    beyond = row(near(seqlen_q=8200), SCHEDULES[1], ms=0.01)
    assert pick(FORWARD, [at, beyond], TARGET, DEVICE.name) == (at, "nearest")
    assert pick(FORWARD, [beyond], TARGET, DEVICE.name) is None


def test_exact_rows_come_before_any_nearer_looking_row():
    other_gpu = row(TARGET, SCHEDULES[0], ms=0.9, device="NVIDIA H200")
    this_gpu = row(TARGET, SCHEDULES[1], ms=1.0)
    neighbour = row(near(batch=8), SCHEDULES[2], ms=0.1)
    assert pick(FORWARD, [neighbour, other_gpu, this_gpu], TARGET, DEVICE.name) == (
        this_gpu, "exact-device")
    assert pick(FORWARD, [neighbour, other_gpu], TARGET, DEVICE.name) == (other_gpu, "exact-arch")


def test_a_simulated_row_never_answers():
    simulated = row(near(batch=8), SCHEDULES[0], ms=0.01, backend="simulated")
    measured = row(near(seqlen_q=8192), SCHEDULES[1], ms=1.0)
    assert pick(FORWARD, [simulated], TARGET, DEVICE.name) is None
    assert pick(FORWARD, [simulated, measured], TARGET, DEVICE.name) == (measured, "nearest")


# -- the resolver: the same rules over the user database and the shipped table ---------------
def test_the_resolver_takes_the_nearest_row_of_either_source():
    user = [row(near(seqlen_q=8192), SCHEDULES[0], ms=0.1)]  # 1.0
    shipped = [row(near(batch=8), SCHEDULES[1], ms=9.0)]  # 0.5
    assert resolve(user, shipped=shipped) == ("nearest", SCHEDULES[1])
    assert resolve(shipped, shipped=user) == ("nearest", SCHEDULES[1])


@pytest.mark.parametrize("faster_in", ["user", "shipped"])
def test_the_resolver_gives_a_tie_across_sources_to_the_faster_row(faster_in):
    faster = [row(near(seqlen_q=8192), SCHEDULES[0], ms=0.5)]
    slower = [row(near(seqlen_k=8192), SCHEDULES[1], ms=0.6)]
    user, shipped = (faster, slower) if faster_in == "user" else (slower, faster)
    assert resolve(user, shipped=shipped) == ("nearest", SCHEDULES[0])


def test_the_resolver_answers_at_the_limit_and_defaults_beyond_it():
    assert resolve([row(near(seqlen_q=8192), SCHEDULES[0])]) == ("nearest", SCHEDULES[0])
    assert resolve([], shipped=[row(near(seqlen_k=8192), SCHEDULES[1])]) == ("nearest",
                                                                           SCHEDULES[1])
    default = FORWARD.default_schedule("sm_90", TARGET)
    assert resolve([row(near(seqlen_q=8200), SCHEDULES[0])]) == ("default", default)
    assert resolve([], shipped=[row(near(seqlen_k=8200), SCHEDULES[1])]) == ("default", default)


def test_the_resolver_finds_the_nearest_among_many_rows_of_a_database(tmp_path):
    """More rows in the bucket than the database hands the lookup (8): the nearest is still
    among them, wherever it was inserted."""
    sizes = [256, 512, 1024, 2048, 16384, 32768, 65536, 131072]  # farther in S_q
    rows = [row(near(seqlen_q=s, seqlen_k=s), SCHEDULES[i], ms=0.01) for i, s in enumerate(sizes)]
    rows.insert(4, row(near(seqlen_q=8192), SCHEDULES[8], ms=2.0))  # 1.0: the nearest
    rows += [row(near(seqlen_q=s), SCHEDULES[9 + i], ms=0.01) for i, s in enumerate((512, 256))]
    path = tmp_path / "s.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        for r in rows:
            store.put(r)
    resolver = Resolver(open_user=lambda: db.ScheduleDB.open_for_lookup(str(path),
                                                                         codecs=codecs()),
                        open_shipped=lambda arch: None)
    answer = resolver(FORWARD, TARGET, DEVICE)
    assert (answer.source, answer.schedule) == ("nearest", SCHEDULES[8])
    assert "8192" in answer.detail
