"""A Hugging Face model's decode step over a static cache: eager, under
``torch.compile(mode="reduce-overhead", fullgraph=True)`` and as a CUDA graph captured by hand,
with ``attn_implementation="tiledattention"`` and ``"sdpa"`` (issue 49: "reduce-overhead decode
step at most the eager step's time, and within 1.5x of a hand-captured CUDA graph").

A Llama of ``--layers`` layers of Llama-3-8B's shape (hidden 4096, H 32/8, D 128, MLP 14336;
random bf16 weights), a static cache of ``--cache`` slots holding a ``--prompt``-token prefill
(entry 1 of a batch left-padded by 100 tokens), then steps from that position on, each
(attention, form) on a cache of its own and all at the same positions. A round times
``--steps`` steps of each back to back, with no synchronisation inside (the host's time
counted: a generation loop's pace); medians of ``--rounds`` interleaved rounds, µs a step.
Each form's first step's logits are checked against the eager sdpa model's. Run from the
project root:

    python3 docs/records/probes/hf_static_decode.py --batch 1,8 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers

import tiledattention
import tiledattention.integrations as ti

FORMS = ("eager", "compiled", "graph")


def model_of(attn: str, layers: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=16384)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attn, torch_dtype=torch.bfloat16)
    return model.eval()


class Stepper:
    """One model's decode step over a static cache of its own, as one form."""

    def __init__(self, model, form: str, batch: int, prompt: int, cache: int) -> None:
        gen = torch.Generator(device="cuda").manual_seed(1)
        ids = torch.randint(0, 32000, (batch, prompt), device="cuda", generator=gen)
        mask = torch.ones_like(ids)
        if batch > 1:
            mask[1, :100] = 0
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=cache)
        self.prompt = prompt
        with torch.no_grad():
            model(ids, attention_mask=mask, past_key_values=self.cache,
                  cache_position=torch.arange(prompt, device="cuda"))
        self.full = torch.cat((mask, torch.ones_like(mask[:, :1]).expand(-1, cache - prompt)), 1)
        self.token = torch.randint(0, 32000, (batch, 1), device="cuda", generator=gen)
        self.position = torch.tensor([prompt], device="cuda")
        self.model, self.form = model, form
        # one eager step (the graph's capture runs none: every form starts one step on)
        with torch.no_grad():
            self._step(model)
        if form == "compiled":
            self.model = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        elif form == "graph":
            self.graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(self.graph):
                self.captured = self._step(model)

    def _step(self, call) -> torch.Tensor:
        logits = call(self.token, attention_mask=self.full, past_key_values=self.cache,
                      cache_position=self.position).logits[:, -1]
        self.position.add_(1)
        return logits

    def run(self, steps: int) -> tuple[float, torch.Tensor]:
        """The next ``steps`` steps (the cache counts its own offset: no step is repeated):
        µs a step, the first step's logits."""
        form = self.form
        with torch.no_grad():
            first = None
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                if form == "graph":
                    self.graph.replay()
                    logits = self.captured
                else:
                    logits = self._step(self.model)
                if first is None:
                    first = logits.float().clone()
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps * 1e6, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--cache", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--attention", default="tiledattention,sdpa")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ti.register_hf()
    models = {attn: model_of(attn, args.layers) for attn in args.attention.split(",")}
    ran = []
    sdpa = tiledattention.sdpa
    tiledattention.sdpa = lambda *a, **kw: (ran.append(kw.get("ranges") is not None),
                                            sdpa(*a, **kw))[1]
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        steppers = {(attn, form): Stepper(m, form, batch, args.prompt, args.cache)
                    for attn, m in models.items() for form in FORMS}
        ran.clear()  # the prefills' calls (B1's is unpadded: no ranges); count the steps'
        reference = Stepper(model_of("sdpa", args.layers), "eager", batch, args.prompt,
                            args.cache).run(1)[1]
        times = {key: [] for key in steppers}
        for round_ in range(args.rounds + 1):  # round 0 warms: compiles, records, captures
            for (attn, form), stepper in steppers.items():
                us, first = stepper.run(args.steps if round_ else 3)
                if round_:
                    times[attn, form].append(us)
                err = float((first - reference).norm() / reference.norm())
                if not round_:
                    print(f"B{batch} {attn} {form}: first step's logits "
                          f"rel L2 {err:.2e} against sdpa's eager step")
        for attn in models:
            med = {form: statistics.median(times[attn, form]) for form in FORMS}
            rows.append({"batch": batch, "attention": attn, **med})
    print(f"our kernel's calls in the last batch's steps: {len(ran)}, all with ranges: "
          f"{all(ran)}; "
          f"transformers fallbacks (eager calls): {ti.hf_stats().fallbacks}")
    print(f"\n{args.layers} layers, static cache {args.cache}, prompt {args.prompt}, "
          f"{args.steps} steps a round, median of {args.rounds}; µs a step")
    print("| B | attention | eager | reduce-overhead | hand-captured graph "
          "| compiled ÷ eager | compiled ÷ graph |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['attention']} | {r['eager']:.1f} | {r['compiled']:.1f} | "
              f"{r['graph']:.1f} | {r['compiled'] / r['eager']:.2f} | "
              f"{r['compiled'] / r['graph']:.2f} |")
    if args.out:
        with open(f"{args.out}/hf_static_decode.json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
