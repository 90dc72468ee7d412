"""Issue 32 end to end (GPU): Mistral-, Gemma-2- and GPT-OSS-shaped transformers models (random
weights, a few layers) with ``attn_implementation="tiledattention"`` against ``"eager"``.

    python scripts/hf_variants_compare.py --out DIR [--steps 5] [--prompt 700] [--new 48]

For each model: ``generate()`` greedy from the same prompt (longer than the sliding window, so
the window binds in the prefill and in every decode step) with both implementations, the
backend's counters (every attention call must run tiledattention: no fallback), the tokens,
where they first differ and how far apart eager's two best logits were there; then ``--steps`` AdamW steps under bf16 autocast from the same
weights on the same batches, tiledattention vs eager and eager vs eager again (its own
run-to-run spread) and vs ``"sdpa"``'s (where transformers has it for the model). Writes
``DIR/hf_variants.md`` and ``DIR/hf_variants.json`` and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from _train import train_steps

import tiledattention.integrations as ti

WINDOW = 256


def config_of(kind: str):
    import transformers

    common = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=4, max_position_embeddings=4096, sliding_window=WINDOW)
    if kind == "mistral":  # every layer local; H 32/8 at D 128 would be 4096 wide: 8/2 here
        return transformers.MistralConfig(**common, num_attention_heads=8,
                                          num_key_value_heads=2, head_dim=128)
    if kind == "gemma2":  # alternating local / global layers, softcap 50, D 256
        return transformers.Gemma2Config(**common, num_attention_heads=8, num_key_value_heads=4,
                                         head_dim=256, query_pre_attn_scalar=256,
                                         attn_logit_softcapping=50.0)
    # GPT-OSS: alternating 128-token windows and full layers, sinks, D 64, grouped heads; every
    # token goes to all 4 experts, so the router's top-k cannot turn a rounding difference
    # into another expert (a discrete jump that says nothing of attention)
    return transformers.GptOssConfig(**{**common, "sliding_window": 128},
                                     num_attention_heads=16, num_key_value_heads=2, head_dim=64,
                                     num_local_experts=4, num_experts_per_tok=4)


def model_of(kind: str, implementation: str, dtype=torch.bfloat16):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config_of(kind), attn_implementation=implementation, dtype=dtype)
    if kind == "gpt_oss":  # sinks of the size of real ones (they start at zero)
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, mean=1.0, std=0.5)
    return model.cuda()


def generate(kind: str, implementation: str, prompt: torch.Tensor, new: int,
             dtype=torch.bfloat16) -> tuple[list[int], list[float]]:
    """Greedy tokens, and each step's margin between the two largest logits (a step whose
    margin is within rounding can flip between two correct implementations)."""
    model = model_of(kind, implementation, dtype).eval()
    with torch.no_grad():
        # the mask is given: generate() otherwise derives one from the pad token, and a prompt
        # of random ids may hold it (Gemma 2's pad id is 0), which masks a key in every call
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=new, do_sample=False, min_new_tokens=new,
                             cache_implementation="dynamic", output_scores=True,
                             return_dict_in_generate=True)
    top2 = [score[0].float().topk(2).values for score in out.scores]
    return (out.sequences[0, prompt.shape[1]:].tolist(),
            [(t[0] - t[1]).item() for t in top2])


def train(kind: str, implementation: str, batches: list[torch.Tensor],
          autocast: bool = True) -> list[float]:
    model = model_of(kind, implementation, dtype=torch.float32).train()
    return train_steps(model, (dict(input_ids=ids, labels=ids) for ids in batches), autocast)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=700)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ti.register_hf()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 4096, (1, args.prompt), generator=gen).cuda()
    batches = [torch.randint(0, 4096, (2, 1024), generator=gen).cuda()
               for _ in range(args.steps)]
    results = {}
    for kind in ("mistral", "gemma2", "gpt_oss"):
        if args.only and kind not in args.only:
            continue
        ti.reset_hf_stats()
        mine, _ = generate(kind, "tiledattention", prompt, args.new)
        stats = ti.hf_stats()
        theirs, margins = generate(kind, "eager", prompt, args.new)
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        # eager in float32: the reference both bf16 runs are measured against (eager's own
        # softmax runs in bf16 for some models: GPT-OSS's with its sinks)
        exact, _ = generate(kind, "eager", prompt, args.new, dtype=torch.float32)

        def agree(tokens: list[int]) -> str:
            at = next((i for i, (a, b) in enumerate(zip(tokens, exact)) if a != b), None)
            return "all" if at is None else f"first {at}"
        vs_fp32 = {"tiledattention": agree(mine), "eager": agree(theirs)}
        try:  # torch's SDPA against eager: how far two correct implementations agree
            sdpa_tokens, _ = generate(kind, "sdpa", prompt, args.new)
            sdpa_first = next((i for i, (a, b) in enumerate(zip(sdpa_tokens, theirs))
                               if a != b), "none")
            vs_fp32["sdpa"] = agree(sdpa_tokens)
        except (ValueError, NotImplementedError):
            sdpa_first = "n/a"
        ti.reset_hf_stats()
        losses = {"tiledattention": train(kind, "tiledattention", batches)}
        train_stats = ti.hf_stats()
        losses["eager"] = train(kind, "eager", batches)
        losses["eager again"] = train(kind, "eager", batches)
        losses["eager fp32"] = train(kind, "eager", batches, autocast=False)
        try:
            losses["sdpa"] = train(kind, "sdpa", batches)
        except (ValueError, NotImplementedError) as exc:  # a model without an SDPA path
            losses["sdpa"] = str(exc)[:80]

        def gap(a: str, b: str) -> float | None:
            if isinstance(losses[a], str) or isinstance(losses[b], str):
                return None
            return max(abs(x - y) for x, y in zip(losses[a], losses[b]))
        results[kind] = dict(
            generate_calls=stats.tiledattention, generate_fallbacks=dict(stats.fallbacks),
            train_calls=train_stats.tiledattention, train_fallbacks=dict(train_stats.fallbacks),
            tokens_equal=mine == theirs, first_difference=first, tokens=len(mine),
            eager_margin_there=None if first is None else margins[first],
            sdpa_first_difference=sdpa_first, tokens_vs_fp32_eager=vs_fp32,
            loss_gap_vs_fp32={name: gap(name, "eager fp32") for name in losses
                              if name != "eager fp32"},
            losses=losses, loss_gap_vs_eager=gap("tiledattention", "eager"),
            eager_spread=gap("eager again", "eager"), sdpa_vs_eager=gap("sdpa", "eager"))
        torch.cuda.empty_cache()
    (args.out / "hf_variants.json").write_text(json.dumps(results, indent=1))
    lines = ["| model | calls (generate / train) | fallbacks | greedy tokens = eager | "
             "sdpa's tokens: first differing | max loss gap vs eager | eager's own spread | "
             "sdpa vs eager |", "|---|---|---|---|---|---|---|---|"]
    for kind, r in results.items():
        fallbacks = {**r["generate_fallbacks"], **r["train_fallbacks"]}
        same = ("yes" if r["tokens_equal"] else
                f"no (first differs at {r['first_difference']} of {r['tokens']}, where "
                f"eager's top two logits are {r['eager_margin_there']:.3f} apart)")

        def fmt(x):
            return "n/a" if x is None else f"{x:.2e}"
        lines.append(f"| {kind} | {r['generate_calls']} / {r['train_calls']} | "
                     f"{sum(fallbacks.values()) or 'none'} | {same} | "
                     f"{r['sdpa_first_difference']} | "
                     f"{fmt(r['loss_gap_vs_eager'])} | {fmt(r['eager_spread'])} | "
                     f"{fmt(r['sdpa_vs_eager'])} |")
    lines += ["", "Against eager in float32 (greedy tokens that agree; largest loss gap over the "
              "steps, training without autocast):", "",
              "| model | run | tokens agreeing with fp32 eager | max loss gap vs fp32 eager |",
              "|---|---|---|---|"]
    for kind, r in results.items():
        for name, gap_ in r["loss_gap_vs_fp32"].items():
            agreeing = r["tokens_vs_fp32_eager"].get(name, "")
            lines.append(f"| {kind} | {name} | {agreeing} | "
                         f"{'n/a' if gap_ is None else f'{gap_:.2e}'} |")
    text = "\n".join(lines) + "\n"
    (args.out / "hf_variants.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
