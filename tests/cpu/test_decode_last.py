"""``DecodeSchedule(combine="last")`` on the CPU: the split CTA that counts its row done last
merges it, so one kernel is built and launched; its constants, scratch (zeroed counters),
normalisation, builds for every architecture, and the sm_90 machine code of the merge
(device-scope loads after an acquire-release count, where cuobjdump is at hand)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiledattention import DECODE, Problem
from tiledattention.kernels.decode import _compile as decode_compile
from tiledattention.kernels.decode._launch import (COMBINE_BLOCK_VALUES, launches,
                                                   new_scratch, normalise, partial_shapes,
                                                   split_constants, split_kernel)

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
#: a B1 decode the sm_90 default splits 16 ways (group 4, D 128)
TOKEN = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=32768, head_dim=128,
                dtype="bf16", causal=False)
#: group 7 (not a power of two), 3 query positions, D padded to 128, bottom-right, sinks
ODD = Problem(batch=2, heads_q=28, heads_kv=4, seqlen_q=3, seqlen_k=9000, head_dim=96,
              dtype="bf16", causal=True, bottom_right=True, sinks=True)


def _last(problem: Problem, splits: int = 16):
    default = DECODE.default_schedule("sm_90", problem)
    return default.replace(splits=splits, combine="last", tail_rows=0, flat=False)


def test_the_merge_merges_every_split_in_a_step_that_fits_the_block_budget():
    c = split_constants(TOKEN, _last(TOKEN))
    # group 4 -> 4 merged heads; 16 splits x 4 rows x 128 columns = 8192 floats: one step
    assert (c["LAST"], c["MERGE_G"], c["MERGE_SINKS"]) == (16, 4, False)
    wide = dataclasses.replace(TOKEN, heads_q=64, head_dim=256)  # group 8, D 256: 4 a step
    c = split_constants(wide, _last(wide))
    assert (c["LAST"], c["MERGE_G"]) == (COMBINE_BLOCK_VALUES // (8 * 256), 8)
    c = split_constants(ODD, _last(ODD, 5))  # group 7 -> 8 heads x 4 positions x 128: 2
    assert (c["LAST"], c["MERGE_G"], c["MERGE_SINKS"]) == (2, 8, True)
    for schedule in (_last(TOKEN).replace(combine="block_pdl"), _last(TOKEN, 1)):
        assert split_constants(TOKEN, schedule)["LAST"] == 0


def test_the_plan_launches_one_kernel_and_zeroes_its_counters():
    plan = launches(TOKEN, _last(TOKEN), None)
    assert plan.last and plan.combine is None and plan.scratch
    rows = plan.tiles.rows
    assert partial_shapes(plan) == ((rows, 16, 16, 128), (rows, 16, 16), (rows,))
    opart, lse, counters = new_scratch(plan, lambda shape: np.full(shape, np.nan, np.float32))
    assert np.isnan(opart).all() and np.isnan(lse).all()
    assert counters.shape == (rows,) and (counters == 0).all()
    # the same plan with a merge kernel: two buffers, no counters
    plan = launches(TOKEN, _last(TOKEN).replace(combine="block_pdl"), None)
    assert not plan.last and plan.combine is not None and len(partial_shapes(plan)) == 2


def test_normalise_keeps_last_only_where_every_row_splits():
    last = _last(TOKEN)
    assert normalise(TOKEN, last).combine == "last"
    assert normalise(TOKEN, last.replace(splits=1)).combine == "kernel"  # no merge
    batch = dataclasses.replace(TOKEN, batch=20, seqlen_k=3000)  # 160 rows: a tail of the last rows split
    tail = normalise(batch, last.replace(splits=2, tail_rows=30))
    assert tail.tail_rows and tail.combine == "block_pdl"  # the tail's own merge kernel
    assert normalise(batch, tail) == tail


@pytest.mark.parametrize("arch", ARCHES)
def test_last_builds_the_split_kernel_alone(arch, monkeypatch):
    calls = []
    real = decode_compile.export_cubin

    def spy(kernel, args, arch, label):
        calls.append((kernel, label))
        return real(kernel, args, arch, label)

    monkeypatch.setattr(decode_compile, "export_cubin", spy)
    for problem in (TOKEN, ODD):
        schedule = normalise(problem, _last(problem, 5))
        result = DECODE.compile(problem, schedule, arch)
        assert result.cubin[:4] == b"\x7fELF" and not result.other_cubins
        assert calls[-1] == (split_kernel(schedule), f"decode {schedule.describe()}")
    assert len(calls) == 2


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found is None:  # the nvidia-cuda-cuobjdump wheel's, beside nvdisasm's
        here = Path(sys.executable).parent
        if (here / "cuobjdump").exists() and (here / "nvdisasm").exists():
            found = str(here / "cuobjdump")
    return found


def test_the_merge_reads_the_partials_at_device_scope_after_an_acquire_release_count(tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) absent")
    env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sass = {}
    for combine in ("last", "block_pdl"):
        path = tmp_path / f"{combine}.cubin"
        path.write_bytes(DECODE.compile(TOKEN, _last(TOKEN).replace(combine=combine),
                                        "sm_90").cubin)
        sass[combine] = subprocess.run([tool, "-sass", str(path)], capture_output=True,
                                       text=True, env=env, check=True).stdout
    last = sass["last"]
    count = last.index("ATOMG.E.ADD")
    # the stores are released before the count, and the count acquired (L1 invalidated) before
    # the merge's loads, which go to the device's memory, not through the L1 cache
    assert "MEMBAR.ALL.GPU" in last[:count] and "CCTL.IVALL" in last[count:]
    assert "LDG.E.128.STRONG.GPU" in last[count:]
    assert "ATOMG" not in sass["block_pdl"] and "STRONG.GPU" not in sass["block_pdl"]
