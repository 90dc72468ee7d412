"""``Family.launch_ctas``: each kernel's CTAs in a build's order (``explain --resources``'s
waves), against the kernels a build records and the launchers' grids."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tiledattention import BACKWARD, DECODE, FORWARD, DecodeSchedule, Problem
from tiledattention.kernels.backward._launch import DELTA_TILE, SUM_TILE, launches
from tiledattention.kernels.forward._launch import grid_for, normalise
from tiledattention.tooling import capturing
from tuner import cli

SMS = 132
#: 80 rows over a short cache
ROWS = Problem(batch=10, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=1201, head_dim=128,
               dtype="bf16", causal=False)
PAGED = Problem(batch=5, heads_q=16, heads_kv=2, seqlen_q=1, seqlen_k=3000, head_dim=64,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)
DENSE = Problem(batch=2, heads_q=16, heads_kv=4, seqlen_q=1000, seqlen_k=1000, head_dim=128,
                dtype="bf16", causal=True)
CASES = {
    "decode-split3": (DECODE, ROWS, DecodeSchedule(splits=3, combine="block_pdl", tile_n=128)),
    "decode-one-split": (DECODE, ROWS, DecodeSchedule(tile_n=128)),
    "decode-longest-first": (DECODE, PAGED, DecodeSchedule(splits=4, longest_first=True)),
    "decode-flat": (DECODE, PAGED, DecodeSchedule(flat=True, occupancy=2)),
    "backward-split": (BACKWARD, DENSE, BACKWARD.default_schedule("sm_90", DENSE).replace(
        dkdv_splits=2)),
    "backward-one-pass": (BACKWARD, DENSE, BACKWARD.default_schedule("sm_90", DENSE).replace(
        dq_mode="atomic", dkdv_splits=1)),
    "forward-cluster": (FORWARD, DENSE, FORWARD.default_schedule("sm_90", DENSE).replace(
        num_ctas=2)),
}


@pytest.mark.parametrize("name", CASES)
def test_a_count_for_each_kernel_a_build_makes_in_its_order(name):
    family, problem, schedule = CASES[name]
    with capturing(compile=False) as builds:
        family.compile(problem, schedule, "sm_90")
    counts = family.launch_ctas(problem, schedule, SMS)
    assert len(counts) == len(builds) and all(n >= 1 for n in counts)


def test_the_counts_are_the_launchers_grids():
    # decode: 80 rows x 3 splits, then x 4 column chunks; the flat walk: a wave
    assert DECODE.launch_ctas(*CASES["decode-split3"][1:], SMS) == (240, 320)
    assert DECODE.launch_ctas(*CASES["decode-one-split"][1:], SMS) == (80,)
    assert DECODE.launch_ctas(PAGED, DecodeSchedule(flat=True, occupancy=2), SMS)[0] == 2 * SMS
    assert DECODE.launch_ctas(*CASES["decode-longest-first"][1:], SMS)[2] == 1  # 5 entries
    # backward: the plan's grids; one pass, the row kernels'
    _, problem, schedule = CASES["backward-one-pass"]
    plan = launches(problem, schedule, 0.1)
    rows = math.ceil(1000 / DELTA_TILE) * 2 * 16, math.ceil(1000 / SUM_TILE) * 2 * 16
    assert BACKWARD.launch_ctas(problem, schedule, SMS) == (math.prod(plan.dkdv_grid), *rows)
    # forward: a block of a cluster of two is two CTAs
    _, problem, schedule = CASES["forward-cluster"]
    blocks = math.prod(grid_for(problem, normalise(problem, schedule), SMS))
    assert FORWARD.launch_ctas(problem, schedule, SMS) == (2 * blocks,)


def test_a_ragged_batch_leaves_its_grids_to_the_call():
    ragged = dataclasses.replace(DENSE, ragged=True)
    for family in (FORWARD, BACKWARD):
        assert family.launch_ctas(ragged, family.default_schedule("sm_90", ragged), SMS) is None


def test_explain_shows_each_kernels_ctas_and_waves(capsys, tmp_path):
    argv = ["explain", "--device", "sm_90", "--device-name", "NVIDIA H200", "--kernel",
            "decode", "--shape", "10,32/8,1:1201,128", "--causal", "no",
            "--db", str(tmp_path / "none.sqlite"), "--resources"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 CTA an SM (limited by registers); 320 CTAs, 2.42 waves on 132 SMs" in out
    assert cli.main([*argv, "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["lookups"]
    assert [(k["ctas"], k["sms"]) for k in step["kernels"]] == [(240, SMS), (320, SMS)]
