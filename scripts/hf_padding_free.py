"""Padding-free Hugging Face training (issue 50, GPU): tokens per second of a random-weight
BERT-like encoder (masked LM) and a Llama-like decoder (causal LM) trained with
``attn_implementation="tiledattention"`` on packed rows (transformers'
``DataCollatorWithFlattening``: ``cu_seq_lens_*``, no padding) against ``"sdpa"`` on the same
sequences right-padded with an attention mask, from the same weights and data.

    python scripts/hf_padding_free.py --out DIR [--steps 200] [--models bert,llama]
    python scripts/hf_padding_free.py --warm bert|llama   # compile the packed kernels only

A step is a forward and backward under bf16 autocast and an AdamW update (float32 weights).
Timing: ``--warm-steps`` untimed steps (the kernels' compiles), then ``--steps`` steps timed as a
whole from a drained GPU to the last step's end (host time counted: a training loop as a user
runs it). Tokens per second count real tokens only (a padded batch's padding is not a token).
Each model's batches draw their lengths once (seeded), so both runs see the same sequences.
Writes ``DIR/hf_padding_free.json`` and ``DIR/hf_padding_free.md`` and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

#: The two models: their transformers config, the kind of model, and how a step's sequences are
#: drawn (``lengths``: (low, high, log-uniform); ``tokens``: the real tokens a step packs).
MODELS = {
    # BERT-base's shape; no attention dropout (the kernels have none; padding-free encoders
    # train without it)
    "bert": dict(config=dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                             num_attention_heads=12, intermediate_size=3072,
                             max_position_embeddings=512, attention_probs_dropout_prob=0.0),
                 lengths=(30, 512, False), tokens=16384),
    # a small Llama (8 layers, H 16/4, D 128): SFT-like lengths, log-uniform
    "llama": dict(config=dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=8,
                              num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                              intermediate_size=5632, max_position_embeddings=8192),
                  lengths=(64, 4096, True), tokens=12288),
}
MASK_ID = 103  # BERT's [MASK]


def model_of(name: str, implementation: str) -> torch.nn.Module:
    import transformers

    spec = MODELS[name]
    torch.manual_seed(0)
    if name == "bert":
        model = transformers.AutoModelForMaskedLM.from_config(
            transformers.BertConfig(**spec["config"]), attn_implementation=implementation)
    else:
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.LlamaConfig(**spec["config"]), attn_implementation=implementation)
    return model.cuda().train()


def draw_batches(name: str, steps: int, seed: int, longest: int | None = None) -> list[list[int]]:
    """Per step, the sequences' lengths: drawn until the step holds ``tokens`` real tokens;
    ``longest``: the first sequence of every step has that length (a compile's bucket)."""
    low, high, log = MODELS[name]["lengths"]
    budget = MODELS[name]["tokens"]
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        lengths = [] if longest is None else [longest]
        while sum(lengths) < budget:
            u = torch.rand((), generator=gen).item()
            n = (math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if log
                 else low + u * (high - low))
            lengths.append(int(n))
        batches.append(lengths)
    return batches


def sequences(name: str, lengths: list[int], gen: torch.Generator) -> list[dict]:
    """Random token ids of these lengths, with labels: masked-LM for BERT (15% of positions
    after the first replaced by [MASK] and labelled, the rest -100), the ids for a causal LM."""
    vocab = MODELS[name]["config"]["vocab_size"]
    out = []
    for n in lengths:
        ids = torch.randint(1000, vocab, (n,), generator=gen)
        if name == "bert":
            pick = torch.rand(n, generator=gen) < 0.15
            pick[0] = False
            labels = torch.where(pick, ids, torch.full_like(ids, -100))
            ids = torch.where(pick, torch.full_like(ids, MASK_ID), ids)
        else:
            labels = ids.clone()
        out.append({"input_ids": ids, "labels": labels})
    return out


def packed(samples: list[dict]) -> dict:
    """One row of the sequences end to end, transformers' padding-free form."""
    import transformers

    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    batch = collate([{k: v.tolist() for k, v in s.items()} for s in samples])
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def padded(samples: list[dict]) -> dict:
    """The sequences right-padded into a batch with an attention mask (padding labelled
    -100; each sequence's first label -100 as in the packed row)."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n] = s["input_ids"]
        labels[i, 1:n] = s["labels"][1:]
        mask[i, :n] = 1
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "labels": labels.cuda()}


def run(name: str, implementation: str, batches: list[list[int]], warm: int) -> dict:
    """Train ``warm`` untimed then ``len(batches) - warm`` timed steps; tokens/s, the timed
    steps' losses and peak memory."""
    import tiledattention.integrations as ti
    from tiledattention.tooling import jit_compiles

    model = model_of(name, implementation)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(1)
    make = packed if implementation == "tiledattention" else padded
    inputs = [make(sequences(name, lengths, gen)) for lengths in batches]
    losses: list[torch.Tensor] = []
    ti.reset_hf_stats()
    start = None
    torch.cuda.reset_peak_memory_stats()
    for i, batch in enumerate(inputs):
        if i == warm:
            torch.cuda.synchronize()
            compiled = jit_compiles()[0]
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warm:
            losses.append(loss.detach())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stats = ti.hf_stats()
    tokens = sum(sum(lengths) for lengths in batches[warm:])
    slots = sum(len(lengths) * max(lengths) for lengths in batches[warm:])
    result = dict(implementation=implementation, steps=len(batches) - warm, seconds=seconds,
                  tokens=tokens, tokens_per_s=tokens / seconds,
                  padded_share=1 - tokens / slots if implementation != "tiledattention" else 0,
                  peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                  first_loss=losses[0].item(), last_loss=losses[-1].item(),
                  kernel_calls=stats.tiledattention, fallbacks=dict(stats.fallbacks),
                  compiles_timed=jit_compiles()[0] - compiled)
    del model, opt, inputs
    torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", default="bert,llama")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warm-steps", type=int, default=5)
    parser.add_argument("--warm", choices=sorted(MODELS), help="compile only: a few packed steps")
    args = parser.parse_args(argv)
    import tiledattention.integrations as ti

    ti.register_hf()
    if args.warm:
        high = MODELS[args.warm]["lengths"][1]
        # the buckets a step's longest sequence lands in: every power of two up to the longest
        longest = [high >> i for i in range(4) if (high >> i) >= MODELS[args.warm]["lengths"][0]]
        batches = [b for n in longest for b in draw_batches(args.warm, 1, 7, longest=n)]
        run(args.warm, "tiledattention", batches + batches[-1:], warm=len(batches))
        return 0
    if args.out is None:
        parser.error("--out is required (unless --warm)")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.models.split(","):
        batches = draw_batches(name, args.warm_steps + args.steps, seed=0)
        results[name] = {impl: run(name, impl, batches, args.warm_steps)
                         for impl in ("tiledattention", "sdpa")}
        print(name, json.dumps(results[name]), flush=True)
    (args.out / "hf_padding_free.json").write_text(json.dumps(results, indent=1))
    lines = ["| model | steps | tokens a step | tiledattention, packed: tokens/s | sdpa, padded: "
             "tokens/s | speed-up | padding in sdpa's batches | peak GiB (packed / padded) | "
             "loss, first → last timed step (packed / padded) | kernel calls / fallbacks | "
             "compiles while timed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        a, b = r["tiledattention"], r["sdpa"]
        lines.append(
            f"| {name} | {a['steps']} | {a['tokens'] // a['steps']} | {a['tokens_per_s']:,.0f} | "
            f"{b['tokens_per_s']:,.0f} | {a['tokens_per_s'] / b['tokens_per_s']:.2f}x | "
            f"{b['padded_share']:.0%} | {a['peak_gib']:.1f} / {b['peak_gib']:.1f} | "
            f"{a['first_loss']:.3f} → {a['last_loss']:.3f} / {b['first_loss']:.3f} → "
            f"{b['last_loss']:.3f} | {a['kernel_calls']} / {sum(a['fallbacks'].values())} | "
            f"{a['compiles_timed']} |")
    text = "\n".join(lines) + "\n"
    (args.out / "hf_padding_free.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
