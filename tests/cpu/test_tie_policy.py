"""The tie rule (issue 18, item 5): finalists within the measured noise of the fastest resolve to
the simplest schedule (fewest fields off the family's default, then the schedule's canonical
JSON), whatever order the trials came in; a winner outside the noise is kept however complex."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random

import pytest

import db as dbmod
import search_spaces
from tests.cpu.toy_family import TOY, ToyProblem, ToySchedule
from tiledattention import FORWARD, Problem
from tiledattention.tooling import codecs
from tuner.measure import (TIE_REL_FLOOR, IsolatedExecutor, SimulatedExecutor, Timing,
                           tie_noise_ms, within_noise)
from tuner.search import SearchConfig, Tuner
from tuner.search._trials import correct_trials, pick_winner, simplicity

PROBLEM = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=True)
TOY_PROBLEM = ToyProblem(n=1024, dtype="bf16")


def timing(median_ms: float, spread_ms: float = 0.0, samples: int = 30) -> Timing:
    return Timing(median_ms=median_ms, spread_ms=spread_ms, mean_ms=median_ms,
                  min_ms=median_ms - spread_ms, samples=samples)


# -- the noise --------------------------------------------------------------------------------

def test_noise_is_the_half_width_of_a_difference_of_medians():
    a, b = timing(1.0, 0.02, 30), timing(1.0, 0.04, 120)
    se_a = 1.2533 * 0.02 / 1.349 / 30 ** 0.5
    se_b = 1.2533 * 0.04 / 1.349 / 120 ** 0.5
    assert tie_noise_ms(a, b) == pytest.approx(1.96 * (se_a ** 2 + se_b ** 2) ** 0.5)
    assert tie_noise_ms(timing(1.0), timing(2.0)) == 0.0  # no spread: no noise


@pytest.mark.parametrize("other, spread, tied", [
    (1.005, 0.0, True),    # under the 1% floor
    (1.0099, 0.0, True),
    (1.02, 0.0, False),    # 2% apart, no spread: a real difference
    (1.02, 0.2, True),     # 2% apart, IQR 20% over 30 samples: within the noise
    (1.10, 0.2, False),    # 10% apart: outside even that noise
], ids=["0.5%", "0.99%", "2%-quiet", "2%-noisy", "10%-noisy"])
def test_within_noise(other, spread, tied):
    assert within_noise(timing(1.0, spread), timing(other, spread)) is tied
    assert TIE_REL_FLOOR == 0.01


def test_the_floor_can_be_lowered():
    assert within_noise(timing(1.0), timing(1.005))
    assert not within_noise(timing(1.0), timing(1.005), rel_floor=0.001)


# -- simplicity -------------------------------------------------------------------------------

def test_simplicity_counts_fields_off_the_family_default():
    default = FORWARD.normalise(PROBLEM, FORWARD.default_schedule("sm_90", PROBLEM))
    one = FORWARD.normalise(PROBLEM, default.replace(exp2=not default.exp2))
    two = FORWARD.normalise(PROBLEM, one.replace(approx_div=not default.approx_div))
    assert [simplicity(FORWARD, "sm_90", PROBLEM, s)[0] for s in (default, one, two)] == [0, 1, 2]
    # the same value whether or not the schedule given was normalised
    assert simplicity(FORWARD, "sm_90", PROBLEM, FORWARD.default_schedule("sm_90", PROBLEM)) == \
        simplicity(FORWARD, "sm_90", PROBLEM, default)


def test_simplicity_is_generic_over_families():
    base = TOY.default_schedule("sm_90", TOY_PROBLEM)
    assert simplicity(TOY, "sm_90", TOY_PROBLEM, base)[0] == 0
    assert simplicity(TOY, "sm_90", TOY_PROBLEM, base.replace(unroll=4))[0] == 1
    assert simplicity(TOY, "sm_90", TOY_PROBLEM, ToySchedule(block=128, unroll=2))[0] == 2
    # the default depends on the architecture: block 32 is the default of sm_80
    assert simplicity(TOY, "sm_80", TOY_PROBLEM, ToySchedule(block=32))[0] == 0


# -- the winner -------------------------------------------------------------------------------

def toy(block: int, unroll: int) -> ToySchedule:
    return ToySchedule(block=block, unroll=unroll)


def test_a_tie_goes_to_the_simplest_whatever_the_order():
    timed = [(toy(128, 4), timing(1.000, 0.002)),  # fastest, two fields off the default
             (toy(128, 1), timing(1.004, 0.002)),  # one field off
             (toy(64, 1), timing(1.008, 0.002)),   # the default (block 64, unroll 1)
             (toy(32, 2), timing(1.300, 0.002))]   # clearly slower
    for order in itertools.permutations(timed):
        winner, winner_timing, tied = pick_winner(TOY, "sm_90", TOY_PROBLEM, list(order))
        assert winner == toy(64, 1) and winner_timing.median_ms == 1.008
        assert tied == [toy(64, 1), toy(128, 1), toy(128, 4)]  # simplest first


def test_a_clear_winner_is_kept_however_complex():
    timed = [(toy(64, 1), timing(1.05, 0.002)), (toy(128, 4), timing(1.00, 0.002)),
             (toy(128, 1), timing(1.03, 0.002))]
    for order in itertools.permutations(timed):
        winner, _, tied = pick_winner(TOY, "sm_90", TOY_PROBLEM, list(order))
        assert winner == toy(128, 4) and tied == [toy(128, 4)]


def test_equally_simple_ties_resolve_by_the_schedule_json():
    a, b = toy(32, 1), toy(128, 1)  # one field off each
    for order in ([(a, timing(1.0)), (b, timing(1.001))], [(b, timing(1.0)), (a, timing(1.001))]):
        winner, _, _ = pick_winner(TOY, "sm_90", TOY_PROBLEM, order)
        assert winner == min((a, b), key=lambda s: dbmod.canonical_json(s.to_dict()))


def test_noise_widens_the_tie_beyond_the_floor():
    quiet = [(toy(128, 4), timing(1.00, 0.001)), (toy(64, 1), timing(1.03, 0.001))]
    noisy = [(toy(128, 4), timing(1.00, 0.3)), (toy(64, 1), timing(1.03, 0.3))]
    assert pick_winner(TOY, "sm_90", TOY_PROBLEM, quiet)[0] == toy(128, 4)
    assert pick_winner(TOY, "sm_90", TOY_PROBLEM, noisy)[0] == toy(64, 1)


def test_no_timed_schedule_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        pick_winner(TOY, "sm_90", TOY_PROBLEM, [])


SCHEDULES = [toy(b, u) for b in (32, 64, 128) for u in (1, 2, 4)]


def random_timings(rng: random.Random) -> list[tuple[int, float, float]]:
    """1 to 9 distinct schedules (indices into SCHEDULES), each with a median in 0.9..1.1 ms and
    a spread in 0..0.05 ms."""
    chosen = rng.sample(range(len(SCHEDULES)), rng.randint(1, len(SCHEDULES)))
    return [(i, rng.uniform(0.9, 1.1), rng.uniform(0.0, 0.05)) for i in chosen]


@pytest.mark.parametrize("seed", range(60))
def test_property_the_winner_never_depends_on_the_order(seed):
    rng = random.Random(seed)
    items = random_timings(rng)
    timed = [(SCHEDULES[i], timing(ms, spread)) for i, ms, spread in items]
    winner, winner_timing, tied = pick_winner(TOY, "sm_90", TOY_PROBLEM, timed)
    fastest = min(t.median_ms for _, t in timed)
    # the winner is within the noise of the fastest and no tied schedule is simpler
    assert any(within_noise(t, winner_timing) for _, t in timed if t.median_ms == fastest)
    assert all(simplicity(TOY, "sm_90", TOY_PROBLEM, winner)
               <= simplicity(TOY, "sm_90", TOY_PROBLEM, s) for s in tied)
    for _ in range(5):
        shuffled = list(timed)
        rng.shuffle(shuffled)
        assert pick_winner(TOY, "sm_90", TOY_PROBLEM, shuffled) == (winner, winner_timing, tied)


# -- the study's order of correct trials --------------------------------------------------------

class _Trial:
    def __init__(self, number: int, key: str, value: float) -> None:
        self.number, self.value = number, value
        self.user_attrs = {"schedule_key": key, "status": "ok"}


class _Study:
    def __init__(self, trials) -> None:
        self._trials = trials

    def get_trials(self, deepcopy=False, states=None):
        return list(self._trials)


def test_correct_trials_of_equal_time_come_in_the_order_of_their_keys():
    trials = [_Trial(i, key, value) for i, (key, value) in
              enumerate([("c", 1.0), ("a", 1.0), ("b", 0.5), ("d", 2.0)])]
    orders = set()
    for permutation in itertools.permutations(trials):
        for i, t in enumerate(permutation):
            t.number = i  # the trial numbers follow the order they ran in
        orders.add(tuple(t.user_attrs["schedule_key"] for t in correct_trials(_Study(permutation))))
    assert orders == {("b", "a", "c", "d")}


# -- the driver stores the tie's simplest schedule ----------------------------------------------

FAST = ToySchedule(block=128, unroll=4)  # two fields off the toy default (block 64, unroll 1)
TOY_DEFAULT = TOY.default_schedule("sm_90", TOY_PROBLEM)


@dataclasses.dataclass
class DefaultNear(SimulatedExecutor):
    """A simulated GPU on which the toy family's :data:`FAST` takes 1 ms, its default ``ratio``
    ms, and every other schedule 1 + 0.1 ms per field off the default (a module-level class:
    the worker process unpickles it)."""

    ratio: float = 1.0

    def model_ms(self, problem, schedule):
        if schedule == FAST:
            return 1.0
        off = simplicity(self.family, self.arch, problem, schedule)[0]
        return self.ratio if off == 0 else 1.0 + 0.1 * off


@pytest.mark.slow  # spawns worker processes
@pytest.mark.parametrize("ratio, finalists, default_wins", [
    (1.004, 4, True),    # within the 1% floor: the default (0 fields off) is stored
    (1.008, 1, True),    # not a finalist, but measured correct and re-timed: it still competes
    (1.05, 4, False),    # 5% slower: the fastest schedule stays the winner
], ids=["tie", "tie-not-finalist", "clear-winner"])
def test_the_search_stores_the_simplest_of_a_tie(tmp_path, ratio, finalists, default_wins):
    space = search_spaces.space_for("toy", "sm_90", "full")
    candidates = list(space.feasible(TOY_PROBLEM))
    assert len(candidates) == 9 and DefaultNear(family=TOY, ratio=ratio).optimum(
        TOY_PROBLEM, candidates) == FAST
    factory = functools.partial(DefaultNear, family=TOY, ratio=ratio)
    with dbmod.ScheduleDB(tmp_path / "s.sqlite", codecs=codecs()) as store:
        tuner = Tuner(IsolatedExecutor(factory), family=TOY, arch="sm_90",
                      device_name="Simulated GPU", db=store,
                      storage_url=f"sqlite:///{tmp_path}/studies.sqlite",
                      config=SearchConfig(n_trials=9, patience=None, lookahead=1,
                                          finalists=finalists))
        with tuner.executor:
            result = tuner.tune(TOY_PROBLEM)
        stored = store.get("toy", "sm_90", "Simulated GPU", TOY_PROBLEM)
    assert result.measured == 9  # every schedule once (brute force)
    if default_wins:
        assert result.best == TOY_DEFAULT and stored.schedule == TOY_DEFAULT
        assert result.tied == [TOY_DEFAULT, FAST]
        # the stored time is the default's own re-timing, not the fastest's
        assert stored.median_ms == result.timings["best"].median_ms > 1.0
    else:
        assert result.best == FAST and stored.schedule == FAST
        assert result.tied == [FAST] and stored.median_ms < 1.01


@pytest.mark.slow  # spawns worker processes
def test_a_default_outside_the_searched_space_is_checked_and_competes(tmp_path):
    """A default the space cannot express is never a trial; the search checks it at the end
    and stores it when it is the fastest (a row slower than the default would make sdpa slower
    than having no row)."""
    def narrow(arch):  # block 64, the sm_90 default's, is not searched
        return search_spaces.SearchSpace(arch, {"block": (32, 128), "unroll": (1, 2, 4)},
                                         ToySchedule())

    search_spaces.register_space(search_spaces.FamilySpace(
        "toy", {**search_spaces.family_space("toy").spaces, "narrow": narrow}))
    try:
        factory = functools.partial(DefaultNear, family=TOY, ratio=0.9)  # the default: 0.9 ms
        with dbmod.ScheduleDB(tmp_path / "s.sqlite", codecs=codecs()) as store:
            tuner = Tuner(IsolatedExecutor(factory), family=TOY, arch="sm_90",
                          device_name="Simulated GPU", db=store,
                          storage_url=f"sqlite:///{tmp_path}/studies.sqlite",
                          config=SearchConfig(n_trials=6, patience=None, lookahead=1,
                                              space="narrow"))
            with tuner.executor:
                result = tuner.tune(TOY_PROBLEM)
            stored = store.get("toy", "sm_90", "Simulated GPU", TOY_PROBLEM)
    finally:
        search_spaces.register_space(TOY_SPACE_BEFORE)
    assert result.measured == 6 and TOY_DEFAULT not in narrow("sm_90")
    assert result.best == TOY_DEFAULT and stored.schedule == TOY_DEFAULT
    assert stored.median_ms == pytest.approx(0.9, rel=0.05)


TOY_SPACE_BEFORE = search_spaces.family_space("toy")
