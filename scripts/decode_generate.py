"""End to end: greedy generation with a random-weight Llama-shaped model in transformers,
``attn_implementation="tiledattention"`` against ``"sdpa"``.

The model has Llama-3-8B's layer shape (hidden 4096, 32 query heads, 8 K/V heads, head dim 128,
MLP 14336, vocab 32000) with few layers (``--layers``, default 4), random weights (no download),
bf16. For each batch size a prompt of ``--prompt`` random tokens generates exactly
``--new-tokens`` tokens (``do_sample=False``, ``min_new_tokens = max_new_tokens``). One model is
built once and switched between the two attention implementations (``set_attn_implementation``),
so both run the same weights. After one warm-up generation each (it also compiles the kernels),
the implementations alternate, A B A B ..., ``--repeats`` times each, and tokens/s is the
generated tokens (batch x new tokens) over the wall time of ``generate`` (the prefill included),
the median over the repeats. Also reported: how many attention calls went to tiledattention (and
why any did not: ``tiledattention.integrations.hf_stats``), and how many of the first
``--check-tokens`` generated tokens the two implementations agree on (the common prefix, the
smallest over the batch rows; random weights give near-flat logits, so bf16 rounding may flip a
greedy choice: reported, never a failure).

    python scripts/decode_generate.py --out decode_generate.json          # on a GPU
    python scripts/decode_generate.py --smoke --device cpu --out /tmp/x.json  # plumbing only

Prints a table last; writes the JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.stdout.reconfigure(line_buffering=True)

IMPLEMENTATIONS = ("tiledattention", "sdpa")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per implementation")
    parser.add_argument("--check-tokens", type=int, default=32,
                        help="compare the first N generated tokens of the two implementations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model, prompt and generation: checks the plumbing on any "
                             "device (CPU calls fall back to transformers' SDPA); no timings "
                             "worth reading")
    parser.add_argument("--out", default="decode_generate.json", help="JSON output file")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.smoke:
        args.layers, args.prompt, args.new_tokens = 2, 48, 8
        args.check_tokens = min(args.check_tokens, args.new_tokens)
    if min(args.layers, args.prompt, args.new_tokens, args.repeats, *args.batches) < 1:
        parser.error("--layers, --prompt, --new-tokens, --repeats and --batches must be >= 1")
    return args


def build_model(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    size = (dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=32, vocab_size=1000) if args.smoke else
            dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000))
    config = LlamaConfig(num_hidden_layers=args.layers,
                         max_position_embeddings=args.prompt + args.new_tokens + 16,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, **size)
    torch.manual_seed(args.seed)
    with torch.device(args.device):  # random init on the device: no fp32 copy on the host
        model = LlamaForCausalLM(config)
    return model.to(dtype=torch.bfloat16).eval(), config


def set_attention(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):  # transformers >= 4.56
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    assert model.config._attn_implementation == name, model.config._attn_implementation


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def generate(model, prompt: torch.Tensor, new_tokens: int, device: str):
    """(generated tokens [B, new_tokens], seconds)."""
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    sync(device)
    seconds = time.perf_counter() - start
    generated = out[:, prompt.shape[1]:]
    assert generated.shape[1] == new_tokens, generated.shape
    return generated.cpu(), seconds


def agreement(a: torch.Tensor, b: torch.Tensor, first: int) -> dict:
    """Common prefix of the two generations within the first ``first`` tokens: per row and
    the smallest; and the count of equal positions there."""
    a, b = a[:, :first], b[:, :first]
    equal = a == b
    prefixes = [int(row.long().cumprod(0).sum()) for row in equal]
    return dict(first=int(a.shape[1]), common_prefix=min(prefixes),
                common_prefix_per_row=prefixes, equal_positions=int(equal.sum()),
                positions=int(equal.numel()))


def run_batch(model, args, batch: int, vocab: int, stats_fn, reset_fn) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(args.seed + batch)
    prompt = torch.randint(3, vocab, (batch, args.prompt), generator=gen).to(args.device)
    record = {name: dict(seconds=[], tokens_per_s=[], stats=None) for name in IMPLEMENTATIONS}
    first_tokens = {}
    for name in IMPLEMENTATIONS:  # warm-up: compiles and caches every kernel the run needs
        set_attention(model, name)
        generate(model, prompt, args.new_tokens, args.device)
        print(f"  B={batch} warm-up {name} done")
    for repeat in range(args.repeats):
        for name in IMPLEMENTATIONS:  # A, B, A, B, ...: drift hits both alike
            set_attention(model, name)
            reset_fn()
            tokens, seconds = generate(model, prompt, args.new_tokens, args.device)
            stats = stats_fn()
            rate = batch * args.new_tokens / seconds
            record[name]["seconds"].append(seconds)
            record[name]["tokens_per_s"].append(rate)
            record[name]["stats"] = dict(tiledattention=stats.tiledattention, torch=stats.torch,
                                         fallbacks=dict(stats.fallbacks))
            first_tokens.setdefault(name, tokens)
            print(f"  B={batch} run {repeat + 1} {name}: {seconds:.3f} s, {rate:.1f} tokens/s, "
                  f"attention calls to tiledattention {stats.tiledattention}, "
                  f"to torch {stats.torch} {dict(stats.fallbacks) or ''}")
    for name in IMPLEMENTATIONS:
        record[name]["median_tokens_per_s"] = statistics.median(record[name]["tokens_per_s"])
    record["agreement"] = agreement(first_tokens["tiledattention"], first_tokens["sdpa"],
                                    args.check_tokens)
    record["speedup"] = (record["tiledattention"]["median_tokens_per_s"]
                         / record["sdpa"]["median_tokens_per_s"])
    return record


def environment(args) -> dict:
    import transformers

    env = dict(torch=torch.__version__, transformers=transformers.__version__,
               python=platform.python_version(), device=args.device)
    if torch.device(args.device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    try:
        from importlib.metadata import version

        env["cuda_tile"] = version("cuda-tile")
    except Exception:  # noqa: BLE001 - a version we cannot read is left out
        pass
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    import tiledattention.integrations as ti

    ti.register_hf()
    model, config = build_model(args)
    layers = config.num_hidden_layers
    print(f"model: {layers} layers, hidden {config.hidden_size}, heads "
          f"{config.num_attention_heads}/{config.num_key_value_heads}, head dim "
          f"{config.head_dim}, vocab {config.vocab_size}, bf16, random weights; prompt "
          f"{args.prompt}, {args.new_tokens} new tokens")
    results = {}
    for batch in args.batches:
        results[str(batch)] = run_batch(model, args, batch, config.vocab_size, ti.hf_stats,
                                        ti.reset_hf_stats)
    report = dict(script="scripts/decode_generate.py", argv=sys.argv[1:],
                  date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), environment=environment(args),
                  model=dict(layers=layers, hidden=config.hidden_size,
                             heads_q=config.num_attention_heads,
                             heads_kv=config.num_key_value_heads, head_dim=config.head_dim,
                             vocab=config.vocab_size, dtype="bf16"),
                  prompt=args.prompt, new_tokens=args.new_tokens, repeats=args.repeats,
                  # per generate: the prefill (one call per layer), then one call per layer for
                  # each of the new tokens after the first (the prefill yields the first)
                  expected_attention_calls=layers * args.new_tokens,
                  batches=results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")

    print()
    print(f"| B | tiledattention tok/s | sdpa tok/s | speed-up | calls to tiledattention "
          f"(of {layers * args.new_tokens}) | fallbacks | first {args.check_tokens} tokens "
          f"agree |")
    print("|---|---|---|---|---|---|---|")
    for batch, r in results.items():
        ta, sd, agree = r["tiledattention"], r["sdpa"], r["agreement"]
        print(f"| {batch} | {ta['median_tokens_per_s']:.1f} | {sd['median_tokens_per_s']:.1f} | "
              f"{r['speedup']:.3f} | {ta['stats']['tiledattention']} | "
              f"{ta['stats']['fallbacks'] or '-'} | {agree['common_prefix']}/{agree['first']} "
              f"(equal positions {agree['equal_positions']}/{agree['positions']}) |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
