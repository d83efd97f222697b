"""``qkv bench gpt``: training tokens/s of a small qkv GPT against the same GPT built from
``torch.nn.TransformerEncoderLayer``.

Both models have the same sizes (vocabulary, d_model, heads, d_ff, layers, context), the same
wiring (pre-LN: ``norm_first=True``, final LayerNorm, GELU, learned positions, output tied to the
token embedding) and the same weights (the baseline's are copied into qkv with
``qkv.models.transformer.stack.copy_torch_layer``; the losses are compared before timing). The baseline runs
its layers with a causal mask and ``is_causal=True``; qkv's softmax kernel takes
``F.scaled_dot_product_attention(is_causal=True)`` with no dense mask. One training step is
forward, loss, backward and an AdamW update; the two steps are timed interleaved (same load) and
reported as tokens/s and the ratio ``qkv / torch`` of tokens/s (>= 1: qkv is not slower).

Writes ``gpt.json`` and ``gpt.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Dict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._errors import UserError
from ..models.transformer.gpt import GPT, GPTConfig
from ..models.transformer.stack import copy_torch_layer
from . import common

__all__ = ["add_arguments", "run", "TorchGPT"]

#: default sizes (a "small" character-level GPT) and the --quick ones.
SIZES = dict(vocab=256, d_model=256, heads=8, d_ff=1024, layers=4, length=128, batch=4)
SIZES_QUICK = dict(vocab=64, d_model=64, heads=4, d_ff=256, layers=2, length=64, batch=4)


class TorchGPT(nn.Module):
    """The baseline: token + learned position embeddings, ``nn.TransformerEncoder`` of pre-LN
    ``nn.TransformerEncoderLayer`` s with a causal mask, final LayerNorm, tied output."""

    def __init__(self, vocab: int, d_model: int, heads: int, d_ff: int, layers: int, length: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(length, d_model)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.token.weight
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(length), persistent=False)

    def forward(self, ids: Tensor, labels: Tensor) -> Tensor:
        L = ids.shape[1]
        x = self.dropout(self.token(ids) + self.position(torch.arange(L, device=ids.device)))
        h = self.encoder(x, mask=self.causal[:L, :L], is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def qkv_from_torch(baseline: TorchGPT, config: GPTConfig) -> GPT:
    """A qkv GPT holding the baseline's weights."""
    model = GPT(config)
    with torch.no_grad():
        model.stack.embed.token.weight.copy_(baseline.token.weight)
        model.stack.embed.positional.embedding.weight.copy_(baseline.position.weight)
        for block, layer in zip(model.stack.layers, baseline.encoder.layers):
            copy_torch_layer(block, layer)
        model.stack.final_norm.load_state_dict(baseline.encoder.norm.state_dict())
    return model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``gpt`` options (``--quick``, ``--device``, ``--threads``, ``--out`` come from ``qkv.bench``)."""
    for name, value in SIZES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name,
                            help=f"{name} (default {value}; --quick: {SIZES_QUICK[name]})")
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout of both models (default 0)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--target-seconds", type=float, default=20.0,
                        help="time spent on the timed rounds (at least 7 rounds; default 20)")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Time both training steps; writes ``gpt.json`` and ``gpt.md`` into ``args.out``."""
    device = common.resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    sizes = {k: getattr(args, k, None) if getattr(args, k, None) is not None else (SIZES_QUICK if args.quick else SIZES)[k]
             for k in SIZES}
    for k, v in sizes.items():
        if v < 1:
            raise UserError(f"--{k} must be >= 1, got {v}")
    if sizes["d_model"] % sizes["heads"]:
        raise UserError(f"--d-model {sizes['d_model']} must be divisible by --heads {sizes['heads']}")
    common.check_lengths("--length", [sizes["length"]])
    common.check_range("--dropout", args.dropout, 0.0, 1.0, below_maximum=True)
    common.check_range("--target-seconds", args.target_seconds, 0.0)
    machine = common.describe_machine(device)
    print(f"gpt on {common.machine_line(machine)}", flush=True)

    torch.manual_seed(args.seed)
    baseline = TorchGPT(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["d_ff"], sizes["layers"],
                        sizes["length"], args.dropout)
    config = GPTConfig(vocab_size=sizes["vocab"], max_len=sizes["length"], n_layers=sizes["layers"],
                       d_model=sizes["d_model"], n_heads=sizes["heads"], d_ff=sizes["d_ff"], dropout=args.dropout)
    ours = qkv_from_torch(baseline, config)
    models = {"qkv": ours.to(device=device, dtype=dtype), "torch": baseline.to(device=device, dtype=dtype)}
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(sizes["vocab"], (sizes["batch"], sizes["length"] + 1), generator=gen).to(device)
    inputs, labels = ids[:, :-1], ids[:, 1:]

    losses = {"qkv": lambda: ours(inputs, labels=labels).loss, "torch": lambda: baseline(inputs, labels)}
    for m in models.values():
        m.eval()
    with torch.no_grad():
        diff = abs(losses["qkv"]().item() - losses["torch"]().item())
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}

    def step(name: str) -> Callable[[], None]:
        def train_step() -> None:
            optimizers[name].zero_grad(set_to_none=True)
            losses[name]().backward()
            optimizers[name].step()
        return train_step

    for m in models.values():
        m.train()
    timings = common.time_interleaved({name: step(name) for name in models}, device, warmup=2, min_repeats=7,
                                      max_repeats=60, target_seconds=args.target_seconds)
    tokens = sizes["batch"] * sizes["length"]
    tps = {name: tokens / t.median for name, t in timings.items()}
    ratio = tps["qkv"] / tps["torch"]
    ratio_min = timings["torch"].best / timings["qkv"].best
    params = sum(p.numel() for p in ours.parameters())
    results: Dict[str, Any] = {
        "benchmark": "gpt",
        "command": args.command_line,
        "date": common.now_iso(),
        "machine": machine,
        "config": {**sizes, "dropout": args.dropout, "dtype": args.dtype, "parameters": params,
                   "step": "forward + loss + backward + AdamW", "timing": "median of interleaved rounds"},
        "tokens_per_s": tps,
        "timings": {name: t.as_dict() for name, t in timings.items()},
        "ratio": ratio,
        "ratio_of_min": ratio_min,
        "initial_loss_abs_diff": diff,
    }
    table = common.markdown_table(
        ["model", "ms / step", "tokens/s"],
        [[name, f"{timings[name].median * 1e3:.1f}", f"{tps[name]:,.0f}"] for name in models])
    summary = (f"qkv / torch tokens/s = **{ratio:.3f}** (of fastest rounds {ratio_min:.3f}); "
               f"{params:,} parameters; vocab {sizes['vocab']}, d_model {sizes['d_model']}, heads {sizes['heads']}, "
               f"d_ff {sizes['d_ff']}, layers {sizes['layers']}, batch {sizes['batch']} x length {sizes['length']}; "
               f"{args.dtype}; same weights (|loss difference| {diff:.1e}).")
    out = Path(args.out)
    common.write_json(out / "gpt.json", results)
    common.write_markdown(out / "gpt.md", "qkv bench gpt", machine, args.command_line, results["date"],
                          [summary, table])
    print("\n" + table + "\n\n" + summary + f"\n\nwritten to {out}/", flush=True)
    return results
