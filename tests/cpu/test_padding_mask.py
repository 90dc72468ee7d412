"""tiledattention.integrations.PaddingMask on the CPU: construction and its errors, the
materialised mask against one built by hand position by position, torch's SDPA through the
mask's own dispatch (router off and on), ``route_decision`` on CPU and meta tensors, and the
router's use of it: falling back with the reason counted, and (with CPU widened to a kernel
device and ``tiledattention.sdpa`` replaced by the float32 reference of its ``ranges=``
contract, as in ``test_integrations``) running ``sdpa(..., ranges=mask.ranges)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention
import tiledattention.integrations as ti
from tiledattention.errors import InputTypeError, InputValueError
from tiledattention.integrations import PaddingMask, _router, padding_mask

from .test_integrations import KernelCalls

TORCH_SDPA = _router._TORCH_SDPA


pytestmark = pytest.mark.usefixtures("router_off")


class UncountedKernelCalls(KernelCalls):
    """``test_integrations``' stand-in for ``tiledattention.sdpa``, whose reference's own SDPA
    calls pass the router by, uncounted."""

    def __call__(self, *args, **kwargs):
        _router._passthrough.active = True
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _router._passthrough.active = False


@pytest.fixture
def kernel(monkeypatch) -> KernelCalls:
    calls = UncountedKernelCalls()
    monkeypatch.setattr(tiledattention, "sdpa", calls)
    return calls


@pytest.fixture
def cpu_is_kernel_device(monkeypatch):
    monkeypatch.setattr(_router, "KERNEL_DEVICE_TYPES", ("cpu",))


def qkv(b=3, hq=4, hkv=4, sq=9, sk=9, d=32, dtype=torch.float32, device="cpu", seed=0,
        requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def make(h, s):
        x = torch.randn(b, h, s, d, generator=gen).to(dtype=dtype, device=device)
        return x.requires_grad_(requires_grad)
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


# -- a mask built by hand, position by position ------------------------------------------------
def hand_mask(lengths_k, sq, sk, side, lengths_q=None, causal=False):
    """The boolean ``[B, 1, S_q, S_k]`` mask from its definition: keys valid by side and
    length; query row ``i`` is key position ``i + S_k - S_q`` and valid where that position is
    a valid key (or: the first / last ``lengths_q`` rows); causal relative to each entry's
    first valid query and key (top-left) or last ones (bottom-right)."""
    mask = torch.zeros(len(lengths_k), 1, sq, sk, dtype=torch.bool)
    for b, lk in enumerate(lengths_k):
        lk = max(0, min(lk, sk))
        keys = list(range(sk - lk, sk)) if side == "left" else list(range(lk))
        if lengths_q is None:
            rows = [i for i in range(sq) if i + sk - sq in keys]
        else:
            lq = max(0, min(lengths_q[b], sq))
            rows = list(range(sq - lq, sq)) if side == "left" else list(range(lq))
        for r, i in enumerate(rows):
            for c, j in enumerate(keys):
                if causal in (True, "top_left") and c > r:
                    continue
                if causal == "bottom_right" and c > r + len(keys) - len(rows):
                    continue
                mask[b, 0, i, j] = True
    return mask


LENGTH_CASES = {
    # (lengths_k, S_q, S_k, lengths_q)
    "prefill": ([9, 4, 1, 0], 9, 9, None),
    "decode": ([9, 4, 1, 0], 1, 9, None),
    "chunk": ([12, 7, 3, 2], 4, 12, None),
    "sq>sk": ([5, 3, 0, 1], 8, 5, None),
    "cross": ([6, 2, 0, 3], 5, 6, [5, 1, 3, 0]),
    "clamped": ([20, -3, 6, 5], 6, 6, None),
}
CAUSAL = [False, True, "top_left", "bottom_right"]


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", LENGTH_CASES.values(), ids=LENGTH_CASES.keys())
def test_materialised_mask_equals_the_hand_built_one(case, side, causal):
    lengths_k, sq, sk, lengths_q = case
    lq = None if lengths_q is None else torch.tensor(lengths_q, dtype=torch.int32)
    mask = padding_mask(torch.tensor(lengths_k), sq, sk, side=side, lengths_q=lq, causal=causal)
    want = hand_mask(lengths_k, sq, sk, side, lengths_q, causal)
    got = mask._materialize()
    assert got.dtype == torch.bool and got.shape == (len(lengths_k), 1, sq, sk)
    assert torch.equal(got, want)
    assert torch.equal(mask._materialize("cpu"), want)


@pytest.mark.parametrize("side", ["left", "right"])
def test_bottom_right_is_causal_by_position_for_the_default_queries(side):
    """Query row i is key position i + S_k - S_q: bottom-right within the ranges lets it see the
    valid keys at positions <= its own, in a prefill, a chunk and a decode step alike."""
    for sq, sk in ((9, 9), (3, 9), (1, 9), (12, 9)):
        lengths = [9, 5, 1, 0]
        got = padding_mask(torch.tensor(lengths), sq, sk, side=side,
                           causal="bottom_right")._materialize()
        plain = padding_mask(torch.tensor(lengths), sq, sk, side=side)._materialize()
        i = torch.arange(sq)[:, None] + sk - sq
        j = torch.arange(sk)[None, :]
        assert torch.equal(got, plain & (j <= i)), (sq, sk)


def test_ranges_of_left_and_right_padding():
    lengths = torch.tensor([5, 2, 0], dtype=torch.int64)
    left = padding_mask(lengths, 5, 5, side="left")
    assert left.ranges.dtype == torch.int32 and left.ranges.is_contiguous()
    assert left.ranges.tolist() == [[0, 3, 5], [5, 5, 5], [0, 3, 5], [5, 5, 5]]
    right = padding_mask(lengths.int(), 5, 5, side="right")
    assert right.ranges.tolist() == [[0, 0, 0], [5, 2, 0], [0, 0, 0], [5, 2, 0]]
    # a left-padded decode step: the one query row is valid wherever the entry has a key
    step = padding_mask(lengths, 1, 5, side="left", causal="bottom_right")
    assert step.ranges.tolist() == [[0, 0, 1], [1, 1, 1], [0, 3, 5], [5, 5, 5]]
    # queries with lengths of their own, on the same side
    cross = padding_mask(lengths, 4, 5, side="left", lengths_q=torch.tensor([4, 1, 2]))
    assert cross.ranges.tolist() == [[0, 3, 2], [4, 4, 4], [0, 3, 5], [5, 5, 5]]


def test_attributes_and_metadata_without_building_the_mask(monkeypatch):
    mask = padding_mask(torch.tensor([3, 1]), 4, 6, side="right", causal="top_left")
    assert isinstance(mask, PaddingMask) and isinstance(mask, torch.Tensor)
    assert (mask.seq_len_q, mask.seq_len_kv, mask.causal, mask.batch) == (4, 6, True, 2)

    def fail(*args, **kwargs):
        raise AssertionError("materialised")
    monkeypatch.setattr(PaddingMask, "_materialize", fail)
    assert mask.shape == (2, 1, 4, 6) and mask.size(-1) == 6 and mask.dim() == 4
    assert mask.dtype == torch.bool and mask.device == torch.device("cpu")
    assert not mask.requires_grad and mask.numel() == 48 and len(mask) == 2
    assert repr(mask) == ("PaddingMask(batch=2, seq_len_q=4, seq_len_kv=6, causal=True, "
                          "device=cpu)")


def test_other_torch_functions_see_the_materialised_mask():
    mask = padding_mask(torch.tensor([3, 1]), 4, 4, side="left")
    want = hand_mask([3, 1], 4, 4, "left")
    assert type(mask & torch.ones(4, dtype=torch.bool)) is torch.Tensor
    assert torch.equal(mask & torch.ones(4, dtype=torch.bool), want)
    assert torch.equal(mask[:, :, 1:], want[:, :, 1:])
    assert torch.equal(torch.where(mask, 1.0, 0.0), want.float())
    assert torch.equal(mask.to(torch.float32), want.float())


def test_from_explicit_ranges():
    ranges = torch.tensor([[0, 2], [3, 5], [1, 0], [6, 4]], dtype=torch.int64)
    mask = PaddingMask(ranges, 5, 6, causal="bottom_right")
    assert mask.ranges.dtype == torch.int32 and mask.ranges.tolist() == ranges.tolist()
    keep = mask._materialize()
    # entry 0: queries 0..2, keys 1..5, the last query sees every key, the first all but two
    assert keep[0, 0, 2].tolist() == [False, True, True, True, True, True]
    assert keep[0, 0, 0].tolist() == [False, True, True, True, False, False]
    assert not keep[0, 0, 3:].any() and not keep[1, 0, :2].any()
    # out of range values are clamped on the device; an end before its start is empty
    wild = PaddingMask(torch.tensor([[-4], [99], [5], [2]], dtype=torch.int32), 5, 6)
    assert wild.ranges.tolist() == [[0], [5], [5], [5]]
    assert not wild._materialize().any()


def test_built_where_the_lengths_are_or_on_the_device_asked():
    lengths = torch.tensor([3, 1], device="meta")
    mask = padding_mask(lengths, 4, 4, side="left")
    assert mask.ranges.device.type == "meta" and mask.device.type == "meta"
    moved = padding_mask(torch.tensor([3, 1]), 4, 4, side="left", device="meta")
    assert moved.ranges.device.type == "meta"


BAD_ARGUMENTS = {
    # keyword arguments over (lengths_k=[3, 1], seq_len_q=4, seq_len_kv=4, side="left"):
    # (error type, text the message names)
    "lengths-list": ({"lengths_k": [3, 1]}, InputTypeError, "lengths_k must be an int32"),
    "lengths-float": ({"lengths_k": torch.tensor([3.0, 1.0])}, InputValueError,
                      "lengths_k must be a 1-dim int32 or int64"),
    "lengths-2d": ({"lengths_k": torch.tensor([[3, 1]])}, InputValueError, "got a torch.int64"),
    "lengths-empty": ({"lengths_k": torch.tensor([], dtype=torch.int32)}, InputValueError,
                      "at least one entry"),
    "lengths_q-batch": ({"lengths_q": torch.tensor([1, 2, 3])}, InputValueError,
                        "lengths_q must have one length per batch entry (2"),
    "lengths_q-device": ({"lengths_q": torch.tensor([1, 2], device="meta")}, InputValueError,
                         "lengths_q must be on lengths_k's device cpu"),
    "seq_len_q-float": ({"seq_len_q": 4.0}, InputTypeError, "seq_len_q must be an int"),
    "seq_len_q-bool": ({"seq_len_q": True}, InputTypeError, "seq_len_q must be an int"),
    "seq_len_kv-zero": ({"seq_len_kv": 0}, InputValueError, "seq_len_kv must be a sequence "
                        "length of at least 1; got 0"),
    "side": ({"side": "top"}, InputValueError, "side must be 'left'"),
    "side-type": ({"side": None}, InputTypeError, "side must be 'left'"),
    "causal": ({"causal": "lower_right"}, InputValueError, "causal must be False, True"),
    "causal-type": ({"causal": 1}, InputTypeError, "got int 1"),
    "device": ({"device": "gpu:x"}, InputValueError, "device must be a torch.device"),
}


@pytest.mark.parametrize("change,error,text", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_name_the_argument(change, error, text):
    args = {"lengths_k": torch.tensor([3, 1]), "seq_len_q": 4, "seq_len_kv": 4, "side": "left",
            **change}
    with pytest.raises(error) as raised:
        padding_mask(args.pop("lengths_k"), args.pop("seq_len_q"), args.pop("seq_len_kv"),
                     **args)
    assert text in str(raised.value)
    assert isinstance(raised.value, TypeError if error is InputTypeError else ValueError)


def test_bad_ranges_name_the_argument():
    with pytest.raises(InputTypeError, match="ranges must be an int32 torch.Tensor"):
        PaddingMask([[0], [1], [0], [1]], 4, 4)
    for bad in (torch.zeros(3, 2, dtype=torch.int32), torch.zeros(4, 0, dtype=torch.int32),
                torch.zeros(4, 2), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(InputValueError, match=r"ranges must be an int32 or int64 tensor "
                                                  r"\[4, B\]"):
            PaddingMask(bad, 4, 4)


# -- torch's SDPA through the mask's dispatch ----------------------------------------------------
def torch_answer(q, k, v, mask, **kwargs):
    """torch's function with the materialised mask; rows that see no key: zeros."""
    keep = mask._materialize(q.device)
    out = TORCH_SDPA(q, k, v, attn_mask=keep, **kwargs)
    return out.masked_fill(~keep.any(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_sdpa_with_the_mask_is_torchs_with_the_boolean_mask(side, causal):
    q, k, v = qkv(b=4, hq=4, hkv=2, sq=9, sk=9)
    mask = padding_mask(torch.tensor([9, 4, 1, 0]), 9, 9, side=side, causal=causal)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert type(out) is torch.Tensor
    assert torch.equal(out, torch_answer(q, k, v, mask, enable_gqa=True))
    # on the rows that see a key, exactly torch's result with the plain boolean mask
    seen = mask._materialize().any(-1)[:, 0]
    plain = TORCH_SDPA(q, k, v, attn_mask=mask._materialize(), enable_gqa=True)
    assert torch.equal(out.transpose(1, 2)[seen], plain.transpose(1, 2)[seen])
    # rows outside an entry's query range, and the entry without keys: zeros
    assert not seen[3].any() and torch.equal(out[3], torch.zeros_like(out[3]))
    positional = F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.3,
                                                enable_gqa=True)
    assert torch.equal(positional, torch_answer(q, k, v, mask, scale=0.3, enable_gqa=True))


def test_the_mask_carries_its_causal_and_refuses_is_causal():
    q, k, v = qkv()
    mask = padding_mask(torch.tensor([9, 4, 1]), 9, 9, side="left")
    with pytest.raises(InputValueError, match="is_causal must be False with a PaddingMask"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with ti.sdpa_kernel(), pytest.raises(InputValueError, match="is_causal must be False"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert ti.router_stats().fallbacks == {"cpu": 1}


def test_sdpa_with_the_mask_is_differentiable():
    q, k, v = qkv(requires_grad=True)
    mask = padding_mask(torch.tensor([9, 4, 1]), 9, 9, side="right", causal=True)
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    torch_answer(*leaves, mask).sum().backward()
    for x, y in zip((q, k, v), leaves):
        assert torch.isfinite(x.grad).all()
        torch.testing.assert_close(x.grad, y.grad)


# -- route_decision --------------------------------------------------------------------------------
def _decide(q, k, v, mask, *, device_types=("cpu",), dropout_p=0.0, enable_gqa=False,
            is_causal=False):
    return ti.route_decision(q, k, v, mask, dropout_p, enable_gqa, is_causal=is_causal,
                             device_types=device_types)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_route_decision_takes_a_padding_mask_of_the_calls_sizes(device):
    q, k, v = qkv(b=3, hq=8, hkv=2, sq=5, sk=40, d=64, dtype=torch.bfloat16, device=device)
    lengths = torch.tensor([40, 7, 0], device=device)
    types = (device,)
    for causal in (False, True, "bottom_right"):
        mask = padding_mask(lengths, 5, 40, side="left", causal=causal)
        assert _decide(q, k, v, mask, device_types=types, enable_gqa=True) is None
        assert _router.causal_alignment(mask, False) == mask.causal
    mask = padding_mask(lengths, 5, 40, side="left")
    for other in (padding_mask(lengths, 4, 40, side="left"),
                  padding_mask(lengths, 5, 41, side="left"),
                  padding_mask(lengths[:2], 5, 40, side="left")):
        assert _decide(q, k, v, other, device_types=types, enable_gqa=True) == "padding_mask"
    assert _decide(q, k, v, mask, device_types=types, enable_gqa=True,
                   is_causal=True) == "padding_mask"
    # the checks before it come first, and those after it still apply
    assert _decide(q, k, v, mask, device_types=types, dropout_p=0.1) == "dropout"
    assert _decide(q, k, v, mask, device_types=("cuda",)) == ("cpu" if device == "cpu"
                                                              else "device")
    assert _decide(q, k, v, mask, device_types=types) == "gqa"
    assert _decide(q, k, v, mask._materialize(), device_types=types,
                   enable_gqa=True) == "attn_mask"


def test_route_decision_wants_the_ranges_on_qs_device():
    q, k, v = qkv(dtype=torch.bfloat16)
    on_meta = padding_mask(torch.tensor([9, 4, 1], device="meta"), 9, 9, side="left")
    assert _decide(q, k, v, on_meta, device_types=("cpu", "meta")) == "padding_mask"


def test_route_decision_leaves_calls_that_require_grad_to_torch():
    q, k, v = qkv(dtype=torch.bfloat16, requires_grad=True)
    mask = padding_mask(torch.tensor([9, 4, 1]), 9, 9, side="left")
    assert _decide(q, k, v, mask) == "padding_mask_grad"
    with torch.no_grad():
        assert _decide(q, k, v, mask) is None
    assert _decide(q, k, v, None) is None  # without the mask, the backward kernels run it


def test_fallback_reasons_are_documented_in_order():
    order = ti.FALLBACK_REASONS
    assert (order.index("shape") < order.index("causal_bias") < order.index("padding_mask")
            < order.index("padding_mask_grad") < order.index("head_dim"))


# -- the router ------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_router_falls_back_on_cpu_tensors_with_torchs_result(side, kernel):
    q, k, v = qkv(b=4, hq=8, hkv=2, sq=9, sk=9, dtype=torch.bfloat16)
    mask = padding_mask(torch.tensor([9, 4, 1, 0]), 9, 9, side=side, causal="bottom_right")
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        scaled = F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, 0.3, enable_gqa=True)
    assert torch.equal(out, expected)
    assert torch.equal(out, torch_answer(q, k, v, mask, enable_gqa=True))
    assert torch.equal(scaled, torch_answer(q, k, v, mask, scale=0.3, enable_gqa=True))
    # the dispatch's call back into F.scaled_dot_product_attention is not counted again
    assert ti.router_stats().fallbacks == {"cpu": 2}
    assert ti.router_stats().tiledattention == 0 and kernel.calls == []


def test_router_falls_back_for_a_mask_of_other_sizes(kernel, cpu_is_kernel_device):
    q, k, v = qkv(b=3, sq=9, sk=9, dtype=torch.bfloat16)
    one = padding_mask(torch.tensor([4]), 9, 9, side="left")  # batch 1: torch broadcasts it
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=one)
    assert torch.equal(out, torch_answer(q, k, v, one))
    assert ti.router_stats().fallbacks == {"padding_mask": 1} and kernel.calls == []


def test_router_falls_back_for_calls_that_require_grad(kernel, cpu_is_kernel_device):
    q, k, v = qkv(b=3, hq=4, hkv=2, dtype=torch.bfloat16, requires_grad=True)
    mask = padding_mask(torch.tensor([9, 4, 1]), 9, 9, side="left", causal="bottom_right")
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out.float().sum().backward()
    assert torch.equal(out.detach(), torch_answer(q, k, v, mask, enable_gqa=True).detach())
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert ti.router_stats().fallbacks == {"padding_mask_grad": 1} and kernel.calls == []


def rows_and_keys(lengths, sq, sk, side):
    """Each entry's valid query rows and keys, on the host, by position."""
    entries = []
    for lk in lengths:
        keys = list(range(sk - lk, sk) if side == "left" else range(lk))
        entries.append(([i for i in range(sq) if i + sk - sq in keys], keys))
    return entries


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("sq,sk", [(9, 9), (1, 9), (3, 11)])
def test_router_runs_the_kernel_with_the_masks_ranges(sq, sk, side, causal, kernel,
                                                      cpu_is_kernel_device):
    q, k, v = qkv(b=4, hq=8, hkv=2, sq=sq, sk=sk, d=64, dtype=torch.bfloat16, seed=sq)
    lengths = [sk, 4, 1, 0]
    mask = padding_mask(torch.tensor(lengths), sq, sk, side=side, causal=causal)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25,
                                             enable_gqa=True)
    assert [(c["causal"], c["scale"], c["q"], c["k"]) for c in kernel.calls] == [
        (mask.causal, 0.25, (4, 8, sq, 64), (4, 2, sk, 64))]
    assert kernel.calls[0]["ranges"] is mask.ranges
    assert [(list(range(q0, q1)), list(range(k0, k1))) for q0, q1, k0, k1
            in mask.ranges.T.tolist()] == rows_and_keys(lengths, sq, sk, side)
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.fallbacks) == (1, {})
    # the kernel's contract (the reference, entry by entry) equals torch's with the mask
    want = torch_answer(q.float(), k.float(), v.float(), mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    seen = mask._materialize().any(-1, keepdim=True)
    assert torch.equal(out.masked_fill(seen, 0.0), torch.zeros_like(out))


def test_router_without_enable_gqa_falls_back_for_grouped_heads(kernel, cpu_is_kernel_device):
    q, k, v = qkv(b=2, hq=8, hkv=2, dtype=torch.bfloat16)
    mask = padding_mask(torch.tensor([9, 4]), 9, 9, side="left")
    with ti.sdpa_kernel(), pytest.raises(RuntimeError):  # torch's own error for the heads
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert ti.router_stats().fallbacks == {"gqa": 1} and kernel.calls == []
