"""What every attention family's GPU test case shares: random q, k, v of a problem, the float32
reference, an output buffer, the poisoned-output error, and torch's SDPA with one backend pinned
as the baselines. A family's case adds only its launcher."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ._dtypes import FP8_DTYPES, element, torch_dtype
from ._family import Case
from ._reference import attention_reference, visible_keys
from ..errors import UnsupportedOperationError

__all__ = ["AttentionCase", "RaggedCase", "ragged_flops", "ragged_lengths",
           "torch_sdpa_kwargs", "quantise_fp8", "dequantise_fp8"]

#: The largest finite float8_e4m3fn value.
E4M3_MAX = 448.0


def quantise_fp8(x: Any, heads_kv: int) -> tuple[Any, Any]:
    """``x`` (``[B, H, S, D]``, H a multiple of ``heads_kv``) as float8_e4m3fn values and their
    float32 ``[B, H_kv]`` descale factors: each (batch, K/V head group)'s largest magnitude
    maps to e4m3's largest value (the per-head convention of FlashAttention-3 and cuDNN)."""
    import torch

    b, h = x.shape[:2]
    amax = x.float().abs().reshape(b, heads_kv, -1).amax(-1).clamp(min=1e-12)
    descale = (amax / E4M3_MAX).contiguous()
    scaled = x.float() / descale.repeat_interleave(h // heads_kv, 1)[:, :, None, None]
    return scaled.to(torch.float8_e4m3fn), descale


def dequantise_fp8(x: Any, descale: Any) -> Any:
    """The float32 values that e4m3 ``x`` and its ``[B, H_kv]`` ``descale`` stand for."""
    group = x.shape[1] // descale.shape[1]
    return x.float() * descale.repeat_interleave(group, 1)[:, :, None, None]


def torch_sdpa_kwargs(problem: Any) -> dict[str, Any]:
    """``F.scaled_dot_product_attention`` keywords for ``problem``'s mask and heads:
    ``is_causal`` (top-left), or for bottom-right alignment ``attn_mask=causal_lower_right(S_q,
    S_k)`` (a mask object: build it once, outside any timing; torch runs it on its flash and
    efficient backends only), for a window the materialised boolean mask (what transformers
    passes; the efficient and math backends take it), and ``enable_gqa=True`` when H_q != H_kv (left out otherwise:
    torch < 2.5 has no such argument)."""
    kwargs: dict[str, Any] = {}
    if problem.softcap > 0 or problem.sinks:
        raise UnsupportedOperationError(f"torch's SDPA has no softcap or sinks: "
                                        f"{problem.describe()}")
    if problem.windowed:  # what transformers does for a sliding window: a materialised mask
        import torch

        kwargs["attn_mask"] = visible_keys(problem, torch.device("cuda"))
    elif problem.bottom_right:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(problem.seqlen_q, problem.seqlen_k)
    else:
        kwargs["is_causal"] = problem.causal
    if problem.heads_q != problem.heads_kv:
        kwargs["enable_gqa"] = True
    return kwargs


def poisoned_error(out: Any, reference: Any, run: Callable[[], None]) -> float:
    """Fill ``out`` with NaN, ``run()`` once, and return its relative L2 error against the
    float32 ``reference`` (``nan`` where ``run`` left a row unwritten)."""
    import torch

    out.fill_(float("nan"))
    run()
    diff = torch.linalg.vector_norm(out.float() - reference)
    return (diff / torch.linalg.vector_norm(reference)).item()


def _bind(case: Any, problem: Any, device_index: int) -> tuple[Any, Any]:
    """Set a case's problem and device (made current); its inputs' torch dtype and their
    random generator (seed 1234)."""
    import torch

    case.problem = problem
    case.device_index = device_index
    torch.cuda.set_device(device_index)
    dtype = torch_dtype(problem.dtype)
    return dtype, torch.Generator(device="cuda").manual_seed(1234)


class AttentionCase(Case):
    """Random q, k, v (seed 1234) of ``problem`` on CUDA device ``device_index``, the float32
    reference and an output buffer like q."""

    def __init__(self, problem: Any, device_index: int) -> None:
        import torch

        dtype, gen = _bind(self, problem, device_index)

        def rand(heads: int, seqlen: int) -> torch.Tensor:
            return torch.randn(problem.batch, heads, seqlen, problem.head_dim, dtype=dtype,
                               device="cuda", generator=gen)

        # FP8 inputs (or an FP8 K/V cache): the float32 [B, H_kv] descale factors of q, k,
        # v (q's ones for 16-bit queries)
        self.descales = None
        if problem.dtype in FP8_DTYPES:
            dtype = torch.bfloat16  # drawn in bf16, then quantised
        self.q = rand(problem.heads_q, problem.seqlen_q)
        self.k = rand(problem.heads_kv, problem.seqlen_k)
        self.v = rand(problem.heads_kv, problem.seqlen_k)
        quantised = (self.q, self.k, self.v) if problem.dtype in FP8_DTYPES else \
            (self.k, self.v) if problem.kv_dtype else ()
        if quantised:
            factors = [quantise_fp8(x, problem.heads_kv) for x in quantised]
            if len(factors) == 2:  # 16-bit queries: no factor of their own
                factors.insert(0, (self.q, torch.ones(problem.batch, problem.heads_kv,
                                                      device="cuda")))
            (self.q, q_d), (self.k, k_d), (self.v, v_d) = factors
            self.descales = (q_d, k_d, v_d)
        # sink logits of the size of the scores' row maxima, so they weigh in the softmax
        self.sinks = (torch.randn(problem.heads_q, device="cuda", generator=gen) + 2.0
                      if problem.sinks else None)
        # FP8: against the dequantised inputs (what the kernel is asked to compute)
        q, k, v = (self.q, self.k, self.v) if self.descales is None else (
            dequantise_fp8(x, d) for x, d in zip((self.q, self.k, self.v), self.descales))
        self.reference = attention_reference(q, k, v, problem, sinks=self.sinks)
        self.out = torch.empty(self.q.shape, device="cuda",
                               dtype=torch_dtype(element(problem.dtype).output_name))

    def error(self, run: Callable[[], None]) -> float:
        return poisoned_error(self.out, self.reference, run)

    def baselines(self) -> Mapping[str, Callable[[], Any]]:
        """torch's cuDNN and flash backends (what the tuner stores beside each row); for a
        window, torch's SDPA with the materialised mask on its efficient backend (what
        transformers does); none for a softcap or sinks (torch's SDPA has neither). FP8
        inputs or an FP8 cache: the same backends on the dequantised values in the output's
        dtype (torch's SDPA takes no FP8; what a user without FP8 kernels would run)."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = self.q, self.k, self.v
        if self.problem.softcap > 0 or self.problem.sinks:
            return {}
        if self.descales is not None:
            q, k, v = (dequantise_fp8(x, d).to(self.out.dtype) if x.dtype != self.out.dtype
                       else x for x, d in zip((q, k, v), self.descales))
        kwargs = torch_sdpa_kwargs(self.problem)

        def backend(which: SDPBackend) -> Callable[[], Any]:
            def run() -> Any:
                with sdpa_kernel(which):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
            return run

        if self.problem.windowed:
            # transformers repeats the K/V heads (repeat_kv) before SDPA with a mask; the
            # efficient backend takes no grouped heads
            group = self.problem.group_size
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            kwargs.pop("enable_gqa", None)
            return {"torch-efficient-mask": backend(SDPBackend.EFFICIENT_ATTENTION)}
        return {"torch-cudnn": backend(SDPBackend.CUDNN_ATTENTION),
                "torch-flash": backend(SDPBackend.FLASH_ATTENTION)}


def ragged_flops(problem: Any) -> float:
    """The work of a ragged problem's case (:func:`ragged_lengths`): ``4·H_q·D`` per attended
    (query, key) pair of each sequence, its mask aligned by its own lengths."""
    import dataclasses

    total = 0
    for n in ragged_lengths(problem):
        keys = max(1, n * problem.seqlen_k // problem.seqlen_q)
        one = dataclasses.replace(problem, batch=1, seqlen_q=n, seqlen_k=keys, ragged=False)
        total += one.attended_pairs
    return 4.0 * problem.heads_q * problem.head_dim * total


def ragged_lengths(problem: Any) -> list[int]:
    """The sequence lengths a ragged problem's case measures (``problem.ragged``: a bucket):
    ``problem.batch`` sequences cycling through 1, 3/4, 1/2 and 1/4 of the bucket's longest
    query length (at least one each), so the batch mixes long and short sequences as real ones
    do, deterministically."""
    longest = problem.seqlen_q
    return [max(1, longest * (4 - i % 4) // 4) for i in range(problem.batch)]


class RaggedCase(Case):
    """A ragged problem's GPU case: packed q, k, v of :func:`ragged_lengths` (keys as long as
    queries, scaled by ``S_k / S_q``), the float32 reference sequence by sequence, and an
    output buffer; ``launch(ragged_layout, q, k, v, out)`` is the family's."""

    def __init__(self, problem: Any, device_index: int) -> None:
        import torch

        from ._ragged import RaggedLayout, packed_ranges
        from ._reference import varlen_reference

        dtype, gen = _bind(self, problem, device_index)
        lens_q = ragged_lengths(problem)
        lens_k = [max(1, n * problem.seqlen_k // problem.seqlen_q) for n in lens_q]
        cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + lens_k, device="cuda").cumsum(0).to(torch.int32)

        def rand(tokens: int, heads: int) -> torch.Tensor:
            return torch.randn(tokens, heads, problem.head_dim, dtype=dtype, device="cuda",
                               generator=gen)
        self.q = rand(sum(lens_q), problem.heads_q)
        self.k = rand(sum(lens_k), problem.heads_kv)
        self.v = rand(sum(lens_k), problem.heads_kv)
        self.sinks = (torch.randn(problem.heads_q, device="cuda", generator=gen) + 2.0
                      if problem.sinks else None)
        if problem.sinks or problem.softcap > 0:
            raise UnsupportedOperationError(f"no ragged case with a softcap or sinks yet: "
                                            f"{problem.describe()}")
        self.reference = varlen_reference(
            self.q, self.k, self.v, cu_q, cu_k, causal=problem.causal,
            bottom_right=problem.bottom_right, window=(problem.window_left, problem.window_right))
        self.out = torch.zeros_like(self.q)
        self.cu_seq_q, self.cu_seq_k = cu_q, cu_k
        self.layout = RaggedLayout(packed_ranges(cu_q, cu_k), max(lens_q), max(lens_k), True)

    @staticmethod
    def view(x: Any) -> Any:
        """``[tokens, H, D]`` as the kernels' ``[1, H, tokens, D]``."""
        return x.unsqueeze(0).transpose(1, 2)

    def error(self, run: Callable[[], None]) -> float:
        return poisoned_error(self.out, self.reference, run)


def paged_lengths(problem: Any) -> list[int]:
    """The cache lengths a paged problem's case measures (``problem.page_size``: a bucket):
    ``problem.batch`` entries cycling through 1, 3/4, 1/2 and 1/4 of the bucket's longest cache
    (at least ``S_q`` each), as a continuous batch mixes long and short caches."""
    longest = problem.seqlen_k
    return [max(problem.seqlen_q, longest * (4 - i % 4) // 4) for i in range(problem.batch)]


def paged_flops(problem: Any) -> float:
    """The work of a paged problem's case (:func:`paged_lengths`): ``4·H_q·D`` per attended
    (query, key) pair of each entry, its queries the last of its keys."""
    import dataclasses

    total = sum(dataclasses.replace(problem, batch=1, seqlen_k=n, ragged=False,
                                    page_size=0).attended_pairs
                for n in paged_lengths(problem))
    return 4.0 * problem.heads_q * problem.head_dim * total


class PagedCase(Case):
    """A paged problem's GPU case: ``q [B, H_q, S_q, D]``, K/V pools holding the caches of
    :func:`paged_lengths` in shuffled pages (NaN in every unused page and past each length, -1
    in unused block-table slots), the int32 block table and ``seqused_k``, the float32
    reference entry by entry (each entry's queries the last of its keys) and an output
    buffer. An FP8 cache (``kv_dtype``): each entry's keys and values drawn in q's dtype and
    quantised with its own per-head factors (``descales``: q's ones, k's and v's, float32
    ``[B, H_kv]``; NaN stays NaN), the reference over the dequantised values."""

    def __init__(self, problem: Any, device_index: int) -> None:
        import dataclasses

        import torch

        dtype, gen = _bind(self, problem, device_index)
        if problem.sinks or problem.softcap > 0:
            raise UnsupportedOperationError(f"no paged case with a softcap or sinks yet: "
                                            f"{problem.describe()}")
        page, hkv, d = problem.page_size, problem.heads_kv, problem.head_dim
        lengths = paged_lengths(problem)
        need = [-(-n // page) for n in lengths]
        order = torch.randperm(sum(need) + 1, generator=gen, device="cuda")  # one spare page
        self.k_pages = torch.full((sum(need) + 1, page, hkv, d), float("nan"), dtype=dtype,
                                  device="cuda")
        self.v_pages = torch.full_like(self.k_pages, float("nan"))
        self.table = torch.full((problem.batch, max(need)), -1, dtype=torch.int32,
                                device="cuda")
        self.seqused = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        self.q = torch.randn(problem.batch, problem.heads_q, problem.seqlen_q, d, dtype=dtype,
                             device="cuda", generator=gen)
        self.reference = torch.empty(self.q.shape, dtype=torch.float32, device="cuda")
        self.descales = None
        if problem.kv_dtype:
            self.k_pages, self.v_pages = (x.to(torch_dtype(problem.kv_dtype))
                                          for x in (self.k_pages, self.v_pages))
            self.descales = tuple(torch.ones(problem.batch, hkv, device="cuda")
                                  for _ in range(3))
        used = 0
        for b, (n, pages) in enumerate(zip(lengths, need)):
            ids = order[used:used + pages]
            used += pages
            self.table[b, :pages] = ids.to(torch.int32)
            k, v = (torch.randn(n, hkv, d, dtype=dtype, device="cuda", generator=gen)
                    for _ in range(2))
            if problem.kv_dtype:  # this entry's per-head factors; k, v as stored
                (k, self.descales[1][b]), (v, self.descales[2][b]) = (
                    (x8[0].transpose(0, 1), f[0])
                    for x8, f in (quantise_fp8(x.transpose(0, 1)[None], hkv) for x in (k, v)))
            for i in range(pages):
                rows = slice(i * page, min((i + 1) * page, n))
                self.k_pages[ids[i], :rows.stop - rows.start] = k[rows]
                self.v_pages[ids[i], :rows.stop - rows.start] = v[rows]
            one = dataclasses.replace(problem, batch=1, seqlen_k=n, ragged=False, page_size=0,
                                      kv_dtype="")
            k, v = (x.transpose(0, 1)[None] for x in (k, v))  # [1, H_kv, n, D]
            if problem.kv_dtype:
                k, v = (dequantise_fp8(x, f[b:b + 1]) for x, f in zip((k, v), self.descales[1:]))
            self.reference[b] = attention_reference(self.q[b:b + 1], k, v, one)[0]
        self.out = torch.empty_like(self.q)

    def error(self, run: Callable[[], None]) -> float:
        return poisoned_error(self.out, self.reference, run)
