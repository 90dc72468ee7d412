"""The backward family's search spaces on the CPU: registration, the named spaces per
architecture, tiles restricted to the problem, the shared-memory check, the simulated time
model, and ``tiledtune search --kernel backward`` (simulated and compile-only)."""

from __future__ import annotations

import itertools

import optuna
import pytest

import db
import search_spaces
from search_spaces import backward as space_module
from tiledattention import BACKWARD, BackwardSchedule, InputValueError, Problem
from tiledattention.tooling import codecs
from tuner.cli import main


def _problem(**changes) -> Problem:
    fields = dict(batch=2, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=False)
    fields.update(changes)
    return Problem(**fields)


_TILE_FIELDS = ("dkdv_tile_n", "dkdv_tile_m", "dq_tile_m", "dq_tile_n")


# -- registration and the named spaces ------------------------------------------------------------

def test_backward_space_is_registered_and_exported():
    assert search_spaces.family_space("backward") is search_spaces.BACKWARD_SPACE
    assert "BACKWARD_SPACE" in search_spaces.__all__
    assert search_spaces.BACKWARD_SPACE.model_ms is space_module.model_ms
    full = search_spaces.space_for("backward", "sm_90")
    compact = search_spaces.space_for("backward", "sm_90", "compact")
    assert full.size == 3 * 4 * 2 * 2 * 4 * 3 * 3 * 4 * 2 * 4 * 5 * 2 * 2 * 2 * 2 * 2
    assert compact.size == 2 * 2 * 6144 and set(compact.choices) < set(full.choices)
    assert isinstance(full.base, BackwardSchedule)
    with pytest.raises(InputValueError, match="space must be one of"):
        search_spaces.space_for("backward", "sm_90", "huge")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_full_space_holds_every_default(arch, head_dim):
    problem = _problem(head_dim=head_dim)
    full = search_spaces.space_for("backward", arch)
    default = BACKWARD.default_schedule(arch, problem)
    assert full.contains(default)
    assert full.infeasibility(arch, problem, default) is None
    if arch == "sm_90":
        assert search_spaces.space_for("backward", arch, "compact").contains(default)


def test_every_architecture_searches_the_same_candidates():
    """The compiler fits each kernel's pipeline to the SM, and the defaults off Hopper are
    Hopper's tiles: no architecture gets a cut-down space (shared memory prunes per problem)."""
    hopper = search_spaces.space_for("backward", "sm_90")
    for arch in ("sm_80", "sm_86", "sm_89", "sm_100", "sm_120"):
        assert search_spaces.space_for("backward", arch).choices == hopper.choices, arch


# -- restricted to the problem --------------------------------------------------------------------

@pytest.mark.parametrize("seqlen_q, seqlen_k", [(4096, 4096), (20, 20), (5, 5), (17, 1000),
                                                (1000, 40), (1, 113)])
def test_restricted_tiles_are_what_normalise_keeps(seqlen_q, seqlen_k):
    problem = _problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    full = search_spaces.space_for("backward", "sm_90")
    space = search_spaces.BACKWARD_SPACE.restrict(full, problem)
    caps = space_module.tile_caps(problem)
    for name in _TILE_FIELDS:
        assert max(space.choices[name]) <= caps[name]
        # no candidate that normalise keeps is lost
        kept = {getattr(BACKWARD.normalise(problem, full.base.replace(**{name: v})), name)
                for v in full.choices[name]}
        assert kept == set(space.choices[name]), name
    # every two-kernel point of the restricted space is its own normal form: nothing is timed
    # twice (a one-pass point normalises the dQ kernel's fields away: the search's repeats)
    for s in itertools.islice(space, 0, None, 97):
        if s.dq_mode == "kernel":
            assert BACKWARD.normalise(problem, s) == s


def test_restricted_caps_follow_each_sequence():
    space = search_spaces.BACKWARD_SPACE.restrict(search_spaces.space_for("backward", "sm_90"),
                                                  _problem(seqlen_q=20, seqlen_k=3000))
    assert space.choices["dkdv_tile_m"] == (16, 32) and space.choices["dq_tile_m"] == (32,)
    assert space.choices["dkdv_tile_n"] == (32, 64, 128)
    assert space.choices["dq_tile_n"] == (32, 64, 128)
    tiny = search_spaces.BACKWARD_SPACE.restrict(
        search_spaces.space_for("backward", "sm_90", "compact"), _problem(seqlen_q=3, seqlen_k=9))
    assert tiny.choices["dkdv_tile_m"] == tiny.choices["dq_tile_m"] == (16,)
    assert "dkdv_tile_n" not in tiny.choices  # not searched: the base's 64, normalised to 16
    assert BACKWARD.normalise(_problem(seqlen_q=3, seqlen_k=9), tiny.base).dkdv_tile_n == 16
    # one (head, query tile) pair, no causal mask: the dK/dV kernel's occupancies, worker
    # warps and Q/dO latencies, the dQ kernel's occupancies and worker warps, the 2 modes
    assert tiny.size == 2 * 2 * 3 * 2 * 2 * 2
    assert (tiny.choices["dkdv_splits"], tiny.choices["dq_heavy_first"]) == ((1,), (False,))
    gqa = search_spaces.BACKWARD_SPACE.restrict(
        search_spaces.space_for("backward", "sm_90", "compact"),
        _problem(heads_kv=4, seqlen_q=100, causal=True))  # group 4 x one 128-row tile
    assert gqa.choices["dkdv_splits"] == (1, 2, 4) and gqa.choices["tile_major"] == (
        False, True)
    assert gqa.choices["dq_pack_gqa"] == (False, True)  # a group of 4 a dQ tile holds
    big = search_spaces.space_for("backward", "sm_90")
    assert search_spaces.BACKWARD_SPACE.restrict(big, _problem(causal=True)).choices == {
        name: values for name, values in big.choices.items()
        if name not in ("split_d", "dq_pack_gqa")}  # no group of heads: nothing to pack
    # a head dim of two parts searches both forms; a power of two, one
    assert search_spaces.BACKWARD_SPACE.restrict(
        big, _problem(causal=True, head_dim=96, heads_kv=4)).choices == big.choices
    for d, split in ((72, True), (80, True), (96, True), (192, True), (64, False), (112, False)):
        assert ("split_d" in search_spaces.BACKWARD_SPACE.restrict(
            big, _problem(head_dim=d)).choices) == split


# -- static feasibility ---------------------------------------------------------------------------

def test_shared_memory_bound_is_one_streamed_tile_per_kernel():
    s = BackwardSchedule(dkdv_tile_n=128, dkdv_tile_m=64, dq_tile_m=128, dq_tile_n=32)
    assert space_module.smem_bytes(_problem(head_dim=128), s) == (2 * 128 * 64, 2 * 128 * 32)
    assert space_module.smem_bytes(_problem(head_dim=72), s) == (2 * 128 * 64, 2 * 128 * 32)


@pytest.mark.parametrize("arch", ["sm_86", "sm_90", "sm_120"])
def test_every_searched_candidate_fits_every_architecture(arch):
    """Measured: every schedule of these tiles compiled for sm_90 and sm_86 at D=256 (the
    compiler fits the pipeline to the SM), so the check must reject none of them."""
    space = search_spaces.space_for("backward", arch)
    # the check reads the two streamed tiles only (space_module.smem_bytes): every other
    # dimension fixed, the same verdicts in a thousandth of the points
    tiles = space.without(*(n for n in space.choices if n not in ("dkdv_tile_m", "dq_tile_n")))
    assert tiles.size == len(space.choices["dkdv_tile_m"]) * len(space.choices["dq_tile_n"])
    assert len(tiles.feasible(_problem(head_dim=256, seqlen_q=256, seqlen_k=256))) == \
        tiles.size


def test_tiles_past_the_shared_memory_are_rejected_naming_the_kernel():
    wide = _problem(head_dim=256)
    space = search_spaces.space_for("backward", "sm_86")
    dkdv = BackwardSchedule(dkdv_tile_m=256)  # one [256, 256] bf16 tile: 128 KiB > 99 KiB
    dq = BackwardSchedule(dq_tile_n=256)
    assert space.infeasibility("sm_86", wide, dkdv).startswith("dK/dV kernel: shared memory")
    assert space.infeasibility("sm_86", wide, dq).startswith("dQ kernel: shared memory")
    assert "99 KiB per SM on sm_86" in space.infeasibility("sm_86", wide, dq)
    assert space.infeasibility("sm_90", wide, dkdv) is None


# -- the simulated time model ---------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_model_leaves_the_search_something_to_find(head_dim):
    problem = _problem(head_dim=head_dim)
    compact = search_spaces.BACKWARD_SPACE.restrict(
        search_spaces.space_for("backward", "sm_90", "compact"), problem)
    times = sorted(space_module.model_ms(problem, s) for s in compact.feasible(problem))
    default = BACKWARD.default_schedule("sm_90", problem)
    assert 0 < times[0] < times[1]  # one best point
    assert times[0] < space_module.model_ms(problem, default) < times[-1]
    assert space_module.model_ms(problem, default) == space_module.model_ms(problem, default)


def test_model_follows_the_probe_on_occupancy_and_worker_warps():
    small = BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64)
    assert space_module.model_ms(_problem(), small.replace(dkdv_occupancy=2)) < \
        space_module.model_ms(_problem(), small)
    wide = _problem(head_dim=256)  # two [64, 256] float32 accumulators: 8 warps pay
    assert space_module.model_ms(wide, small.replace(dkdv_worker_warps=8)) < \
        space_module.model_ms(wide, small) / 1.5


def test_model_counts_work_spills_and_idle_sms():
    s = BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64)
    full, causal = _problem(), _problem(causal=True)
    assert space_module.model_ms(causal, s) < space_module.model_ms(full, s)
    wide = _problem(head_dim=256)
    # two float32 [128, 256] accumulators spill; [64, 256] ones do not
    assert space_module.model_ms(wide, s.replace(dkdv_tile_n=128)) > \
        1.5 * space_module.model_ms(wide, s)
    # one head of 1024 keys fills 8 of 132 SMs with 128-key tiles, 16 with 64-key tiles
    few = _problem(batch=1, heads_q=1, heads_kv=1, seqlen_q=1024, seqlen_k=1024)
    assert space_module.model_ms(few, s.replace(dkdv_tile_n=128)) > \
        space_module.model_ms(few, s)


# -- tiledtune search --kernel backward ------------------------------------------------------------

def test_simulated_search_stores_a_normalised_backward_row(tmp_path):
    store = tmp_path / "sim.sqlite"
    assert main(["search", "--kernel", "backward", "--device", "sm_90", "--backend",
                 "simulated", "--shape", "2,8,1000,64", "--causal", "yes", "--trials", "8",
                 "--space", "compact",
                 "--db", str(store)]) == 0
    with db.ScheduleDB.open_for_lookup(store, codecs=codecs()) as database:
        (row,) = database.rows()
    problem = _problem(heads_q=8, heads_kv=8, seqlen_q=1000, seqlen_k=1000, head_dim=64,
                       causal=True)
    assert (row.family, row.backend, row.problem) == ("backward", "simulated", problem)
    assert isinstance(row.schedule, BackwardSchedule)
    assert BACKWARD.normalise(problem, row.schedule) == row.schedule
    assert search_spaces.space_for("backward", "sm_90").contains(row.schedule)


def test_a_search_reads_only_as_much_of_the_full_space_as_its_budget_needs():
    """The full backward space has 2.2 million points; a search of n trials walks until n + 1
    feasible distinct ones (a fraction of a second), not through all of them (40 s on this
    machine); a space its budget covers is still enumerated whole (brute force)."""
    import time

    from tuner.search._candidates import feasible

    problem = _problem(heads_q=8, heads_kv=2, seqlen_q=1000, seqlen_k=1000, head_dim=64,
                       causal=True)
    full = search_spaces.BACKWARD_SPACE.restrict(search_spaces.space_for("backward", "sm_90"),
                                                 problem)
    assert full.size > 2_000_000
    start = time.monotonic()
    some = feasible(BACKWARD, full, problem, at_most=8)
    assert time.monotonic() - start < 2.0
    assert len(some) == 9 and len({s.key for s in some}) == 9
    assert all(full.infeasibility("sm_90", problem, s) is None for s in some)
    compact = search_spaces.BACKWARD_SPACE.restrict(
        search_spaces.space_for("backward", "sm_90", "compact"), problem)
    every = feasible(BACKWARD, compact, problem)
    assert feasible(BACKWARD, compact, problem, at_most=len(every)) == every


def test_a_simulated_search_of_the_full_space_walks_only_its_budget(tmp_path, monkeypatch):
    from tuner.search import _driver

    walked = []

    def counting(family, space, problem, at_most=None):
        found = feasible(family, space, problem, at_most)
        walked.append(len(found))
        return found
    from tuner.search._candidates import feasible
    monkeypatch.setattr(_driver, "feasible", counting)
    store = tmp_path / "sim.sqlite"
    assert main(["search", "--kernel", "backward", "--device", "sm_90", "--backend",
                 "simulated", "--shape", "1,8,512,64", "--trials", "6", "--patience", "0",
                 "--db", str(store)]) == 0
    assert walked == [7]  # 6 trials: 7 feasible points say the budget does not cover it
    with db.ScheduleDB.open_for_lookup(store, codecs=codecs()) as database:
        (row,) = database.rows()
    assert search_spaces.space_for("backward", "sm_90").contains(row.schedule)


def test_compile_only_search_compiles_a_tiny_backward_problem(tmp_path, capsys):
    """Three candidates, two kernels each: about 5 s (so not marked slow)."""
    store = tmp_path / "schedules.sqlite"
    assert main(["search", "--kernel", "backward", "--device", "sm_90", "--compile-only",
                 "--problem", "batch=1,heads_q=2,heads_kv=1,seqlen_q=40,seqlen_k=40,"
                 "head_dim=64,dtype=bf16,causal=true", "--space", "compact", "--limit", "3",
                 "--jobs", "2", "--db", str(store)]) == 0
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())
    assert "compile-only for sm_90" in out and "B1 H2/1 S40 D64" in out
    # the tiles were restricted to the problem: the compact space's 64 points became 4 x 4
    studies = optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'tiledtune-studies.sqlite'}")
    assert len(studies) == 1 and "backward" in studies[0].study_name
    assert studies[0].n_trials == 0  # no failure was recorded


def test_model_rewards_splits_where_the_grid_leaves_sms_idle():
    mqa = _problem(batch=1, heads_q=8, heads_kv=1, seqlen_q=6144, seqlen_k=6144, causal=True)
    wide = _problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=8192, seqlen_k=8192)
    s = BACKWARD.default_schedule("sm_90", wide)
    assert s.dkdv_splits == 1
    assert space_module.model_ms(mqa, s.replace(dkdv_splits=8)) < space_module.model_ms(mqa, s)
    assert space_module.model_ms(wide, s.replace(dkdv_splits=8)) > space_module.model_ms(wide, s)
