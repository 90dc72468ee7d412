"""A Hugging Face model's decode step over a static cache: eager, under
``torch.compile(mode="reduce-overhead", fullgraph=True)`` and as a CUDA graph captured by hand,
with ``attn_implementation="tiledattention"`` and ``"sdpa"`` (issue 49: "reduce-overhead decode
step at most the eager step's time, and within 1.5x of a hand-captured CUDA graph").

``--model``, of ``--layers`` layers and random bf16 weights: ``llama`` (Llama-3-8B's shape:
hidden 4096, H 32/8, D 128, MLP 14336), ``gemma3`` (Gemma-3-12B's text model: hidden 3840,
H 16/8, D 256, MLP 15360, five layers of a 1024-key sliding window to one global) or
``gpt_oss`` (GPT-OSS-20B's attention: hidden 2880, H 64/8, D 64, sinks, a 128-key window on
alternate layers; 4 experts, 2 a token, not its 32). A static cache of ``--cache`` slots (a
sliding layer's: its window's, rolled each step once full) holding a ``--prompt``-token
prefill (entry 1 of a batch left-padded by 100 tokens), then steps from that position on,
each (attention, form) on a cache of its own and all at the same positions. A round times
``--steps`` steps of each back to back, with no synchronisation inside (the host's time
counted: a generation loop's pace); medians of ``--rounds`` interleaved rounds, µs a step.
Each form's first step's logits are checked against the eager step of the last
``--attention`` (``sdpa``; ``eager`` for ``gpt_oss``, whose sinks SDPA cannot compute). A form
that fails to build (a hand capture of a step transformers cannot capture) is reported, not
timed. Run from the project root:

    python3 docs/records/probes/hf_static_decode.py --batch 1,8 --out $OUT
    python3 docs/records/probes/hf_static_decode.py --model gemma3 --layers 6 --out $OUT
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


def config_of(model: str, layers: int):
    """``model``'s transformers config with ``layers`` layers (the module's docstring)."""
    common = dict(vocab_size=32000, num_hidden_layers=layers, max_position_embeddings=16384)
    if model == "llama":
        return transformers.LlamaConfig(
            **common, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128)
    if model == "gemma3":
        return transformers.Gemma3TextConfig(
            **common, hidden_size=3840, intermediate_size=15360, num_attention_heads=16,
            num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
            sliding_window=1024,
            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                         for i in range(layers)])
    return transformers.GptOssConfig(
        **common, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, sliding_window=128, num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                     for i in range(layers)])


def model_of(model: str, attn: str, layers: int) -> torch.nn.Module:
    config = config_of(model, layers)
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
    parser.add_argument("--model", choices=("llama", "gemma3", "gpt_oss"), default="llama")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--cache", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--attention", default=None,
                        help="attention implementations, the reference's last (default "
                             "tiledattention,sdpa; tiledattention,eager for gpt_oss)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.attention is None:  # transformers' SDPA path cannot compute GPT-OSS's sinks
        args.attention = "tiledattention," + ("eager" if args.model == "gpt_oss" else "sdpa")
    ti.register_hf()
    models = {attn: model_of(args.model, attn, args.layers)
              for attn in args.attention.split(",")}
    last = args.attention.split(",")[-1]  # the reference's attention
    ran = []
    sdpa = tiledattention.sdpa
    tiledattention.sdpa = lambda *a, **kw: (ran.append(kw.get("ranges") is not None),
                                            sdpa(*a, **kw))[1]
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        steppers = {}
        for attn, m in models.items():
            for form in FORMS:
                try:
                    steppers[attn, form] = Stepper(m, form, batch, args.prompt, args.cache)
                except Exception as exc:  # noqa: BLE001 - reported, the form left out
                    print(f"B{batch} {attn} {form}: not built ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]})")
        ran.clear()  # the prefills' calls (B1's is unpadded: no ranges); count the steps'
        reference = Stepper(model_of(args.model, last, args.layers), "eager", batch,
                            args.prompt, args.cache).run(1)[1]
        times = {key: [] for key in steppers}
        for round_ in range(args.rounds + 1):  # round 0 warms: compiles, records, captures
            for (attn, form), stepper in steppers.items():
                us, first = stepper.run(args.steps if round_ else 3)
                if round_:
                    times[attn, form].append(us)
                err = float((first - reference).norm() / reference.norm())
                if not round_:
                    print(f"B{batch} {attn} {form}: first step's logits "
                          f"rel L2 {err:.2e} against {last}'s eager step")
        for attn in models:
            med = {form: statistics.median(times[attn, form]) if times.get((attn, form))
                   else None for form in FORMS}
            rows.append({"batch": batch, "attention": attn, **med})
    print(f"our kernel's calls in the last batch's steps: {len(ran)}, all with ranges: "
          f"{all(ran)}; "
          f"transformers fallbacks (eager calls): {ti.hf_stats().fallbacks}")
    print(f"\n{args.model}, {args.layers} layers, static cache {args.cache}, prompt "
          f"{args.prompt}, {args.steps} steps a round, median of {args.rounds}; µs a step")
    print("| B | attention | eager | reduce-overhead | hand-captured graph "
          "| compiled ÷ eager | compiled ÷ graph |")
    print("|---|---|---|---|---|---|---|")

    def cell(x):
        return "n/a" if x is None else f"{x:.1f}" if x > 10 else f"{x:.2f}"

    for r in rows:
        eager, compiled, graph = r["eager"], r["compiled"], r["graph"]
        print(f"| {r['batch']} | {r['attention']} | {cell(eager)} | {cell(compiled)} | "
              f"{cell(graph)} | {cell(compiled and eager and compiled / eager)} | "
              f"{cell(compiled and graph and compiled / graph)} |")
    if args.out:
        with open(f"{args.out}/hf_static_decode.json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
