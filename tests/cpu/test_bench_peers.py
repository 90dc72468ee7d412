"""FlashAttention-4 (``flash-attn-4``) as a ``tiledtune bench`` contender, without a GPU: a fake
``flash_attn.cute`` (pure torch on the CPU, FlashAttention-4's signatures, its ``[B, S, H, D]``
layout and its bottom-right mask) in ``sys.modules`` stands in for the real one. Checked: the
layout conversion, which masks it takes (and the ``skipped`` rows of those it does not), its
rows through the engine (``ok`` against the float32 reference; ``wrong`` when the fake is made
wrong, in the output or only in the gradients; ``unavailable`` when ``flash_attn.cute`` cannot
be imported), its place in the presets and the reports' ``÷ FA4`` columns. The real library
on a GPU: ``tests/gpu/test_bench_peers_gpu.py``."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

import tiledattention
from tiledattention import Problem
from tiledattention.core._reference import attention_reference, varlen_reference
from tuner import bench
from tuner.bench import (FA4, GRID_PRESETS, PEER_CONTENDERS, PRESETS, BenchResult, RunInfo,
                         build_grid, fa4_mask, render_markdown)
from tuner.bench import _paged, _peers, _ragged
from tuner.errors import NotRunnable

from ._bench_stand_ins import (FixedRuntime, NamedSchedule, ReferenceCase, paged_case,
                               run_once_timing)

# -- a fake flash_attn.cute --------------------------------------------------------------------


class _DoubleGrad:
    """A planted backward bug: the output as it is, its gradient doubled (what FlashAttention-4's
    D=72 backward was seen doing on an H200: a right forward, wrong gradients)."""

    @staticmethod
    def apply(x):
        import torch

        class Double(torch.autograd.Function):
            @staticmethod
            def forward(ctx, y):
                return y.view_as(y)

            @staticmethod
            def backward(ctx, grad):
                return 2 * grad

        return Double.apply(x)


class FakeFA4:
    """``flash_attn_func`` and ``flash_attn_varlen_func`` with FlashAttention-4's signatures
    (``qv`` the fourth positional argument, as in its current interface), computed in float32
    on the CPU with its mask: causal and window aligned bottom-right per sequence, ``causal``
    forcing the right side to 0. Records every call; ``bug``: ``"output"`` (scaled by 1.25) or
    ``"grads"`` (doubled)."""

    def __init__(self, bug: str | None = None) -> None:
        self.calls: list[dict] = []
        self.bug = bug

    def module(self) -> types.ModuleType:
        module = types.ModuleType("flash_attn.cute")
        module.flash_attn_func = self.flash_attn_func
        module.flash_attn_varlen_func = self.flash_attn_varlen_func
        return module

    @staticmethod
    def _attend(q, k, v, *, scale, causal, window, sink, softcap):
        """``q [S_q, H, D]``, ``k, v [S_k, H_kv, D]`` -> ``[S_q, H, D]`` in float32."""
        import torch

        sq, h, _ = q.shape
        sk, hkv = k.shape[:2]
        k, v = (x.float().repeat_interleave(h // hkv, 1) for x in (k, v))
        s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sq)[:, None] + (sk - sq)  # bottom-right
        j = torch.arange(sk)[None, :]
        left, right = window
        right = 0 if causal else right
        keep = torch.ones(sq, sk, dtype=torch.bool)
        if left is not None:
            keep &= j >= i - left
        if right is not None:
            keep &= j <= i + right
        s = s.masked_fill(~keep, float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink.float()[:, None, None].expand(h, sq, 1)], -1)
        p = torch.softmax(s, -1)[..., :sk]
        return torch.einsum("hqk,khd->qhd", p, v)

    def _finish(self, out, dtype):
        if self.bug == "output":
            out = out * 1.25
        out = out.to(dtype)
        return (_DoubleGrad.apply(out) if self.bug == "grads" else out), None

    @staticmethod
    def _check(q, k, v, learnable_sink, softcap):
        for x in (q, k, v):
            assert x.is_contiguous(), "FlashAttention-4's inputs are made contiguous outside"
        assert q.shape[-2] % k.shape[-2] == 0 and q.shape[-1] == k.shape[-1]
        assert isinstance(softcap, float)
        if learnable_sink is not None:
            import torch

            assert learnable_sink.shape == (q.shape[-2],)
            assert learnable_sink.dtype == torch.bfloat16  # what every version takes

    def flash_attn_func(self, q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None,
                        causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                        return_lse=False, **rest):
        import torch

        assert qv is None and not rest and num_splits == 1 and q.dim() == 4
        self._check(q, k, v, learnable_sink, softcap)
        self.calls.append(dict(fn="dense", q=tuple(q.shape), k=tuple(k.shape),
                               causal=causal, window=window_size, softcap=softcap,
                               sink=learnable_sink is not None, scale=softmax_scale))
        out = torch.stack([self._attend(q[b], k[b], v[b], scale=softmax_scale, causal=causal,
                                        window=window_size, sink=learnable_sink,
                                        softcap=softcap) for b in range(q.shape[0])])
        return self._finish(out, q.dtype)

    def flash_attn_varlen_func(self, q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                               max_seqlen_q=None, max_seqlen_k=None, min_seqlen_k=None,
                               seqused_q=None, seqused_k=None, gather_kv_indices=None,
                               page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0,
                               num_splits=1, **rest):
        import torch

        assert qv is None and not rest and num_splits == 1
        self._check(q, k, v, learnable_sink, softcap)
        mask = dict(scale=softmax_scale, causal=causal, window=window_size,
                    sink=learnable_sink, softcap=softcap)
        if page_table is not None:
            assert cu_seqlens_k is None and page_table.dtype == torch.int32
            assert (page_table >= 0).all(), "every slot of the block table names a page"
            assert q.dim() == 4 and seqused_k.dtype == torch.int32
            self.calls.append(dict(fn="paged", q=tuple(q.shape), max_seqlen_k=max_seqlen_k,
                                   causal=causal, window=window_size))
            outs = []
            for b, n in enumerate(seqused_k.tolist()):
                kb, vb = (x[page_table[b].long()].flatten(0, 1)[:n] for x in (k, v))
                outs.append(self._attend(q[b], kb, vb, **mask))
            return self._finish(torch.stack(outs), q.dtype)
        lens_q, lens_k = torch.diff(cu_seqlens_q).tolist(), torch.diff(cu_seqlens_k).tolist()
        assert (max_seqlen_q, max_seqlen_k) == (max(lens_q), max(lens_k))
        self.calls.append(dict(fn="varlen", q=tuple(q.shape), causal=causal,
                               window=window_size))
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        out = torch.cat([self._attend(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]],
                                      v[ck[i]:ck[i + 1]], **mask) for i in range(len(lens_q))])
        return self._finish(out, q.dtype)


def _install(monkeypatch, fake: FakeFA4 | None) -> FakeFA4 | None:
    """``fake`` as ``flash_attn.cute`` (``None``: a ``flash_attn.cute`` that cannot be
    imported)."""
    package = types.ModuleType("flash_attn")
    monkeypatch.setitem(sys.modules, "flash_attn", package if fake else None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", fake.module() if fake else None)
    return fake


@pytest.fixture
def fa4(monkeypatch):
    return _install(monkeypatch, FakeFA4())


# -- CPU cases like the families' -----------------------------------------------------------------

def _p(**fields) -> Problem:
    base = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=24, seqlen_k=24, head_dim=32,
                dtype="bf16", causal=True)
    return Problem(**{**base, **fields})


def _dense_case(problem: Problem, *, backward: bool = False):
    """An ``AttentionCase`` on the CPU: q, k, v ``[B, H, S, D]``, sink logits, the float32
    reference (and dO with reference gradients)."""
    import torch

    gen = torch.Generator().manual_seed(0)

    def rand(heads, seqlen):
        return torch.randn(problem.batch, heads, seqlen, problem.head_dim,
                           generator=gen).bfloat16()

    q = rand(problem.heads_q, problem.seqlen_q)
    q = q * 8 if problem.softcap else q  # so the cap binds
    k, v = rand(problem.heads_kv, problem.seqlen_k), rand(problem.heads_kv, problem.seqlen_k)
    sinks = torch.randn(problem.heads_q, generator=gen) + 2.0 if problem.sinks else None
    case = types.SimpleNamespace(q=q, k=k, v=v, sinks=sinks,
                                 reference=attention_reference(q, k, v, problem, sinks=sinks))
    if backward:
        case.grad_out = rand(problem.heads_q, problem.seqlen_q)
        leaves = [x.float().requires_grad_() for x in (q, k, v)]
        out = attention_reference(*leaves, problem, sinks=sinks)
        case.reference_grads = torch.autograd.grad(out, leaves, case.grad_out.float())
    return case


def _r(**fields) -> Problem:
    """A ragged bucket: 4 sequences of 16, 12, 8 and 4 queries."""
    return _p(**{"batch": 4, "seqlen_q": 16, "seqlen_k": 16, "ragged": True, **fields})


def _ragged_case(problem: Problem, *, backward: bool = False):
    """A ``RaggedCase`` on the CPU: packed q, k, v ``[tokens, H, D]``, offsets, reference."""
    import torch

    lens = _ragged.case_lengths(problem)
    cu_q = torch.tensor([0] + [a for a, _ in lens]).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + [b for _, b in lens]).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(1)

    def rand(tokens, heads):
        return torch.randn(tokens, heads, problem.head_dim, generator=gen).bfloat16()

    q = rand(int(cu_q[-1]), problem.heads_q)
    k, v = rand(int(cu_k[-1]), problem.heads_kv), rand(int(cu_k[-1]), problem.heads_kv)
    mask = dict(causal=problem.causal, bottom_right=problem.bottom_right,
                window=(problem.window_left, problem.window_right))
    case = types.SimpleNamespace(q=q, k=k, v=v, cu_seq_q=cu_q, cu_seq_k=cu_k,
                                 reference=varlen_reference(q, k, v, cu_q, cu_k, **mask))
    if backward:
        case.grad_out = rand(int(cu_q[-1]), problem.heads_q)
        leaves = [x.float().requires_grad_() for x in (q, k, v)]
        out = varlen_reference(*leaves, cu_q, cu_k, **mask)
        case.reference_grads = torch.autograd.grad(out, leaves, case.grad_out.float())
    return case


def _pp(**fields) -> Problem:
    """A paged decode bucket: 4 caches of 64, 48, 32 and 16 keys in pages of 16."""
    return _p(**{"batch": 4, "seqlen_q": 1, "seqlen_k": 64, "bottom_right": True,
                 "ragged": True, "page_size": 16, **fields})


def _case(problem: Problem, *, backward: bool = False):
    if problem.page_size:
        return paged_case(problem, seed=2)
    if problem.ragged:
        return _ragged_case(problem, backward=backward)
    return _dense_case(problem, backward=backward)


# -- layout and masks ------------------------------------------------------------------------------

def test_layout_conversion_is_a_contiguous_transpose_and_back():
    import torch

    x = torch.arange(2 * 3 * 5 * 4).reshape(2, 3, 5, 4)  # [B, H, S, D]
    y = _peers.to_fa4(x)
    assert y.shape == (2, 5, 3, 4) and y.is_contiguous()  # [B, S, H, D]
    assert y[1, 4, 2, 3] == x[1, 2, 4, 3]
    assert torch.equal(_peers.from_fa4(y), x)


@pytest.mark.parametrize("problem, expected", [
    (_p(), (True, (None, None))),
    (_p(causal=False), (False, (None, None))),
    (_p(seqlen_q=8, seqlen_k=24, bottom_right=True), (True, (None, None))),
    (_p(seqlen_q=8, seqlen_k=24, causal=False), (False, (None, None))),  # no mask to align
    (_p(window_left=7), (True, (7, None))),
    (_p(causal=False, window_left=3, window_right=5), (False, (3, 5))),
    (_p(seqlen_q=1, seqlen_k=64, bottom_right=True, window_left=15), (False, (15, None))),
    (_r(), (True, (None, None))),  # each sequence as many keys as queries
    (_r(seqlen_k=32, bottom_right=True), (True, (None, None))),
    (_pp(), (True, (None, None))),
], ids=("causal", "full", "bottom-right", "full-more-keys", "window", "two-sided-window",
        "decode-window", "ragged", "ragged-bottom-right", "paged"))
def test_fa4_mask_says_the_problems_mask(problem, expected):
    mask = fa4_mask(problem)
    assert (mask["causal"], mask["window_size"]) == expected


@pytest.mark.parametrize("problem", [
    _p(seqlen_q=8, seqlen_k=24),  # top-left causal with more keys
    _p(seqlen_q=8, seqlen_k=24, causal=False, window_left=3),  # top-left window
    _r(seqlen_k=32),  # each sequence twice as many keys, top-left
    _pp(bottom_right=False),  # one query row, top-left: it sees key 0 only
], ids=("top-left", "top-left-window", "ragged-top-left", "paged-top-left"))
def test_a_top_left_mask_with_more_keys_is_not_fa4s(problem):
    with pytest.raises(NotRunnable, match="bottom-right"):
        fa4_mask(problem)


# -- the contender against the reference ------------------------------------------------------

@pytest.mark.parametrize("backward", [False, True], ids=("forward", "backward"))
@pytest.mark.parametrize("problem", [
    _p(), _p(causal=False, heads_kv=4), _p(seqlen_q=8, seqlen_k=24, bottom_right=True),
    _p(window_left=5), _p(softcap=2.0), _p(sinks=True, window_left=9),
    _r(), _r(seqlen_k=32, bottom_right=True, window_left=6),
], ids=("causal-gqa", "full-mha", "bottom-right", "window", "softcap", "sinks+window",
        "ragged", "ragged-bottom-right-window"))
def test_fa4_matches_the_reference(problem, backward, fa4):
    case = _case(problem, backward=backward)
    run, err = _peers.build_peer_contender(FA4, problem, case, backward=backward)
    assert err < 1e-2
    call = fa4.calls[0]
    if problem.ragged:  # the packed tensors as they are, through the varlen entry
        assert call["fn"] == "varlen" and call["q"] == tuple(case.q.shape)
    else:  # its own layout: [B, S, H, D]
        assert call["fn"] == "dense" and call["q"] == (problem.batch, problem.seqlen_q,
                                                       problem.heads_q, problem.head_dim)
        assert call["k"] == (problem.batch, problem.seqlen_k, problem.heads_kv,
                             problem.head_dim)
        assert call["scale"] == pytest.approx(problem.head_dim ** -0.5)
        assert call["sink"] == problem.sinks and call["softcap"] == problem.softcap
    got = run()  # the timed call: FlashAttention-4's output, or autograd's gradients
    assert len(fa4.calls) == (2 if not backward else 1)  # the backward keeps its graph
    if backward:
        assert len(got) == 3 and got[1].shape == (case.k.transpose(1, 2).shape
                                                  if not problem.ragged else case.k.shape)
    # the check is sharp: the problem without its mask is far from the reference
    if problem.causal and not backward and not problem.ragged:
        unmasked = dataclasses.replace(problem, causal=False, window_left=-1,
                                       bottom_right=False)
        _, far = _peers.build_peer_contender(FA4, unmasked, case, backward=False)
        assert far > 0.05


def test_fa4_paged_matches_the_reference(fa4):
    problem = _pp(seqlen_q=4, window_left=20)
    case = paged_case(problem, seed=2)
    run, err = _peers.build_peer_contender(FA4, problem, case, backward=False)
    assert err < 1e-2
    call = fa4.calls[0]
    assert call["fn"] == "paged" and call["q"] == (4, 4, 4, 32) and call["max_seqlen_k"] == 64
    assert (call["causal"], call["window"]) == (True, (20, None))
    assert (case.table == -1).any()  # the case's table is left as it is; FA4 got a copy
    run()
    with pytest.raises(NotRunnable, match="no backward"):
        _peers.build_peer_contender(FA4, problem, case, backward=True)


def test_not_importable_says_why(monkeypatch):
    _install(monkeypatch, None)
    with pytest.raises(_peers.PeerUnavailable, match=r"flash_attn\.cute.*cannot be imported"):
        _peers.fa4_functions()
    incomplete = types.ModuleType("flash_attn.cute")
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", incomplete)
    with pytest.raises(_peers.PeerUnavailable, match="no flash_attn_func or "
                                                     "flash_attn_varlen_func"):
        _peers.fa4_functions()


# -- its rows through the engine -------------------------------------------------------------------

class _Family(tiledattention.Family):
    """A family whose case is the CPU case of the problem's kind."""

    name = "cpupeers"
    problem_type = Problem
    schedule_type = NamedSchedule
    template_modules = (__name__,)
    bucket_fields = ("dtype",)
    backward = False

    def default_schedule(self, arch, problem):
        return NamedSchedule("default")

    def flops(self, problem):
        return 1e9

    def compile(self, problem, schedule, arch):
        raise NotImplementedError

    def case(self, problem, device_index):
        return ReferenceCase(_case(problem, backward=self.backward),
                             "FlashAttention-4 is no baseline of the case")

    def tolerance(self, problem):
        return 1e-2


@pytest.fixture(params=["forward", "backward"])
def peer_preset(request, monkeypatch):
    """The forward's (or the backward's) preset over a CPU family."""
    family = _Family()
    family.backward = request.param == "backward"
    tiledattention.register_family(family)
    monkeypatch.setattr(tiledattention, "runtime", lambda: FixedRuntime("shipped"))
    yield dataclasses.replace(PRESETS[request.param], kernel=family.name)
    tiledattention.unregister_family(family.name)


def _measure(preset, problem, names=("tiledattention", FA4)):
    rows = bench.measure_point(preset, problem, names, bench.BenchSettings(), env={},
                               time_fn=run_once_timing)
    return {r.contender: r for r in rows}


@pytest.mark.parametrize("problem", [_p(), _r(), _p(window_left=5, sinks=True)],
                         ids=("causal-gqa", "ragged", "window+sinks"))
def test_engine_checks_then_times_fa4(peer_preset, problem, fa4):
    rows = _measure(peer_preset, problem)
    ours, peer = rows["tiledattention"], rows[FA4]
    assert ours.status == "ok" and peer.status == "ok", peer.note
    assert 0 < peer.rel_err < 1e-2 and peer.median_ms == 2.0
    assert peer.tflops == pytest.approx(1e9 / 2e-3 / 1e12)  # the family's flops, like ours
    assert peer.phase == peer_preset.phase and peer.schedule == ""


def test_engine_fa4_paged_and_its_skips(monkeypatch, fa4):
    family = _Family()
    tiledattention.register_family(family)
    monkeypatch.setattr(tiledattention, "runtime", lambda: FixedRuntime("shipped"))
    try:
        preset = dataclasses.replace(PRESETS["decode"], kernel=family.name)
        assert _measure(preset, _pp())[FA4].status == "ok"
        top_left = _measure(preset, _p(seqlen_q=8, seqlen_k=24))[FA4]
        assert top_left.status == "skipped" and "bottom-right" in top_left.reason
        assert "S_q 8 != S_k 24" in top_left.reason
        backward = dataclasses.replace(preset, phase="backward")
        paged = _measure(backward, _pp(), names=(FA4,))[FA4]
        assert paged.status == "skipped" and "no backward" in paged.reason
    finally:
        tiledattention.unregister_family(family.name)


@pytest.mark.parametrize("bug", ["output", "grads"])
def test_a_wrong_fa4_is_reported_wrong_not_a_crash(peer_preset, bug, monkeypatch):
    _install(monkeypatch, FakeFA4(bug=bug))
    rows = _measure(peer_preset, _p())
    peer = rows[FA4]
    wrong = bug == "output" or peer_preset.phase == "backward"  # wrong grads: a right forward
    assert rows["tiledattention"].status == "ok"
    if wrong:
        assert peer.status == "wrong" and peer.reason.startswith("err=")
        assert peer.rel_err > 0.2 and peer.median_ms is None
    else:
        assert peer.status == "ok"


def test_engine_says_unavailable_without_flash_attn(peer_preset, monkeypatch):
    _install(monkeypatch, None)
    peer = _measure(peer_preset, _p())[FA4]
    assert peer.status == "unavailable"
    assert "flash_attn.cute" in peer.reason and "cannot be imported" in peer.reason
    # where its mask differs, that is said whether or not it is installed
    skipped = _measure(peer_preset, _p(seqlen_q=8, seqlen_k=24))[FA4]
    assert skipped.status == "skipped"


# -- presets and reports ------------------------------------------------------------------------

def test_every_preset_has_fa4_last_at_every_problem():
    assert PEER_CONTENDERS == (FA4,) == ("flash-attn-4",)
    for name, presets in GRID_PRESETS.items():
        for kernel in presets:
            grid = build_grid(kernel, preset=name, quick=True)
            assert grid.contenders[-1] == FA4, (name, kernel)
            assert all(grid.contenders_at(p)[-1] == FA4 for p in grid.problems)
    only = build_grid("backward", quick=True, contenders=f"{FA4},torch-cudnn")
    assert only.contenders == ("torch-cudnn", FA4)


def _row(name, problem, ms=None, **fields):
    base = dict(kernel="backward", phase="backward", **bench.result_fields(problem))
    if ms is None:
        return BenchResult(contender=name, status=fields.pop("status", "unavailable"),
                           reason=fields.pop("reason", "PeerUnavailable: not here"),
                           **base, **fields)
    return BenchResult(contender=name, status="ok", median_ms=ms, tflops=1e9 / ms / 1e9,
                       spread_ms=0.0, samples=5, **base, **fields)


def test_reports_divide_by_fa4_where_it_ran():
    p1, p2 = _p(seqlen_q=1024, seqlen_k=1024), _p(seqlen_q=2048, seqlen_k=2048)
    rows = [_row("tiledattention", p1, 1.0), _row("torch-flash", p1, 1.2),
            _row("torch-cudnn", p1, 1.5), _row(FA4, p1, 0.8),
            _row("tiledattention", p2, 2.0), _row("torch-flash", p2, 2.4),
            _row("torch-cudnn", p2, 3.0), _row(FA4, p2)]
    text = render_markdown(rows, RunInfo(command="x", date="d"))
    per_point = text.split("## Per point")[1].split("\n## ")[0]
    assert "÷ FA4" in per_point.splitlines()[2]
    assert "| 1.000 | 1 | 1.20 | 1.50 | 0.80 |" in per_point  # ours: ÷ flash, ÷ cuDNN, ÷ FA4
    geo = text.split("## Geometric mean speed-up")[1].split("\n## ")[0]
    assert "| tiledattention | backward | 1.20 | 2 | 1.50 | 2 | 0.80 | 1 |" in geo
    assert f"÷ `{FA4}`: 0.80 over 1 points." in text  # the target line
    assert "÷ FA4: `flash-attn-4`'s time" in text
    # a run without it renders as before: no FA4 column, no note
    old = render_markdown([r for r in rows if r.contender != FA4], RunInfo(command="x",
                                                                          date="d"))
    assert "FA4" not in old and FA4 not in old
