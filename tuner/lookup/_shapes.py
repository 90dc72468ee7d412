"""Two held-out sets of forward problems, none of them a key of a shipped table.

``FITTING`` is what the lookup's fallback policy is designed on; ``REPORT`` is only measured.
Both mix grouped-query prefill of real models, vision and speech sequence lengths, odd lengths,
batch 1 to 64, long context and head dims that are not powers of two (80, 96, 192, 40, 72).
The model names say where a shape comes from; the numbers are what is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiledattention import Problem

from ..errors import TunerValueError

__all__ = ["HeldOutShape", "FITTING", "REPORT", "shape_set"]


@dataclass(frozen=True)
class HeldOutShape:
    name: str
    problem: Problem


def _p(name: str, b: int, hq: int, hkv: int, sq: int, sk: int, d: int, causal: bool | str,
       dtype: str = "bf16") -> HeldOutShape:
    return HeldOutShape(name, Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq,
                                      seqlen_k=sk, head_dim=d, dtype=dtype,
                                      causal=bool(causal),
                                      bottom_right=causal == "bottom_right"))


FITTING: tuple[HeldOutShape, ...] = (
    _p("Llama-3-8B prefill", 1, 32, 8, 3000, 3000, 128, True),
    _p("Llama-3-70B, one of 8 tensor-parallel ranks", 4, 8, 1, 2048, 2048, 128, True),
    _p("Mistral-7B chunked prefill", 1, 32, 8, 512, 4608, 128, "bottom_right"),
    _p("Qwen2-7B", 2, 28, 4, 1500, 1500, 128, True),
    _p("Phi-3-mini", 4, 32, 32, 1337, 1337, 96, True),
    _p("Phi-2", 8, 32, 32, 700, 700, 80, True),
    _p("StableLM-3B", 2, 32, 32, 4096, 4096, 80, True),
    _p("ViT-L/14 at 224", 64, 16, 16, 257, 257, 64, False),
    _p("ViT-H/14 at 224", 32, 16, 16, 257, 257, 80, False),
    _p("Whisper-large encoder", 8, 20, 20, 1500, 1500, 64, False),
    _p("Gemma-2-9B", 1, 16, 8, 8192, 8192, 256, True),
    _p("Llama-3-8B, 32k context", 1, 32, 8, 32768, 32768, 128, True),
    _p("Falcon-7B (multi-query)", 4, 71, 1, 2048, 2048, 64, True),
    _p("head dim 192", 2, 16, 16, 2048, 2048, 192, True),
    _p("Stable Diffusion 1.5 UNet, 64x64 latents", 8, 8, 8, 4096, 4096, 40, False),
    _p("Flux joint attention", 1, 24, 24, 4608, 4608, 128, False),
    _p("DiT-XL/2", 32, 16, 16, 256, 256, 72, False),
    _p("Conformer encoder", 16, 8, 8, 999, 999, 64, False),
    # second round (added after the first report-set run, whose worst shapes were short
    # non-causal head dims 72 and 80): more encoder shapes of those head dims and of 96 and 128,
    # with and without a ragged last tile
    _p("BEiT-style ViT at 448", 16, 16, 16, 1025, 1025, 80, False),
    _p("ViT-H/14 at 280", 32, 16, 16, 401, 401, 80, False),
    _p("Perceiver-style cross-attention", 8, 16, 16, 1024, 4096, 96, False),
    _p("head dim 96 encoder", 4, 32, 32, 1999, 1999, 96, False),
    _p("DiT-XL/2 at 512", 16, 16, 16, 1024, 1024, 72, False),
    _p("head dim 72 encoder, ragged", 16, 16, 16, 900, 900, 72, False),
    _p("Phi-3-mini, batch 8", 8, 32, 32, 700, 700, 96, True),
    _p("head dim 128 encoder, ragged", 16, 16, 16, 577, 577, 128, False),
    _p("Phi-3-mini, short prompts", 16, 32, 32, 300, 300, 96, True),
)

REPORT: tuple[HeldOutShape, ...] = (
    _p("Llama-3-8B prefill, batch 4", 4, 32, 8, 1777, 1777, 128, True),
    _p("Llama-3-8B, 16k context", 1, 32, 8, 16000, 16000, 128, True),
    _p("Mistral-7B chunked prefill, long cache", 1, 32, 8, 1024, 9000, 128, "bottom_right"),
    _p("Qwen2.5-14B", 2, 40, 8, 2500, 2500, 128, True),
    _p("Phi-3-mini, long prompt", 2, 32, 32, 3000, 3000, 96, True),
    _p("Phi-3-mini, batch 16", 16, 32, 32, 512, 512, 96, True),
    _p("StableLM-2-1.6B", 4, 32, 32, 2000, 2000, 80, True),
    _p("ViT-H/14 at 336", 16, 16, 16, 577, 577, 80, False),
    _p("ViT-L/14 at 336", 32, 16, 16, 577, 577, 64, False),
    _p("Whisper decoder cross-attention", 8, 20, 20, 448, 1500, 64, False),
    _p("Gemma-7B", 2, 16, 16, 3000, 3000, 256, True),
    _p("head dim 192, long", 1, 32, 32, 6000, 6000, 192, True),
    _p("multi-query, batch 8", 8, 32, 1, 1000, 1000, 128, True),
    _p("SigLIP-so400m", 64, 16, 16, 729, 729, 72, False),
    _p("SDXL UNet, 64x64 latents", 2, 10, 10, 4096, 4096, 64, False),
    _p("40k context, 16/2 heads", 1, 16, 2, 40000, 40000, 128, True),
    _p("Llama-3-8B prefill, fp16", 4, 32, 8, 2222, 2222, 128, True, "fp16"),
    _p("ViT-B/16", 64, 12, 12, 197, 197, 64, False),
)

_SETS = {"fitting": FITTING, "report": REPORT}


def shape_set(name: str) -> tuple[HeldOutShape, ...]:
    """``"fitting"``, ``"report"`` or ``"both"``."""
    if name == "both":
        return FITTING + REPORT
    try:
        return _SETS[name]
    except KeyError:
        raise TunerValueError(f"shape set must be 'fitting', 'report' or 'both'; got "
                              f"{name!r}") from None
