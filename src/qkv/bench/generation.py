"""``qkv bench generation``: per-token time and memory of generation as the context grows — the
Linear Transformer as an RNN against GPT's KV cache, the sparse patterns' bounded states, or a real
pretrained model with each attention kernel (``--model``).

Without ``--model``: small LMs of the same sizes, none of which slides its context (GPT with
sinusoidal positions, the Linear Transformer with none, its default): a ``LinearTransformer``
(``linear`` attention, one fixed-size ``LinearState(S, Z)`` per layer), a ``GPT`` with exact
``softmax`` attention (a KV cache per layer that holds every position), the Sparse Transformer's
strided attention and the Image Transformer's local-1d kernel in a GPT. Each reads a prompt of
``L`` random ids (prefill).

With ``--model PATH`` (a qkv ``save_pretrained`` directory or run directory, a transformers
Llama-family checkpoint, or ``smollm2`` for the cached SmolLM2-135M-Instruct, ``qkv data fetch
smollm2``): the same weights with each ``--attention`` kernel (``with_attention``; default the
model's own kernel and ``softmax``; a kernel's own parameters that the checkpoint lacks start
fresh, those of the checkpoint's kernel that the other lacks are dropped — both listed in the
JSON). The state at context ``L`` (``state_built`` of each row):

* ``L <= --prefill-tokens``: a real prefill — the model reads ``L`` random token ids (seeded) in
  one forward pass; the state is the model's own.
* ``L > --prefill-tokens = P``: a real prefill of ``P`` tokens, then the state extended to ``L``
  positions without reading them (``extend_state``): a KV cache that holds every position gets
  ``L``, position ``p`` holding the prefill's key and value of position ``p mod P``, the key
  turned by the rotary angle of ``p - p mod P`` (each cached key carries its own position's
  rotation, as the kernel caches them); a bounded cache (window kernels) keeps its length, its
  positions moved to end at ``L``; a recurrent state of fixed size (``LinearState``,
  ``RecurrentState``) keeps its tensors (the sums over the ``P`` tokens read), its count of
  positions set to ``L``. The stack's position becomes ``L``: the decoded token sits at position
  ``L`` (rotary angle, cache offset) as after a prompt of ``L`` tokens. The decoded step is the
  real one at every row; only the content of the state beyond ``P`` is synthetic.

Per row, in both modes: the step that ``generate`` repeats for every new token — the forward of
one token with the state (the last position's logits) and sampling the next — run as
``generate`` runs it, each step continuing from the state the previous one returned (a KV cache
appended in place), so the repeats decode positions ``L, L + 1, ...``; warm-up steps first, then
the median of the timed repeats. Memory: the bytes of the state at ``L`` (what generation carries
from token to token; the tensors' content — a KV cache appended in place holds spare room in its
buffers besides, at most as much again), its growth over one decoded token, and the peak memory
of one step (``qkv.bench.common.peak_memory``). Katharopoulos et al. 2020 (§3.4): the RNN's cost
per token is constant; the KV cache's grows linearly with ``L``.

``--model`` also reports the prefill throughput (tokens/s of the one timed forward pass that read
the prompt) and the largest context that fits in ``--memory-budget``: the model's weights
(parameters and buffers, each storage once) plus the state, taken as ``state(L) + growth x (n -
L)`` from the longest context measured; a growth of 0 bytes per token (a state of constant size)
is "unbounded by the state" (the step's activations and the positions then bound it).

Writes ``generation.json``, ``generation.md`` and ``generation.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .._errors import UserError
from .._values import guess_value
from ..models.sampling import sample_logits
from ..models.transformer.gpt import GPT, GPTConfig
from ..models.transformer.linear_transformer import LinearTransformer, LinearTransformerConfig
from ..models.transformer.sparse_transformer import SparseTransformer, SparseTransformerConfig
from ..models.transformer.stack import BlockState, StackState
from ..registry import lookup
from ..rotary import RotaryEmbedding, apply_rotary
from ..types import KVCache, LinearState, RecurrentState
from . import common

__all__ = ["add_arguments", "run", "state_bytes", "extend_state", "with_attention", "load_model", "prefill",
           "decode_step", "parse_bytes", "largest_context"]

DEFAULT_CONTEXTS = [256, 1024, 4096, 16384]
QUICK_CONTEXTS = [64, 256]
#: --model: the issue's contexts, and the longest prompt read by a real prefill
MODEL_CONTEXTS = [2048, 8192, 32768]
PREFILL_TOKENS = 2048
MEMORY_BUDGET = "4GiB"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``generation`` options (``--quick``, ``--device``, ``--out`` come from ``qkv.bench``)."""
    parser.add_argument("--contexts", nargs="+", type=int, metavar="L",
                        help=f"context lengths (default {' '.join(map(str, DEFAULT_CONTEXTS))}, with --model "
                             f"{' '.join(map(str, MODEL_CONTEXTS))}; --quick: {' '.join(map(str, QUICK_CONTEXTS))})")
    parser.add_argument("--model", metavar="PATH",
                        help="a real model: a qkv save_pretrained or run directory, a transformers Llama-family "
                             "checkpoint, or 'smollm2' (the cached SmolLM2-135M-Instruct); the sizes below are then "
                             "the model's")
    parser.add_argument("--attention", nargs="+", metavar="NAME[:KWARGS]",
                        help="with --model: the kernels to build the model's weights with, e.g. softmax linear "
                             "'window:{\"radius\": 63}' (default: the model's own kernel and softmax)")
    parser.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS,
                        help=f"with --model: the longest prompt a real prefill reads; a longer context is that "
                             f"prefill's state extended (default {PREFILL_TOKENS})")
    parser.add_argument("--memory-budget", default=MEMORY_BUDGET, metavar="SIZE",
                        help=f"with --model: the memory whose largest context is reported, weights + state, "
                             f"e.g. 4GiB, 500MB (default {MEMORY_BUDGET})")
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


def parse_bytes(text: str) -> int:
    """``"4GiB"``, ``"500 MB"``, ``"1e9"`` -> bytes (``kB``/``MB``/``GB``/``TB``: powers of 1000;
    ``KiB``/``MiB``/``GiB``/``TiB``: of 1024); a ``ValueError`` for anything else."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text), re.IGNORECASE)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"a memory size must be a number and a unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), "
                         f"got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not 1 <= value < 2**63:
        raise ValueError(f"a memory size must be at least 1 byte, got {text!r}")
    return int(value)


# ----------------------------------------------------------------------------- the generation step


@torch.no_grad()
def prefill(model: torch.nn.Module, ids: Tensor) -> Tuple[Tensor, StackState]:
    """Read the prompt ``ids (B, L)`` in one forward pass, as ``generate`` reads it: the last
    position's logits ``(B, V)`` and the state to continue from."""
    out = model(ids, return_state=True, logits_to_keep=1)
    return out.logits[:, -1], out.state


@torch.no_grad()
def decode_step(model: torch.nn.Module, token: Tensor, state: StackState) -> Tuple[Tensor, StackState]:
    """The step ``generate`` repeats: the forward of ``token (B, 1)`` with ``state``; returns the
    next-token logits ``(B, V)`` and the state after it (``state`` itself may be appended to in place)."""
    out = model(token, state=state, return_state=True, logits_to_keep=1)
    return out.logits[:, -1], out.state


def _measure(model: torch.nn.Module, state: StackState, logits: Tensor, args: argparse.Namespace,
             device: torch.device) -> Dict[str, Any]:
    """Time the decoding step from ``state`` (the context read; ``logits`` its last position's),
    each step continuing from the previous one's state, as ``generate`` does."""
    gen = torch.Generator().manual_seed(args.seed)
    token = sample_logits(logits, 1.0, None, None, gen)[:, None]
    at_context = state_bytes(state)
    logits, state = decode_step(model, token, state)  # the first step: the state's growth over one token
    growth = state_bytes(state) - at_context
    chain = {"state": state, "token": sample_logits(logits, 1.0, None, None, gen)[:, None]}

    def step() -> None:  # the body of generate's loop: one token with the state, then sampling
        logits, chain["state"] = decode_step(model, chain["token"], chain["state"])
        chain["token"] = sample_logits(logits, 1.0, None, None, gen)[:, None]

    first = common.timed_once(step, device)
    peak = common.peak_memory(step, device)
    timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=5, max_repeats=200,
                               target_seconds=args.target_seconds)
    return {"time_median_s": timing.median, "time_min_s": timing.best, "repeats": len(timing.times),
            "state_bytes": at_context, "state_growth_bytes_per_token": growth, "step_peak_bytes": peak}


# ----------------------------------------------------------------------------- a state at a longer context


def extend_state(state: StackState, context: int, rotary: Optional[RotaryEmbedding] = None) -> StackState:
    """The state a prefill of ``P = state.position`` tokens returned, extended to ``context >= P``
    positions without reading them (the module docstring): a KV cache that holds every position
    gets ``context``, position ``p`` holding the key and value of ``p mod P`` (keys turned by
    ``rotary`` from their source's angle to ``p``'s); a bounded cache keeps its length, moved to
    end at ``context``; a ``LinearState`` or ``RecurrentState`` keeps its tensors, its count of
    positions moved on. Any other state is refused (``ValueError``)."""
    if not isinstance(state, StackState):
        raise TypeError(f"state must be the StackState a prefill returned, got {type(state).__name__}")
    P = state.position
    if P < 1 or isinstance(context, bool) or not isinstance(context, int) or context < P:
        raise ValueError(f"context must be an int >= the prefill's {P} positions (at least 1), got {context!r}")
    layers = []
    for i, block in enumerate(state.layers):
        if not isinstance(block, BlockState) or block.cross_kv is not None:
            raise ValueError(f"layer {i}: only a decoder's self-attention state can be extended, got {block!r:.80}")
        layers.append(dataclasses.replace(block, self_attn=_extend(block.self_attn, P, context, rotary, f"layer {i}")))
    return StackState(tuple(layers), context)


def _extend(s: Any, P: int, L: int, rotary: Optional[RotaryEmbedding], where: str) -> Any:
    if s is None:
        return None
    if isinstance(s, KVCache):
        S, first = s.length, s.offset
        if first + S != P:
            raise ValueError(f"{where}: the KV cache ends at position {first + S}, not at the prefill's {P}")
        if first == 0:  # every position cached: L of them, cycled over the P read
            target = torch.arange(L, device=s.key.device)
            source = target % P
        else:  # a bounded cache: the same length, moved to end at L
            target = torch.arange(L - S, L, device=s.key.device)
            source = target - (L - P)
        key = s.key.index_select(-2, source - first)  # (B, H, positions, E)
        if rotary is not None:
            key = _turn(key, target - source, rotary)
        return KVCache(key, s.value.index_select(-2, source - first), L - key.shape[-2])
    if isinstance(s, (LinearState, RecurrentState)):
        if s.summed is not None:
            raise ValueError(f"{where}: a {type(s).__name__} with masked keys (summed) cannot be extended")
        return dataclasses.replace(s, length=s.length + L - P)
    if isinstance(s, (tuple, list)):
        return type(s)(_extend(x, P, L, rotary, where) for x in s)
    if dataclasses.is_dataclass(s) and not isinstance(s, type):  # a state of states (LoLCATs': sums + a window cache)
        parts = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
        inner = {k: v for k, v in parts.items() if isinstance(v, (KVCache, LinearState, RecurrentState))}
        if inner and all(isinstance(v, (KVCache, LinearState, RecurrentState)) or v is None for v in parts.values()):
            return dataclasses.replace(s, **{k: _extend(v, P, L, rotary, where) for k, v in inner.items()})
    raise ValueError(f"{where}: a {type(s).__name__} state cannot be extended to a longer context; read the whole "
                     f"context (--prefill-tokens at least the context)")


def _turn(key: Tensor, shift: Tensor, rotary: RotaryEmbedding) -> Tensor:
    """``key (B, H, N, E)``, rotated at its positions, turned on by ``shift (N,)`` more positions:
    ``R(s + shift) = R(shift) R(s)``. Angles in float64; the scaling's attention factor, already in
    the key, is not applied again."""
    angle = shift.to(torch.float64)[:, None] * rotary.theta.to(device=key.device, dtype=torch.float64)  # (N, E/2)
    angle = torch.cat([angle, angle], dim=-1)  # (N, E)
    return apply_rotary(key, angle.cos().to(key.dtype), angle.sin().to(key.dtype))


# ----------------------------------------------------------------------------- a real model, each kernel


def load_model(path: str) -> GPT:
    """The decoder ``--model`` names: ``smollm2`` (the cached SmolLM2-135M-Instruct), a qkv run
    directory (its ``model/``; a ``qkv linearize`` directory: its last stage's), or a directory ``QKVModel.from_pretrained`` reads (qkv's or a
    transformers checkpoint)."""
    from ..models.base import QKVModel

    if path == "smollm2":
        from ..tasks.data import smollm2_dir

        try:
            folder = smollm2_dir()
        except FileNotFoundError as err:
            raise UserError(f"--model smollm2: {err}") from None
    else:
        from ..runs.directory import final_run

        folder = final_run(Path(path))  # a linearization (qkv linearize): its last stage's run
        if not (folder / "config.json").is_file() and (folder / "model" / "config.json").is_file():
            folder = folder / "model"  # a qkv run directory
    try:
        model = QKVModel.from_pretrained(folder)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(f"--model {path}: {err}") from None
    if not isinstance(model, GPT) or model.config.head != "lm":
        raise UserError(f"--model {path}: a decoder language model (gpt, llama, ...) is measured, got a "
                        f"{type(model).__name__}")
    return model.eval()


def _attention_spec(text: str) -> Tuple[str, Optional[Dict[str, Any]]]:
    """``NAME`` or ``NAME:{kwargs}`` -> ``(name, kwargs or None)``."""
    name, _, rest = text.partition(":")
    try:
        lookup("attention", name.strip())
    except UserError as err:
        raise UserError(f"--attention {text!r}: {err}") from None
    if not rest:
        return name.strip(), None
    kwargs = guess_value(rest)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise UserError(f"--attention {text!r}: after the colon, the kernel's keyword arguments as a dict, "
                        f"e.g. 'window:{{\"radius\": 63}}'")
    return name.strip(), kwargs


def with_attention(model: GPT, attention: str, attention_kwargs: Optional[Dict[str, Any]] = None
                   ) -> Tuple[GPT, Dict[str, List[str]]]:
    """``model``'s weights in a model of the same config with the kernel ``attention`` (its
    ``attention_kwargs``; None: the model's own when the kernel is the model's, else the kernel's
    defaults) -> ``(model, {"fresh": [...], "dropped": [...]})``: the new kernel's own parameters
    that ``model`` lacks (initialised) and ``model``'s that the new one has no place for. The
    model itself when nothing changes."""
    c = model.config
    if attention_kwargs is None:
        attention_kwargs = dict(c.attention_kwargs) if attention == c.attention else {}
    if attention == c.attention and attention_kwargs == c.attention_kwargs:
        return model, {"fresh": [], "dropped": []}
    try:
        built = type(model).from_config(dataclasses.replace(c, attention=attention, attention_kwargs=attention_kwargs))
    except (ValueError, TypeError, KeyError) as err:
        raise UserError(f"--attention {attention}: {err}") from None
    fresh = built.init_from(model)
    dropped = sorted(set(model.state_dict()) - set(built.state_dict()))
    return built.eval(), {"fresh": fresh, "dropped": dropped}


def _weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied and packed weights share one)."""
    storages = {}
    for t in list(model.parameters()) + list(model.buffers()):
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def largest_context(budget: int, weights: int, state: int, growth: int, context: int) -> Optional[int]:
    """The largest context ``n`` with ``weights + state(n) <= budget``, the state taken as ``state +
    growth x (n - context)`` (its bytes at ``context`` and per token beyond); None when the state
    does not grow (unbounded by the state) and fits; 0 when nothing fits."""
    if weights > budget:
        return 0
    if growth <= 0:
        return None if weights + state <= budget else 0
    return max(0, context + (budget - weights - state) // growth)


def _state_kinds(state: StackState) -> str:
    """The type names of the first layer's self-attention state (``KVCache``, ``LinearState``, ...)."""
    def names(s: Any) -> List[str]:
        if isinstance(s, (tuple, list)):
            return [n for x in s for n in names(x)]
        return [] if s is None else [type(s).__name__]

    return " + ".join(names(state.layers[0].self_attn)) or "none"


def _run_model(args: argparse.Namespace, contexts: List[int], device: torch.device, machine: Dict[str, Any]
               ) -> Dict[str, Any]:
    """Measure the real model of ``--model`` with each ``--attention`` kernel."""
    try:
        budget = parse_bytes(args.memory_budget)
    except ValueError as err:
        raise UserError(f"--memory-budget: {err}") from None
    P = args.prefill_tokens
    common.check_lengths("--prefill-tokens", [P])
    asked = [_attention_spec(a) for a in args.attention or []]  # checked before the model is read
    twice = sorted({a for a in args.attention or [] if args.attention.count(a) > 1})
    if twice:
        raise UserError(f"--attention names {twice[0]!r} twice; each kernel is one row per context")
    source = load_model(args.model)
    own = source.config.attention
    specs = asked or [(own, None)] + ([("softmax", None)] if own != "softmax" else [])
    vocab = source.config.vocab_size
    results: Dict[str, Any] = {
        "benchmark": "generation", "command": args.command_line, "date": common.now_iso(), "machine": machine,
        "config": {"model": args.model, "model_type": type(source).registry_name, "own_attention": own,
                   "own_attention_kwargs": source.config.attention_kwargs, "batch": args.batch, "contexts": contexts,
                   "prefill_tokens": P, "memory_budget": args.memory_budget, "memory_budget_bytes": budget,
                   "prompt": f"random token ids in [0, {vocab}) (seed {args.seed})",
                   "step": "one-token forward with the state (last position's logits) + sampling, generate's loop "
                           "body, each step continuing from the previous one's state"},
        "models": {},
    }
    print(f"  {args.model}: {type(source).__name__}, {sum(p.numel() for p in source.parameters()):,} parameters, "
          f"own attention {own!r}", flush=True)
    for name, kwargs in specs:
        torch.manual_seed(args.seed)  # a kernel's fresh parameters (feature maps, gates) drawn alike every run
        model, changed = with_attention(source, name, kwargs)
        model = model.to(device)
        label = name if not model.config.attention_kwargs else f"{name} {model.config.attention_kwargs}"
        record: Dict[str, Any] = {"attention": name, "attention_kwargs": model.config.attention_kwargs,
                                  "weights_bytes": _weights_bytes(model), **changed, "points": []}
        base: Optional[Tuple[Tensor, StackState, float]] = None  # the P-token prefill, read once
        for L in contexts:
            ids = torch.randint(vocab, (args.batch, min(L, P)), generator=torch.Generator().manual_seed(args.seed))
            ids = ids.to(device)
            if L <= P or base is None:
                read: Dict[str, Any] = {}
                seconds = common.timed_once(lambda: read.update(out=prefill(model, ids)), device)
                logits, state = read["out"]
                if L > P:
                    base = (logits, state, seconds)
            else:
                logits, state, seconds = base
            n = ids.shape[1]
            if L > P:
                state = extend_state(state, L, getattr(model.stack, "rotary", None))
                built = f"real prefill of {n:,} tokens, extended to {L:,} positions (extend_state)"
            else:
                built = f"real prefill of {L:,} tokens"
            point = {"context": L, "state_built": built, "state_kind": _state_kinds(state), "prefill_tokens": n,
                     "prefill_s": seconds, "prefill_tokens_per_s": args.batch * n / seconds,
                     **_measure(model, state, logits, args, device)}
            del state
            record["points"].append(point)
            print(f"  {label:>28} L={L:>6}: {point['time_median_s'] * 1e3:8.2f} ms/token  state "
                  f"{point['state_bytes'] / 2**20:9.3f} MB (+{point['state_growth_bytes_per_token']:,} B/token)  "
                  f"step peak {point['step_peak_bytes'] / 2**20:8.3f} MB  prefill {n:,} tokens "
                  f"{point['prefill_tokens_per_s']:8.1f} tok/s  [{built}]", flush=True)
        last = record["points"][-1]
        fit = largest_context(budget, record["weights_bytes"], last["state_bytes"],
                              last["state_growth_bytes_per_token"], last["context"])
        record["largest_context"] = fit
        record["largest_context_note"] = (
            "unbounded by the state (it does not grow: 0 bytes per token)" if fit is None else
            f"weights + state(L) <= {args.memory_budget}, the state growing "
            f"{last['state_growth_bytes_per_token']:,} bytes per token" if fit else
            f"does not fit: weights + state exceed {args.memory_budget}")
        results["models"][label] = record
    return results


def _model_report(results: Dict[str, Any]) -> List[str]:
    """The markdown sections of a ``--model`` run: the setup, the per-context table, the budget table."""
    cfg = results["config"]
    softmax = next((r for r in results["models"].values() if r["attention"] == "softmax"), None)
    soft_time = {p["context"]: p["time_median_s"] for p in softmax["points"]} if softmax else {}
    rows, fits = [], []
    for label, rec in results["models"].items():
        for p in rec["points"]:
            ratio = soft_time.get(p["context"])
            rows.append([label, p["context"], p["state_kind"], f"{p['time_median_s'] * 1e3:.2f}",
                         f"{p['time_median_s'] / ratio:.3f}" if ratio else "",
                         f"{p['state_bytes'] / 2**20:.3f}", f"{p['step_peak_bytes'] / 2**20:.3f}",
                         f"{p['prefill_tokens_per_s']:.1f} (at {p['prefill_tokens']:,})", p["repeats"],
                         p["state_built"]])
        last = rec["points"][-1]
        fit = rec["largest_context"]
        fits.append([label, f"{rec['weights_bytes'] / 2**20:.1f}", f"{last['state_growth_bytes_per_token']:,}",
                     "unbounded by the state" if fit is None else f"{fit:,}", len(rec["fresh"]), len(rec["dropped"])])
    setup = (f"Model `{cfg['model']}` ({cfg['model_type']}, own attention `{cfg['own_attention']}`), the same "
             f"weights with each kernel; batch {cfg['batch']}; prompt: {cfg['prompt']}. One step = "
             f"{cfg['step']}; median of the repeats. A context beyond {cfg['prefill_tokens']:,} tokens: the state of "
             f"a real prefill of {cfg['prefill_tokens']:,} tokens extended to the context without reading it (KV "
             f"caches: every position, keys and values of position p mod {cfg['prefill_tokens']:,}, keys re-rotated "
             f"to p; bounded caches moved to end at the context; recurrent states: the same sums, their position "
             f"count moved on); the decoded step is real. State MB: the tensors' content at the context (an "
             f"in-place KV cache holds up to as much again in spare room).")
    table = common.markdown_table(["attention", "context", "state", "ms per token (median)", "/ softmax", "state MB",
                                   "step peak MB", "prefill tok/s", "repeats", "state built"], rows)
    budget = common.markdown_table(["attention", "weights MB", "state bytes per token",
                                    f"largest context in {cfg['memory_budget']} (weights + state)",
                                    "fresh parameters", "dropped parameters"], fits)
    return [setup, table, budget]


# ----------------------------------------------------------------------------- the small models


def _models(args: argparse.Namespace, longest: int) -> Dict[str, torch.nn.Module]:
    # positions for the longest context and the steps decoded after it (at most 2 + 200)
    sizes = dict(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, d_ff=4 * args.d_model,
                 n_layers=args.layers, dropout=0.0, max_len=longest + 256)
    torch.manual_seed(args.seed)
    # GPT with sinusoids: its learned table would slide (re-read) the context past max_len
    stride = max(1, round((longest + 1) ** 0.5))  # l ~ sqrt(n)
    return {"linear-transformer (RNN state)": LinearTransformer(LinearTransformerConfig(**sizes)).eval(),
            "gpt softmax (KV cache)": GPT(GPTConfig(attention="softmax", positional="sinusoidal", **sizes)).eval(),
            # Child et al. 2019: the state keeps every key (A2 reaches each residue class), a token reads l + n / l
            f"sparse-transformer (strided l={stride}, interleaved)": SparseTransformer(SparseTransformerConfig(
                stride=stride, sparse_mode="interleave", positional="sinusoidal", **sizes)).eval(),
            # Parmar et al. 2018's local-1d kernel: a bounded cache of the block and its memory
            "gpt local-1d (block 128, memory 128)": GPT(GPTConfig(
                attention="local-1d", attention_kwargs={"block": 128, "memory": 128}, positional="sinusoidal",
                **sizes)).eval()}


def _run_small(args: argparse.Namespace, contexts: List[int], device: torch.device, machine: Dict[str, Any]
               ) -> Dict[str, Any]:
    for flag in ("d_model", "heads", "layers", "vocab"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.d_model % args.heads:
        raise UserError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    models = {name: m.to(device) for name, m in _models(args, max(contexts)).items()}
    results: Dict[str, Any] = {
        "benchmark": "generation", "command": args.command_line, "date": common.now_iso(), "machine": machine,
        "config": {"d_model": args.d_model, "heads": args.heads, "layers": args.layers, "vocab": args.vocab,
                   "batch": args.batch, "contexts": contexts,
                   "parameters": {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
                   "step": "one-token forward with the state + sampling (generate's loop body), after a prefill, "
                           "each step continuing from the previous one's state"},
        "models": {},
    }
    for name, model in models.items():
        points = []
        for L in contexts:
            ids = torch.randint(args.vocab, (args.batch, L), generator=torch.Generator().manual_seed(args.seed))
            logits, state = prefill(model, ids.to(device))  # the context is read once
            p = {"context": L, **_measure(model, state, logits, args, device)}
            points.append(p)
            print(f"  {name:>32} L={L:>6}: {p['time_median_s'] * 1e3:8.2f} ms/token  state "
                  f"{p['state_bytes'] / 2**20:8.3f} MB  step peak {p['step_peak_bytes'] / 2**20:8.3f} MB", flush=True)
        results["models"][name] = {"points": points}
    return results


def _small_report(results: Dict[str, Any]) -> List[str]:
    cfg = results["config"]
    rows = [[name, p["context"], f"{p['time_median_s'] * 1e3:.2f}", f"{p['state_bytes'] / 2**20:.3f}",
             f"{p['step_peak_bytes'] / 2**20:.3f}", p["repeats"]]
            for name, rec in results["models"].items() for p in rec["points"]]
    setup = (f"d_model={cfg['d_model']}, heads={cfg['heads']}, layers={cfg['layers']}, vocab={cfg['vocab']}, "
             f"batch={cfg['batch']}; one step = {cfg['step']}.")
    return [setup, common.markdown_table(["model", "context", "ms per token (median)", "state MB", "step peak MB",
                                          "repeats"], rows)]


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the generation benchmark; writes JSON, markdown and PNG into ``args.out``."""
    device = common.resolve_device(args.device)
    model_mode = getattr(args, "model", None) is not None
    if getattr(args, "attention", None) and not model_mode:
        raise UserError("--attention builds the weights of --model with other kernels; give --model PATH")
    default = QUICK_CONTEXTS if args.quick else MODEL_CONTEXTS if model_mode else DEFAULT_CONTEXTS
    contexts = sorted(set(args.contexts or default))
    if contexts[0] < 1:
        raise UserError(f"--contexts must be positive, got {args.contexts}")
    common.check_lengths("--contexts", contexts)
    if args.batch < 1:
        raise UserError(f"--batch must be >= 1, got {args.batch}")
    common.check_range("--target-seconds", args.target_seconds, 0.0)
    machine = common.describe_machine(device)
    print(f"generation on {common.machine_line(machine)}", flush=True)
    if model_mode:
        results = _run_model(args, contexts, device, machine)
        parts = _model_report(results)
    else:
        results = _run_small(args, contexts, device, machine)
        parts = _small_report(results)
    out = Path(args.out)
    common.write_json(out / "generation.json", results)
    common.write_markdown(out / "generation.md", "qkv bench generation", machine, args.command_line, results["date"],
                          parts)
    if not args.no_plot:
        series = {name: {"x": [p["context"] for p in rec["points"]],
                         "time": [p["time_median_s"] * 1e3 for p in rec["points"]],
                         "state": [p["state_bytes"] / 2**20 for p in rec["points"]]}
                  for name, rec in results["models"].items()}
        common.plot_loglog(out / "generation.png", series, title="qkv bench generation: per-token cost vs context",
                           panels=[("time", "ms per generated token (median)"), ("state", "state carried, MB")],
                           machine=machine)
    print("\n" + "\n\n".join(parts[1:]) + f"\n\nwritten to {out}/", flush=True)
    return results
