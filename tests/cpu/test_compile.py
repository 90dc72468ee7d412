"""Compile-only builds on a machine without a GPU (cuTile + tileiras from pip)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from tiledattention import FORWARD, CompileError, InputValueError, Problem, Schedule, \
    compile_schedule

PROBLEM = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=1000, seqlen_k=777, head_dim=96,
                  dtype="bf16", causal=True)
ALIGNED = Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=512, seqlen_k=1024, head_dim=128,
                  dtype="fp16", causal=False)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", "sm_121"])
def test_default_schedule_compiles(arch):
    schedule = FORWARD.default_schedule(arch, PROBLEM)
    result = FORWARD.compile(PROBLEM, schedule, arch)  # the family's build, as the tuner runs it
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
    assert result.shared_bytes and result.shared_bytes > 0


def test_hopper_default_splits_long_causal_tiles_over_a_cluster():
    """sm_90, D <= 128: 128-row tiles on two-CTA clusters for causal S_q >= 4k only (probe 8)."""
    long_causal = Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096,
                          head_dim=128, dtype="bf16", causal=True)
    cluster = FORWARD.default_schedule("sm_90", long_causal)
    assert (cluster.tile_m, cluster.num_ctas, cluster.longest_first) == (128, 2, True)
    assert compile_schedule(long_causal, cluster, "sm_90").cubin[:4] == b"\x7fELF"
    for other in (dataclasses.replace(long_causal, seqlen_q=2048, seqlen_k=2048),
                  dataclasses.replace(long_causal, causal=False),
                  dataclasses.replace(long_causal, head_dim=256)):
        assert FORWARD.default_schedule("sm_90", other).num_ctas == 1


def test_hopper_default_pairs_causal_query_tiles_at_head_dim_256():
    """sm_90, D > 128, causal: (n-1-i, i) query tile pairs (probe 11) where rows see more than
    CAUSAL_UNPAIRED_KEYS keys; at most that many (H200: 1.015-1.21x the pairs on twelve calls),
    unpaired, longest first, key tiles sawtooth; never paired when not causal."""
    d256 = Problem(batch=8, heads_q=8, heads_kv=8, seqlen_q=2049, seqlen_k=2049, head_dim=256,
                   dtype="bf16", causal=True)
    paired = FORWARD.default_schedule("sm_90", d256)
    assert paired.paired_tiles and paired.tile_m == 128 and not paired.kv_sawtooth
    assert compile_schedule(d256, paired, "sm_90").cubin[:4] == b"\x7fELF"
    assert not FORWARD.default_schedule(
        "sm_90", dataclasses.replace(d256, causal=False)).paired_tiles
    assert not FORWARD.default_schedule(
        "sm_90", dataclasses.replace(d256, head_dim=128)).paired_tiles
    for short in (dataclasses.replace(d256, seqlen_q=2048, seqlen_k=2048),
                  dataclasses.replace(d256, seqlen_q=300, seqlen_k=300, head_dim=192)):
        s = FORWARD.default_schedule("sm_90", short)
        assert (s.paired_tiles, s.longest_first, s.kv_sawtooth) == (False, True, True)
    windowed = dataclasses.replace(d256, seqlen_q=1000, seqlen_k=1000, window_left=255)
    assert FORWARD.default_schedule("sm_90", windowed).paired_tiles  # not measured


def test_hopper_default_walks_short_full_head_dim_256_key_tiles_sawtooth():
    """sm_90, D 256, full mask, rows seeing 513-2048 keys: key tiles walked sawtooth (H200:
    1.044-1.064x on five calls); not at 512 or 4096 keys, windowed (not measured) or D 192
    (two parts); causal calls this short walk sawtooth by their own rule (the test above)."""
    d256 = Problem(batch=8, heads_q=8, heads_kv=2, seqlen_q=1047, seqlen_k=1047, head_dim=256,
                   dtype="fp16", causal=False)
    s = FORWARD.default_schedule("sm_90", d256)
    assert s.kv_sawtooth and (s.tile_m, s.tile_n, s.num_worker_warps) == (128, 128, 8)
    assert compile_schedule(d256, s, "sm_90").cubin[:4] == b"\x7fELF"
    assert FORWARD.default_schedule("sm_90", dataclasses.replace(
        d256, seqlen_q=2048, seqlen_k=2048)).kv_sawtooth
    for other in (dataclasses.replace(d256, seqlen_q=512, seqlen_k=512),
                  dataclasses.replace(d256, seqlen_q=4096, seqlen_k=4096),
                  dataclasses.replace(d256, seqlen_q=4096, seqlen_k=4096, causal=True),
                  dataclasses.replace(d256, window_left=500, window_right=500),
                  dataclasses.replace(d256, head_dim=192)):
        assert not FORWARD.default_schedule("sm_90", other).kv_sawtooth, other


def test_hopper_default_runs_short_causal_split_head_dims_on_64x64_tiles():
    """sm_90, causal, a head dim split in two (72, 80, 96) with rows seeing < 4k keys: 64x64
    tiles at occupancy 3, longest first; not for a power of two, nor at 4k keys."""
    for d in (72, 80, 96):
        short = dataclasses.replace(PROBLEM, head_dim=d)
        s = FORWARD.default_schedule("sm_90", short)
        assert (s.tile_m, s.tile_n, s.occupancy, s.longest_first, s.split_d) == (
            64, 64, 3, True, True), d
        assert FORWARD.default_schedule("sm_90", dataclasses.replace(
            short, seqlen_q=4096, seqlen_k=4096)).tile_m == 128
        assert not FORWARD.default_schedule("sm_90", dataclasses.replace(
            short, causal=False)).longest_first
    assert FORWARD.default_schedule("sm_90", dataclasses.replace(
        PROBLEM, head_dim=128)).tile_n == 128


BASE = Schedule(tile_m=64, tile_n=64)
TOGGLES = {
    "tile_m128": BASE.replace(tile_m=128), "tile_n32": BASE.replace(tile_n=32),
    "occupancy2": BASE.replace(occupancy=2), "num_ctas2": BASE.replace(num_ctas=2),
    "opt_level2": BASE.replace(opt_level=2), "warps8": BASE.replace(num_worker_warps=8),
    "k_latency3": BASE.replace(k_latency=3), "v_latency5": BASE.replace(v_latency=5),
    "k_transposed": BASE.replace(k_transposed=True), "no_tma": BASE.replace(allow_tma=False),
    "exp2": BASE.replace(exp2=True), "approx_div": BASE.replace(approx_div=True),
    "kv_sawtooth": BASE.replace(kv_sawtooth=True),
    "longest_first": BASE.replace(longest_first=True),
    "unchecked_loads": BASE.replace(unchecked_loads=True),
    "split_masked": BASE.replace(split_masked=True),
    "persistent": BASE.replace(persistent=True),
    "paired_tiles": BASE.replace(paired_tiles=True),
}


def _digest(problem, schedule, arch="sm_90"):
    return hashlib.sha1(compile_schedule(problem, schedule, arch).cubin).hexdigest()


@pytest.mark.slow
def test_every_dimension_changes_the_compiled_code():
    """The trap of tuners that search a knob which never reaches the compiler: each toggle must
    give a different cubin from the base schedule (on a problem where it applies)."""
    base = {p: _digest(p, BASE) for p in (PROBLEM, ALIGNED)}
    same = []
    for name, schedule in TOGGLES.items():
        # unchecked loads only apply to tile-aligned shapes; longest-first only to causal ones
        problem = ALIGNED if name == "unchecked_loads" else PROBLEM
        if _digest(problem, schedule) == base[problem]:
            same.append(name)
    assert same == []


def test_compile_error_names_schedule_and_arch(monkeypatch):
    import tiledattention.kernels.forward._compile as compile_module

    def broken(*args, **kwargs):
        raise RuntimeError("tileiras: Return code 5")

    monkeypatch.setattr(compile_module.ctc, "export_kernel", broken)
    with pytest.raises(CompileError, match="64x64 occ1 exp does not compile for sm_121"):
        compile_schedule(PROBLEM, BASE, "sm_121")
    with pytest.raises(CompileError, match="does not compile for sm_121"):
        FORWARD.compile(PROBLEM, BASE, "sm_121")


@pytest.mark.parametrize("arch", ["sm90", "sm_121a", "sm_999", 90])
def test_bad_arch_is_rejected(arch):
    with pytest.raises(InputValueError, match="arch"):
        compile_schedule(PROBLEM, BASE, arch)
    with pytest.raises(InputValueError, match="arch"):
        FORWARD.compile(PROBLEM, BASE, arch)
