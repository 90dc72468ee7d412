"""Issue 31 end to end (GPU): a random-weight Hugging Face Llama (GQA 32/8, D 128, a few layers)
trained with ``attn_implementation="tiledattention"`` against ``"sdpa"``, from the same weights
on the same batches, under bf16 autocast with AdamW.

    python scripts/hf_training_compare.py --out DIR [--steps 200] [--layers 4] [--seq 4096]

Runs: tiledattention; sdpa (torch picks its backend) twice, for its own run-to-run spread; sdpa
with torch's flash backend pinned (torch's cross-backend spread). Tokens per second count the
steps after the first ``WARMUP`` (kernel compiles and allocator warm-up excluded), synchronised.
Writes ``DIR/hf_losses.csv`` (per-step losses), ``DIR/hf_training.md`` (tokens/s, loss
differences) and ``DIR/hf_losses.png``; prints the summary last.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import time
from pathlib import Path

import torch

import tiledattention.integrations as ti
from tuner.bench import PlotsUnavailable, new_figure, save_png

WARMUP = 10
LR = 1e-4  # a fine-tuning rate: at 1e-3 AdamW on a random model amplifies rounding chaotically
DATASET = 32  # sequences, cycled: the model can fit them, so the loss moves


def config(layers: int, seq: int) -> dict:
    return dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=seq, attention_dropout=0.0,
                tie_word_embeddings=False)


def train(transformers, cfg: dict, weights: dict, data: torch.Tensor, steps: int, batch: int,
          implementation: str, backend=None) -> tuple[list[float], float]:
    """Per-step losses and tokens/s (steps after ``WARMUP``)."""
    from torch.nn.attention import sdpa_kernel

    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**cfg), attn_implementation=implementation)
    model.load_state_dict(weights)
    model = model.to("cuda").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    pin = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext
    losses, start = [], None
    for step in range(steps):
        if step == WARMUP:
            torch.cuda.synchronize()
            start = time.perf_counter()
        ids = data[[(batch * step + i) % DATASET for i in range(batch)]]
        with pin(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        with pin():
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del model, optimizer
    torch.cuda.empty_cache()
    return [x.item() for x in losses], (steps - WARMUP) * batch * data.shape[1] / seconds


def plot_losses(losses: dict[str, list[float]], path: Path) -> None:
    """The per-step loss of each run (a small palette PNG)."""
    fig = new_figure(figsize=(6, 3.2), layout="tight")
    ax = fig.subplots()
    for name, values in losses.items():
        ax.plot(values, label=name, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    save_png(fig, path, palette=True)


def main() -> int:
    import transformers
    from torch.nn.attention import SDPBackend

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ti.register_hf()
    cfg = config(args.layers, args.seq)
    torch.manual_seed(0)
    weights = {k: t.detach().clone() for k, t in
               transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randint(0, cfg["vocab_size"], (DATASET, args.seq), device="cuda", generator=gen)
    runs = {}
    ti.reset_hf_stats()
    runs["tiledattention"] = train(transformers, cfg, weights, data, args.steps, args.batch,
                                   "tiledattention")
    stats = ti.hf_stats()
    runs["sdpa"] = train(transformers, cfg, weights, data, args.steps, args.batch, "sdpa")
    runs["sdpa (again)"] = train(transformers, cfg, weights, data, args.steps, args.batch, "sdpa")
    runs["sdpa, flash pinned"] = train(transformers, cfg, weights, data, args.steps, args.batch,
                                       "sdpa", SDPBackend.FLASH_ATTENTION)
    names = list(runs)
    with open(args.out / "hf_losses.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step", *names])
        for step in range(args.steps):
            writer.writerow([step, *(f"{runs[n][0][step]:.6f}" for n in names)])

    def diff(a: str, b: str) -> tuple[float, float]:
        d = [abs(x - y) for x, y in zip(runs[a][0], runs[b][0])]
        return (sum(x * x for x in d) / len(d)) ** 0.5, max(d)

    lines = [f"Llama config: {cfg}; batch {args.batch} x {args.seq} tokens, {args.steps} AdamW "
             f"steps (lr {LR}), bf16 autocast; tiledattention served {stats.tiledattention} "
             f"attention calls, torch {stats.torch}.", "",
             "| run | tokens/s | first loss | last loss |", "|---|---|---|---|"]
    for n in names:
        losses, tps = runs[n]
        lines.append(f"| {n} | {tps:,.0f} | {losses[0]:.4f} | {losses[-1]:.4f} |")
    lines += ["", "| pair | RMS loss difference | largest |", "|---|---|---|"]
    for a, b in (("tiledattention", "sdpa"), ("sdpa (again)", "sdpa"),
                 ("sdpa, flash pinned", "sdpa"), ("tiledattention", "sdpa, flash pinned")):
        rms, top = diff(a, b)
        lines.append(f"| {a} vs {b} | {rms:.2e} | {top:.2e} |")
    (args.out / "hf_training.md").write_text("\n".join(lines) + "\n")
    try:
        plot_losses({n: runs[n][0] for n in names}, args.out / "hf_losses.png")
    except PlotsUnavailable as exc:
        print(f"no plot: {exc}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
