"""FlashAttention-4 (``flash-attn-4``) as a ``tiledtune bench`` contender on a GPU: the real
``flash_attn.cute`` at three small problems (a causal forward with grouped heads, a backward, a
packed variable-length forward), each checked against the family case's float32 reference and
timed through the engine; a top-left mask with more keys than queries is skipped. Skipped where
``flash_attn.cute`` cannot be imported (it is a contender, never a dependency)."""

from __future__ import annotations

import importlib

import pytest

import tiledattention
from tiledattention import Problem
from tuner import bench
from tuner.bench import FA4, GRID_PRESETS, PRESETS


def _why_not() -> str:
    try:
        importlib.import_module("flash_attn.cute")
    except Exception as exc:  # not installed, or its CUDA DSL does not load here
        return f"flash_attn.cute cannot be imported: {type(exc).__name__}: {exc}"
    return ""


_WHY = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_WHY), reason=_WHY)]


def _p(**fields) -> Problem:
    base = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=512, seqlen_k=512, head_dim=64,
                dtype="bf16", causal=True)
    return Problem(**{**base, **fields})


@pytest.mark.parametrize("preset, problem", [
    (PRESETS["forward"], _p()),
    (PRESETS["backward"], _p()),
    (GRID_PRESETS["ragged"]["forward"], _p(batch=8, ragged=True)),
], ids=("forward-causal-gqa", "backward", "varlen"))
def test_fa4_runs_checked_and_timed(preset, problem):
    rows = bench.measure_point(preset, problem, (FA4,), bench.BenchSettings(interleave=3),
                               env={"arch": tiledattention.device_info(0).arch})
    (row,) = rows
    assert row.status == "ok", row.note
    family = preset.family
    assert row.rel_err <= family.tolerance(problem)
    assert row.median_ms > 0 and row.tflops == pytest.approx(
        family.flops(problem) / (row.median_ms * 1e-3) / 1e12)
    assert row.phase == preset.phase and row.ragged == problem.ragged


def test_fa4_skips_a_mask_it_aligns_otherwise():
    problem = _p(seqlen_q=128, seqlen_k=512)  # top-left causal: not FA4's bottom-right
    (row,) = bench.measure_point(PRESETS["forward"], problem, (FA4,), bench.BenchSettings(),
                                 env={"arch": tiledattention.device_info(0).arch})
    assert row.status == "skipped" and "bottom-right" in row.reason
