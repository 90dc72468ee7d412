"""Issue 33 end to end (GPU): ragged batches in transformers with
``attn_implementation="tiledattention"`` against ``"sdpa"``, on a Llama-shaped model and a
Mistral-shaped one (sliding window), random weights, a few layers.

    python scripts/hf_ragged_compare.py --out DIR [--steps 5] [--new 32]

- Batched ``generate()``: four prompts of different lengths, left-padded with an attention
  mask, greedy; the backend's counters (every call must run tiledattention) and the tokens of
  each prompt against ``"sdpa"``'s, with sdpa's top-two logit margin where they first differ.
- Padding-free training: ``--steps`` AdamW steps under bf16 autocast on batches of sequences of
  different lengths, packed by transformers' ``DataCollatorWithFlattening`` (``cu_seq_lens_*``)
  for tiledattention and right-padded with an attention mask for ``"sdpa"`` (twice: its own
  run-to-run spread), from the same weights.
Writes ``DIR/hf_ragged.md`` and ``DIR/hf_ragged.json`` and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from _train import train_steps

import tiledattention.integrations as ti

PROMPTS = (700, 513, 130, 9)  # tokens of each prompt (left-padded to the longest)


def config_of(kind: str):
    import transformers

    common = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=4, max_position_embeddings=4096, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=128)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=256)
    return transformers.LlamaConfig(**common)


def model_of(kind: str, implementation: str, dtype=torch.bfloat16):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config_of(kind), attn_implementation=implementation, dtype=dtype)
    return model.cuda()


def generate(kind: str, implementation: str, ids: torch.Tensor, mask: torch.Tensor,
             new: int) -> tuple[list[list[int]], list[list[float]]]:
    model = model_of(kind, implementation).eval()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[:, ids.shape[1]:].tolist()
    margins = [[(s[b].float().topk(2).values[0] - s[b].float().topk(2).values[1]).item()
                for s in out.scores] for b in range(ids.shape[0])]
    return tokens, margins


def train(kind: str, implementation: str, batches: list[list[torch.Tensor]]) -> list[float]:
    model = model_of(kind, implementation, dtype=torch.float32).train()
    return train_steps(model, (batch_of(implementation, seqs) for seqs in batches))


def batch_of(implementation: str, seqs: list[torch.Tensor]) -> dict:
    """The sequences as tiledattention's packed row (``DataCollatorWithFlattening``:
    ``cu_seq_lens``) or as sdpa's right-padded batch with a mask; on the GPU."""
    import transformers

    if implementation == "tiledattention":
        collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        batch = collate([{"input_ids": s.tolist()} for s in seqs])
    else:
        longest = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, :len(s)], mask[i, :len(s)] = s, 1
        batch = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--new", type=int, default=32)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ti.register_hf()
    gen = torch.Generator().manual_seed(0)
    longest = max(PROMPTS)
    ids = torch.zeros(len(PROMPTS), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(PROMPTS):
        ids[i, longest - n:] = torch.randint(3, 4096, (n,), generator=gen)
        mask[i, longest - n:] = 1
    ids, mask = ids.cuda(), mask.cuda()
    batches = [[torch.randint(3, 4096, (int(n),), generator=gen)
                for n in torch.randint(50, 1500, (6,), generator=gen)]
               for _ in range(args.steps)]
    results = {}
    for kind in ("llama", "mistral"):
        ti.reset_hf_stats()
        mine, _ = generate(kind, "tiledattention", ids, mask, args.new)
        stats = ti.hf_stats()
        theirs, margins = generate(kind, "sdpa", ids, mask, args.new)
        firsts = [next((i for i, (a, b) in enumerate(zip(m, t)) if a != b), None)
                  for m, t in zip(mine, theirs)]
        ti.reset_hf_stats()
        losses = {"tiledattention (packed)": train(kind, "tiledattention", batches)}
        train_stats = ti.hf_stats()
        losses["sdpa (padded)"] = train(kind, "sdpa", batches)
        losses["sdpa again"] = train(kind, "sdpa", batches)

        def gap(a: str, b: str) -> float:
            return max(abs(x - y) for x, y in zip(losses[a], losses[b]))
        results[kind] = dict(
            generate_calls=stats.tiledattention, generate_fallbacks=dict(stats.fallbacks),
            train_calls=train_stats.tiledattention, train_fallbacks=dict(train_stats.fallbacks),
            first_difference=firsts,
            sdpa_margin_there=[None if f is None else margins[b][f]
                               for b, f in enumerate(firsts)],
            losses=losses, loss_gap=gap("tiledattention (packed)", "sdpa (padded)"),
            sdpa_spread=gap("sdpa again", "sdpa (padded)"))
        torch.cuda.empty_cache()
    (args.out / "hf_ragged.json").write_text(json.dumps(results, indent=1))
    lines = ["| model | calls (generate / train) | fallbacks | greedy tokens: first differing "
             "from sdpa, per prompt (sdpa's top-two margin there) | max loss gap vs sdpa "
             "(padded) | sdpa's own spread |", "|---|---|---|---|---|---|"]
    for kind, r in results.items():
        fallbacks = {**r["generate_fallbacks"], **r["train_fallbacks"]}
        shown = ", ".join("same" if f is None else f"{f} ({m:.3f})"
                          for f, m in zip(r["first_difference"], r["sdpa_margin_there"]))
        lines.append(f"| {kind} | {r['generate_calls']} / {r['train_calls']} | "
                     f"{sum(fallbacks.values()) or 'none'} | {shown} | {r['loss_gap']:.2e} | "
                     f"{r['sdpa_spread']:.2e} |")
    text = "\n".join(lines) + "\n"
    (args.out / "hf_ragged.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
