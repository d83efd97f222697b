"""``qkv bench generation``: per-token time and memory of generation as the context grows — the
Linear Transformer as an RNN against GPT's KV cache, and the sparse patterns' bounded states (the
Sparse Transformer's strided attention; the Image Transformer's local-1d kernel in a GPT).

Two LMs of the same sizes, neither of which slides its context (GPT with sinusoidal positions, the
Linear Transformer with none, its default): a ``LinearTransformer`` (``linear`` attention, one fixed-size ``LinearState(S, Z)`` per layer) and a
``GPT`` with exact ``softmax`` attention (a KV cache per layer that holds every position). For each
context length ``L`` the prompt is read once (prefill), then the step that ``generate`` repeats
for every new token — the forward of one token with the state, and sampling the next one — is
timed from that state (median of repeats; the state is not mutated, each call returns a new one).
Memory: the bytes of the returned state (what generation carries from token to token) and the
peak memory of one step (``qkv.bench.common.peak_memory``). Katharopoulos et al. 2020 (§3.4):
the RNN's cost per token is constant; the KV cache's grows linearly with ``L``.

Writes ``generation.json``, ``generation.md`` and ``generation.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Dict, List

import torch

from .._errors import UserError
from ..models.sampling import sample_logits
from ..models.transformer.gpt import GPT, GPTConfig
from ..models.transformer.linear_transformer import LinearTransformer, LinearTransformerConfig
from ..models.transformer.sparse_transformer import SparseTransformer, SparseTransformerConfig
from . import common

__all__ = ["add_arguments", "run", "state_bytes"]

DEFAULT_CONTEXTS = [256, 1024, 4096, 16384]
QUICK_CONTEXTS = [64, 256]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``generation`` options (``--quick``, ``--device``, ``--out`` come from ``qkv.bench``)."""
    parser.add_argument("--contexts", nargs="+", type=int, metavar="L",
                        help=f"context lengths (default {' '.join(map(str, DEFAULT_CONTEXTS))}; --quick: "
                             f"{' '.join(map(str, QUICK_CONTEXTS))})")
    parser.add_argument("--d-model", type=int, default=256, help="width (default 256)")
    parser.add_argument("--heads", type=int, default=4, help="heads (default 4)")
    parser.add_argument("--layers", type=int, default=4, help="blocks (default 4)")
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256)")
    parser.add_argument("--batch", type=int, default=1, help="sequences generated at once (default 1)")
    parser.add_argument("--target-seconds", type=float, default=1.0,
                        help="time spent on the timed repeats of one context (at least 5 repeats; default 1)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")


def state_bytes(state: Any) -> int:
    """Bytes of every tensor inside a (nested) state: dataclasses, tuples, lists, dicts. The cached
    content only: a KV cache that grows in place (``KVCache.room``) also holds spare room in its
    buffers, at most as much again."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_bytes(getattr(state, f.name)) for f in dataclasses.fields(state) if f.name != "room")
    if isinstance(state, (tuple, list)):
        return sum(state_bytes(s) for s in state)
    if isinstance(state, dict):
        return sum(state_bytes(s) for s in state.values())
    return 0


def _models(args: argparse.Namespace, max_len: int) -> Dict[str, torch.nn.Module]:
    sizes = dict(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, d_ff=4 * args.d_model,
                 n_layers=args.layers, dropout=0.0, max_len=max_len)
    torch.manual_seed(args.seed)
    # GPT with sinusoids: its learned table would slide (re-read) the context past max_len
    stride = max(1, round(max_len ** 0.5))  # l ~ sqrt(n)
    return {"linear-transformer (RNN state)": LinearTransformer(LinearTransformerConfig(**sizes)).eval(),
            "gpt softmax (KV cache)": GPT(GPTConfig(attention="softmax", positional="sinusoidal", **sizes)).eval(),
            # Child et al. 2019: the state keeps every key (A2 reaches each residue class), a token reads l + n / l
            f"sparse-transformer (strided l={stride}, interleaved)": SparseTransformer(SparseTransformerConfig(
                stride=stride, sparse_mode="interleave", positional="sinusoidal", **sizes)).eval(),
            # Parmar et al. 2018's local-1d kernel: a bounded cache of the block and its memory
            "gpt local-1d (block 128, memory 128)": GPT(GPTConfig(
                attention="local-1d", attention_kwargs={"block": 128, "memory": 128}, positional="sinusoidal",
                **sizes)).eval()}


@torch.no_grad()
def _measure(model: torch.nn.Module, L: int, args: argparse.Namespace, device: torch.device) -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(args.vocab, (args.batch, L), generator=gen).to(device)
    state = model(prompt, return_state=True).state  # prefill: the context is read once
    token = prompt[:, -1:]

    def step() -> None:  # the body of generate's loop: one token with the state, then sampling
        out = model(token, state=state, return_state=True)
        sample_logits(out.logits[:, -1], 1.0, None, None, gen)

    first = common.timed_once(step, device)
    peak = common.peak_memory(step, device)
    timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=5, max_repeats=200,
                               target_seconds=args.target_seconds)
    return {"context": L, "time_median_s": timing.median, "time_min_s": timing.best, "repeats": len(timing.times),
            "state_bytes": state_bytes(state), "step_peak_bytes": peak}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the generation benchmark; writes JSON, markdown and PNG into ``args.out``."""
    device = common.resolve_device(args.device)
    contexts = sorted(set(args.contexts or (QUICK_CONTEXTS if args.quick else DEFAULT_CONTEXTS)))
    if contexts[0] < 1:
        raise UserError(f"--contexts must be positive, got {args.contexts}")
    common.check_lengths("--contexts", contexts)
    for flag in ("d_model", "heads", "layers", "vocab", "batch"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.d_model % args.heads:
        raise UserError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    common.check_range("--target-seconds", args.target_seconds, 0.0)
    machine = common.describe_machine(device)
    print(f"generation on {common.machine_line(machine)}", flush=True)
    models = {name: m.to(device) for name, m in _models(args, max(contexts) + 1).items()}
    results: Dict[str, Any] = {
        "benchmark": "generation", "command": args.command_line, "date": common.now_iso(), "machine": machine,
        "config": {"d_model": args.d_model, "heads": args.heads, "layers": args.layers, "vocab": args.vocab,
                   "batch": args.batch, "contexts": contexts,
                   "parameters": {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
                   "step": "one-token forward with the state + sampling (generate's loop body), after a prefill"},
        "models": {},
    }
    rows: List[List[Any]] = []
    for name, model in models.items():
        points = []
        for L in contexts:
            p = _measure(model, L, args, device)
            points.append(p)
            rows.append([name, L, f"{p['time_median_s'] * 1e3:.2f}", f"{p['state_bytes'] / 2**20:.3f}",
                         f"{p['step_peak_bytes'] / 2**20:.3f}", p["repeats"]])
            print(f"  {name:>32} L={L:>6}: {p['time_median_s'] * 1e3:8.2f} ms/token  state "
                  f"{p['state_bytes'] / 2**20:8.3f} MB  step peak {p['step_peak_bytes'] / 2**20:8.3f} MB", flush=True)
        results["models"][name] = {"points": points}
    table = common.markdown_table(["model", "context", "ms per token (median)", "state MB", "step peak MB", "repeats"],
                                  rows)
    out = Path(args.out)
    common.write_json(out / "generation.json", results)
    cfg = results["config"]
    setup = (f"d_model={cfg['d_model']}, heads={cfg['heads']}, layers={cfg['layers']}, vocab={cfg['vocab']}, "
             f"batch={cfg['batch']}; one step = {cfg['step']}.")
    common.write_markdown(out / "generation.md", "qkv bench generation", machine, args.command_line, results["date"],
                          [setup, table])
    if not args.no_plot:
        series = {name: {"x": [p["context"] for p in rec["points"]],
                         "time": [p["time_median_s"] * 1e3 for p in rec["points"]],
                         "state": [p["state_bytes"] / 2**20 for p in rec["points"]]}
                  for name, rec in results["models"].items()}
        common.plot_loglog(out / "generation.png", series, title="qkv bench generation: per-token cost vs context",
                           panels=[("time", "ms per generated token (median)"), ("state", "state carried, MB")],
                           machine=machine)
    print("\n" + table + f"\n\nwritten to {out}/", flush=True)
    return results
