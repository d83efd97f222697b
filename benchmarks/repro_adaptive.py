"""Reproduce docs/reproductions/adaptive.md in one command: adaptive attention span and Universal
Transformer with ACT, at CPU scale.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_adaptive.py           # ~15 min of one core
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_adaptive.py --quick   # smoke run, numbers meaningless

1. Adaptive span (Sukhbaatar et al. 2019) on ``shakespeare-char`` trained as contiguous streams
   (the span cache carried across segments): the learned span of every layer and head, the
   attention score computations it leaves against the full span ``S``, test bits per character
   against the same model with every span fixed at ``S``, and the time of one forward pass over a
   long text with the learned spans against the same weights with full spans.
2. Universal Transformer with per-position ACT (Dehghani et al. 2019; Graves 2016) on ``addition``:
   ponder steps per output position against the number of carries (a heat map and the means), with
   the default halting bias (-1) and tensor2tensor's (+1), whose early collapse to ~2 steps is
   the known failure (tensor2tensor #1723).

Writes ``runs/repro_adaptive/results.json``, ``docs/reproductions/adaptive.md`` and PNGs in
``docs/reproductions/img/``.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training', '@transformer', '@text'],
 'ut-length-generalisation': ['src/qkv/models/transformer/universal_transformer.py', 'src/qkv/blocks/act.py',
                              'src/qkv/tasks/generated.py', 'src/qkv/models/sampling.py'],
 'adaptive-span-cost': ['src/qkv/attention/adaptive_span.py', 'src/qkv/models/transformer/adaptive_span.py'],
 'adaptive-span-pattern': ['src/qkv/attention/adaptive_span.py', 'src/qkv/models/transformer/adaptive_span.py'],
 'ut-vs-transformer-addition': ['src/qkv/models/transformer/universal_transformer.py',
                                'src/qkv/blocks/act.py',
                                'src/qkv/tasks/generated.py',
                                'src/qkv/models/sampling.py'],
 'ut-act-carries': ['src/qkv/models/transformer/universal_transformer.py',
                    'src/qkv/blocks/act.py',
                    'src/qkv/tasks/generated.py',
                    'src/qkv/models/sampling.py']}

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from qkv.models.transformer.adaptive_span import AdaptiveSpanTransformer, AdaptiveSpanTransformerConfig  # noqa: E402
from qkv.models.transformer.transformer import Transformer, TransformerConfig  # noqa: E402
from qkv.models.transformer.universal_transformer import UniversalTransformer, UniversalTransformerConfig  # noqa: E402
from qkv.tasks.generated import AdditionTask  # noqa: E402
from qkv.tasks.lm import ShakespeareChar  # noqa: E402
from _repro import replace_section, smoke_dir, train_fresh  # noqa: E402
import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "reproductions" / "img"
OUT = ROOT / "runs" / "repro_adaptive"
DOC = ROOT / "docs" / "reproductions" / "adaptive.md"
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_adaptive.py"


def train(model, task, steps: int, batch_size: int, lr: float, name: str, seed: int = 0) -> float:
    return train_fresh(model, task, OUT / name, steps, batch_size, lr, eval_max_examples=8, seed=seed)


# ----------------------------------------------------------------------------- 1. adaptive span


def span_model(task, args, init_span: float, coef: float, seed: int = 0) -> AdaptiveSpanTransformer:
    torch.manual_seed(seed)
    return AdaptiveSpanTransformer(AdaptiveSpanTransformerConfig(
        vocab_size=task.vocab.size, n_layers=args.layers, d_model=64, n_heads=4, d_ff=256, dropout=0.0,
        max_span=args.max_span, ramp=args.ramp, init_span=init_span, span_loss_coef=coef,
        position_embeddings=args.relative))


@torch.no_grad()
def forward_seconds(model: AdaptiveSpanTransformer, ids: torch.Tensor, repeats: int) -> float:
    model.eval()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(ids)
        times.append(time.perf_counter() - t0)
    return min(times)


SPAN_VARIANTS = ("adaptive", "full span")
UT_VARIANTS = {  # config overrides of each UT variant (ponder weight: --ponder-weight unless given)
    "fixed depth T = 6 (no ACT)": {"act": False},
    # measured: at 3000 steps T = 6 reached exact match 0.075 (lr 2e-3) and 0.158 (5e-4), T = 2 reached 0.83, a
    # 2-layer Transformer 0.52: the 6-step post-LN recurrence is what does not train at this budget
    "fixed depth T = 2 (no ACT)": {"act": False, "max_steps": 2},
    "b_h = -1 (default)": {"halting_bias_init": -1.0},
    "b_h = +1 (tensor2tensor)": {"halting_bias_init": 1.0},
    "b_h = -1, no ponder cost": {"halting_bias_init": -1.0, "ponder_weight": 0.0},
}
LEARNED = 0.9  # exact match at which a UT "has learned" addition: only then do its ponder steps mean anything


def run_span(args, name: str) -> Dict:
    """Train one variant on ``--seeds`` seeds: the details of the first, per-seed summaries under
    ``per_seed`` (test bpc, the mean span of the lower and of the upper half of the layers)."""
    runs = [run_span_seed(args, name, seed) for seed in range(args.seed, args.seed + args.seeds)]
    half = args.layers // 2
    result = {**runs[0], "per_seed": {
        "seed": list(range(args.seed, args.seed + args.seeds)),
        "test_bpc": [r["test_bpc"] for r in runs],
        "lower_span": [float(np.mean(r["spans"][:half])) for r in runs],
        "upper_span": [float(np.mean(r["spans"][half:])) for r in runs],
        "computed": [r["attention_cost"]["computed"] for r in runs]}}
    return {"span": {"max_span": args.max_span, "ramp": args.ramp, "span_loss_coef": args.span_coef,
                     "init_span": args.init_span, "steps": args.lm_steps, "block": args.block, "layers": args.layers,
                     "position_embeddings": args.relative, "seed": args.seed, name: result}}


def run_span_seed(args, name: str, seed: int) -> Dict:
    """Train one variant: ``adaptive`` (spans learned from ``--init-span`` with the penalty) or
    ``full span`` (every span fixed at S)."""
    task = ShakespeareChar(block_size=args.block, stream=True)
    learn = name == "adaptive"
    model = span_model(task, args, args.init_span if learn else float(args.max_span), args.span_coef if learn else 0.0,
                       seed)
    if not learn:
        for kernel in model.kernels():
            kernel.span.requires_grad_(False)  # spans stay at S: plain causal attention over the last S keys
    seconds = train(model, task, args.lm_steps, 16, args.lm_lr, "span-" + name.replace(" ", "-"), seed)
    metrics = task.evaluate(model, "test", max_examples=args.eval_segments)
    result = {"train_seconds": round(seconds, 1), "test_bpc": round(metrics["bpc"], 4),
              "spans": model.spans().round(decimals=1).tolist(), "attention_cost": model.attention_cost(),
              "widths": [k.current_span() for k in model.kernels()]}
    print(name, result, flush=True)
    if learn and seed == args.seed:
        # the same trained weights, with the learned spans and with every span set to S: one long forward pass
        full = span_model(task, args, float(args.max_span), 0.0, seed)
        full.load_state_dict(model.state_dict())
        with torch.no_grad():
            for kernel in full.kernels():
                kernel.span.fill_(1.0)
        ids = task.split_tokens("test")[: args.time_len][None]
        t_learned, t_full = [], []
        for _ in range(3):  # alternating rounds
            t_learned.append(forward_seconds(model, ids, 2))
            t_full.append(forward_seconds(full, ids, 2))
        result["forward_seconds"] = {"tokens": int(ids.shape[1]), "learned": round(min(t_learned), 3),
                                     "full": round(min(t_full), 3)}
    return result


def plot_spans(spans: np.ndarray, S: int, widths: List[int]) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1.2, 1]})
    image = a.imshow(spans, cmap="viridis", vmin=0, vmax=S, origin="lower", aspect="auto")
    for (layer, head), z in np.ndenumerate(spans):
        a.text(head, layer, f"{z:.0f}", ha="center", va="center", color="w" if z < S / 2 else "k", fontsize=9)
    a.set_xticks(range(spans.shape[1]))  # whole heads and layers, not the default fractional ticks
    a.set_yticks(range(spans.shape[0]))
    a.set_xlabel("head")
    a.set_ylabel("layer")
    a.set_title(f"learned span z per head (S = {S})")
    fig.colorbar(image, ax=a)
    layers = np.arange(spans.shape[0])
    b.bar(layers - 0.2, spans.mean(1), 0.4, label="mean z over heads")
    b.bar(layers + 0.2, widths, 0.4, label="keys computed per query (W)")
    b.axhline(S, color="k", ls="--", lw=1, label="full span S")
    b.set_xticks(layers)
    b.set_xlabel("layer")
    b.set_ylabel("positions")
    b.set_ylim(0, S * 1.35)  # room for the legend above the bars
    b.legend(fontsize=8, loc="upper center", ncol=2)
    b.set_title("span and attention cost per layer")
    fig.tight_layout()
    fig.savefig(IMG / "adaptive-span-spans.png", dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- 2. UT + ACT


def carries(source: str) -> List[int]:
    """Carry into each column of ``a + b``, least significant first (column 0 never has one)."""
    a, b = source.split("+")
    a, b = a[::-1], b[::-1]
    out, carry = [], 0
    for i in range(max(len(a), len(b)) + 1):
        out.append(carry)
        da = int(a[i]) if i < len(a) else 0
        db = int(b[i]) if i < len(b) else 0
        carry = (da + db + carry) // 10
    return out


def full_steps(ids: torch.Tensor, steps: float) -> torch.Tensor:
    return torch.full(ids.shape, steps)


def run_ut(args, name: str) -> Dict:
    """Train one UT variant (fixed depth, or ACT with its halting bias and ponder weight) on
    ``--seeds`` seeds and measure its ponder steps; the detailed maps are seed 0's, the per-seed
    summaries are under ``per_seed``."""
    overrides = {"ponder_weight": args.ponder_weight, "max_steps": args.max_steps, **UT_VARIANTS[name]}
    task = AdditionTask(min_len=1, max_len=args.digits, eval_size=args.eval_examples)
    v = task.vocab
    pairs = task.eval_pairs("test")[: args.eval_examples]
    n_carries = np.array([sum(carries(s)) for s, _ in pairs])
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        torch.manual_seed(seed)
        model = UniversalTransformer(UniversalTransformerConfig(
            vocab_size=v.size, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id, d_model=64, n_heads=4, d_ff=256,
            dropout=0.1, **overrides))
        batch = task.collate(pairs)
        keep = batch["labels"] != -100  # (B, T) output digits + EOS
        fixed = not model.config.act

        def act_of(model):
            model.eval()
            with torch.no_grad():
                aux = model(**batch, return_act=True).aux
            if fixed:  # every position takes exactly max_steps steps; the output is the last step's
                T = float(model.config.max_steps)
                return full_steps(batch["labels"], T), full_steps(batch["src_ids"], T), torch.zeros(batch["labels"].shape)
            dec, enc = aux["decoder_act"], aux["encoder_act"]
            return dec.n_steps.float(), enc.n_steps.float(), dec.probabilities[..., 0]

        init_steps = act_of(model)[0]
        slug = name.split(" (")[0].replace(" ", "").replace("=", "").replace("+", "p").replace("-", "m").replace(",", "")
        seconds = train(model, task, args.ut_steps, 32, args.ut_lr, f"ut-{slug}-s{seed}", seed)
        metrics = task.evaluate(model, "test", max_examples=args.eval_examples)
        dec_t, enc_t, first_t = act_of(model)
        dec = dec_t.masked_fill(~keep, float("nan")).numpy()  # (B, T)
        enc = enc_t.masked_fill(~batch["src_mask"], float("nan")).numpy()
        first = first_t.masked_fill(~keep, float("nan")).numpy()  # p^1: the weight of step 1 in the output
        per_carries = {}
        for c in sorted(set(n_carries.tolist())):
            rows = n_carries == c
            per_carries[int(c)] = {"examples": int(rows.sum()), "decoder_steps": round(float(np.nanmean(dec[rows])), 3),
                                   "encoder_steps": round(float(np.nanmean(enc[rows])), 3)}
        # per output digit: does a carry enter its column? (digits are written most significant first)
        with_carry, without = [], []
        for b, (source, target) in enumerate(pairs):
            cin = carries(source)[: len(target)][::-1]  # carry into each output digit, in output order
            for t, c in enumerate(cin):
                (with_carry if c else without).append(dec[b, t])
        runs.append({"seed": seed, "train_seconds": round(seconds, 1),
                     "exact_match": round(metrics.get("exact_match", float("nan")), 4),
                     "decoder_steps_at_init": round(float(init_steps[keep].mean()), 3),
                     "decoder_steps": round(float(np.nanmean(dec)), 3), "encoder_steps": round(float(np.nanmean(enc)), 3),
                     "step1_weight": None if fixed else round(float(np.nanmean(first)), 3),
                     "by_carries": per_carries,
                     "digit_steps_with_carry_in": round(float(np.mean(with_carry)), 3) if with_carry else None,
                     "digit_steps_without_carry_in": round(float(np.mean(without)), 3) if without else None,
                     "dec": [[None if np.isnan(x) else float(x) for x in row] for row in dec]})
        print(name, {k: x for k, x in runs[-1].items() if k not in ("dec", "by_carries")}, flush=True)
    summary = ("exact_match", "decoder_steps", "encoder_steps", "step1_weight", "digit_steps_with_carry_in",
               "digit_steps_without_carry_in", "train_seconds")
    result = {**runs[0], "overrides": overrides, "halting_bias_init": overrides.get("halting_bias_init"),
              "per_seed": {k: [r[k] for r in runs] for k in summary + ("seed",)}}
    return {"ut": {"digits": args.digits, "max_steps": args.max_steps, "steps": args.ut_steps,
                   "ponder_weight": args.ponder_weight, "eval_examples": len(pairs), "pairs": pairs,
                   "n_carries": n_carries.tolist(), name: result}}


def plot_ponder(u: Dict) -> None:
    pairs, n_carries, max_steps = u["pairs"], np.array(u["n_carries"]), u["max_steps"]
    out = {name: {**u[name], "_dec": np.array([[np.nan if x is None else x for x in row] for row in u[name]["dec"]])}
           for name in UT_VARIANTS if name in u}
    order = np.argsort(n_carries, kind="stable")
    shown = np.concatenate([order[n_carries[order] == c][:8] for c in sorted(set(n_carries.tolist()))])
    fig, axes = plt.subplots(1, len(out) + 1, figsize=(5 * len(out) + 5, 0.22 * len(shown) + 1.6))
    for ax, (name, r) in zip(axes, out.items()):
        dec = r["_dec"][shown]
        image = ax.imshow(dec, cmap="magma", vmin=1, vmax=max_steps, aspect="auto")
        ax.set_yticks(range(len(shown)), [f"{pairs[i][0]}={pairs[i][1]} ({n_carries[i]})" for i in shown], fontsize=6)
        ax.set_xlabel("output position (digits, then EOS)")
        ax.set_title(f"decoder ponder steps N(t), {name}", fontsize=9)
        fig.colorbar(image, ax=ax)
    ax = axes[-1]
    for name, r in out.items():
        cs = sorted(r["by_carries"], key=int)
        ax.plot([int(c) for c in cs], [r["by_carries"][c]["decoder_steps"] for c in cs], "o-", label=f"decoder, {name}")
        ax.plot([int(c) for c in cs], [r["by_carries"][c]["encoder_steps"] for c in cs], "s--", label=f"encoder, {name}")
    ax.set_xlabel("carries in the sum")
    ax.set_ylabel("mean ponder steps N")
    ax.set_ylim(0, max_steps + 0.5)
    ax.legend(fontsize=7)
    ax.set_title("ponder steps against difficulty", fontsize=9)
    fig.tight_layout()
    fig.savefig(IMG / "ut-act-ponder.png", dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- report


def span_notes(s: Dict) -> List[str]:
    """The reading of the span numbers, derived from them: seed ``s["seed"]``'s, then the verdicts of
    every seed's numbers where there are several (the ones claims.json records)."""
    spans = np.array(s["adaptive"]["spans"])
    half = spans.shape[0] // 2
    low, high = spans[:half].mean(), spans[half:].mean()
    top = np.unravel_index(spans.argmax(), spans.shape)
    pa, pf = s["adaptive"].get("per_seed"), s["full span"].get("per_seed")
    seeded = bool(pa and pf and len(pa["seed"]) >= claims.MIN_SEEDS)
    out = [f"- **Spans by depth.** Mean learned span {low:.0f} in the lower {half} layers, {high:.0f} in the upper "
           f"{spans.shape[0] - half}; the longest head is layer {top[0]}, head {top[1]} (z = {spans.max():.0f} of "
           f"S = {s['max_span']}). " + (
               f"Over seeds {pa['seed']}: upper layers {claims.fmt(pa['upper_span'])}, lower {claims.fmt(pa['lower_span'])}; "
               f"the paper's pattern (upper spans longer) is **{claims.verdict(pa['upper_span'], pa['lower_span'], 'higher')}**"
               f"{gap_why(pa['upper_span'], pa['lower_span'], 'higher', 0.0, 'positions')}."
               if seeded else "The paper's pattern (low layers short, a few high heads long) "
               + ("holds in this seed." if high > low and spans.max() > 2 * np.median(spans) else "does not hold in this seed."))]
    diff = s["adaptive"]["test_bpc"] - s["full span"]["test_bpc"]
    out.append(f"- **Cost against quality.** The learned spans leave {100 * s['adaptive']['attention_cost']['computed']:.0f}% "
               f"of the full span's attention scores; test bpc differs by {diff:+.3f} from the full-span model "
               f"({'worse' if diff > 0 else 'better or equal'}) after the same {s['steps']} steps. " + (
                   f"Over seeds: adaptive {claims.fmt(pa['test_bpc'])} at {100 * claims.mean(pa['computed']):.0f}% of the "
                   f"scores, full span {claims.fmt(pf['test_bpc'])}; within {SPAN_MARGIN} bpc of the full span: "
                   f"**{claims.verdict(pa['test_bpc'], pf['test_bpc'], 'lower', SPAN_MARGIN)}**"
                   f"{gap_why(pa['test_bpc'], pf['test_bpc'], 'lower', SPAN_MARGIN, 'bpc')}. " if seeded else "")
               + "The paper reports equal bpc at a fraction of the cost after much longer training.")
    return out


def notes(results: Dict) -> List[str]:
    """The reading of the numbers, derived from them (so that a rerun cannot contradict its text)."""
    u = results["ut"]
    out: List[str] = []
    names = [k for k in u if isinstance(u[k], dict) and "by_carries" in u[k]]
    fixed = [n for n in names if u[n].get("overrides", {}).get("act") is False]
    learned_fixed = [n for n in fixed if u[n]["exact_match"] >= LEARNED]
    for name in fixed:
        r = u[name]
        out.append(f"- **Fixed-depth UT first** ({name}): exact match {r['exact_match']:.3f} "
                   + (f"(>= {LEARNED}): this depth learns the task at this budget." if r["exact_match"] >= LEARNED else
                      f"(< {LEARNED}): this depth has not learned addition at this budget."))
    if fixed and not learned_fixed:
        out.append("- No fixed-depth UT learned the task here, so no ponder setting can be judged; the next step is a "
                   "larger budget (`--ut-steps`, `--budgets`), not ACT.")
    acts = [n for n in names if n not in fixed]
    for name in acts:
        r = u[name]
        cs = sorted(r["by_carries"], key=int)
        lo, hi = r["by_carries"][cs[0]]["decoder_steps"], r["by_carries"][cs[-1]]["decoder_steps"]
        w1 = r.get("step1_weight")
        out.append(f"- **ACT, {name}.** Decoder ponder steps {r['decoder_steps_at_init']:.2f} at initialisation, "
                   f"{r['decoder_steps']:.2f} after training (encoder {r['encoder_steps']:.2f})"
                   + (f", weight on step 1 {w1:.2f} (the output is mostly the first step's state when it is near 1, "
                      "whatever N says)" if w1 is not None else "")
                   + f"; {lo:.2f} for sums without carries against {hi:.2f} with {cs[-1]} carries; output digits with "
                   f"a carry coming in {r['digit_steps_with_carry_in']} against {r['digit_steps_without_carry_in']} "
                   f"without; exact match {r['exact_match']:.3f}.")
    if acts:
        exact = max(u[n]["exact_match"] for n in acts)
        if exact < LEARNED:
            out.append(f"- **No ACT variant learned the task at this budget** (exact match at most {exact:.2f} < "
                       f"{LEARNED}), so its ponder steps are those of a half-trained model: the claim (more steps where "
                       "the task is harder) gets no verdict here (claims.json lists it as pending).")
    collapsed = [n for n in acts if u[n]["encoder_steps"] <= 2.2 and u[n]["decoder_steps"] <= 3.0]
    if acts:
        out.append("- **The tensor2tensor #1723 failure.** With b_h = +1 the halting units start near h = sigmoid(1) = "
                   "0.73, so positions halt after 2-3 steps. " + (
                       f"After training, halting sat at ~2-3 steps in {len(collapsed)} of {len(acts)} ACT runs "
                       f"({', '.join(collapsed)})." if collapsed else
                       "In these runs halting did not collapse to 2 steps."))
    return out


SPAN_START = "## 1. Adaptive attention span (Sukhbaatar et al. 2019) on shakespeare-char"
SPAN_END = "## 2. Universal Transformer with ACT on addition"


def span_section(s: Dict) -> List[str]:
    """Section 1 of the page from the span results ``s`` (``run_span``'s ``"span"``, both variants):
    the first seed's spans and costs, every seed's bpc when there are several, and the reading."""
    a, f = s["adaptive"], s["full span"]
    spans = np.array(a["spans"])
    lines = [
        SPAN_START,
        "",
    ] + ([f"Rerun alone by `{s['rerun']['command']}` ({s['rerun']['minutes']:.0f} min wall-clock, {s['rerun']['date']}): "
          "the numbers of this section are that run's.", ""] if s.get("rerun") else []) + [
        f"`AdaptiveSpanTransformer`: {s['layers']} layers, d_model 64, 4 heads, S = {s['max_span']}, ramp R = "
        f"{s['ramp']:g}, trained {s['steps']} steps on 16 contiguous streams of {s['block']}-character segments "
        f"(`task.stream=true`: the span cache of the last S - 1 keys is carried across segments), "
        f"{'relative' if s.get('position_embeddings', True) else 'no'} position embeddings, spans "
        f"initialised at {s['init_span']:g}, span penalty coefficient {s['span_loss_coef']:g} (on the mean span of each layer). "
        f"The baseline is the same model with every span fixed at S (exact causal attention over the last S "
        f"characters), same steps and seed. Spans and costs below are seed {s.get('seed', 0)}'s.",
        "",
        "![learned spans](img/adaptive-span-spans.png)",
        "",
        "| layer | learned spans z (heads 0..3) | mean z | keys computed per query W |",
        "| --- | --- | --- | --- |",
    ]
    for layer, row in enumerate(spans):
        lines.append(f"| {layer} | {', '.join(f'{z:.0f}' for z in row)} | {row.mean():.0f} | {a['widths'][layer]} |")
    cost = a["attention_cost"]
    fwd = a["forward_seconds"]
    lines += [
        "",
        f"- Attention scores computed per query, against the full span S in every layer: "
        f"**{100 * cost['computed']:.0f}%** as the kernel computes them (each layer's band is its largest span + R); "
        f"{100 * cost['per_head']:.0f}% if every head were sliced to its own span (`attention_cost()`). "
        f"The attention FLOPs saved are the rest: {100 * (1 - cost['computed']):.0f}% (per head: "
        f"{100 * (1 - cost['per_head']):.0f}%).",
        f"- One forward pass over {fwd['tokens']} test characters with the same weights: {fwd['learned']:.3f} s "
        f"with the learned spans, {fwd['full']:.3f} s with every span at S (min of alternating rounds; whole model, "
        f"so feed-forward layers dilute the attention saving).",
        f"- Test bits per character (test split as 16 streams, span cache carried): adaptive **{a['test_bpc']:.3f}**, "
        f"full span {f['test_bpc']:.3f}.",
    ]
    pa, pf = a.get("per_seed"), f.get("per_seed")
    if pa and pf and len(pa["seed"]) > 1:
        lines += ["", f"Every seed ({pa['seed']}; mean ± standard error in the last row; verdicts in "
                      "[claims.json](claims.json)):", "",
                  "| seed | adaptive bpc | full span bpc | scores computed | mean span, lower layers | upper layers |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for i, seed in enumerate(pa["seed"]):
            lines.append(f"| {seed} | {pa['test_bpc'][i]:.3f} | {pf['test_bpc'][i]:.3f} | {100 * pa['computed'][i]:.0f}% | "
                         f"{pa['lower_span'][i]:.0f} | {pa['upper_span'][i]:.0f} |")
        lines.append(f"| mean | {claims.fmt(pa['test_bpc'])} | {claims.fmt(pf['test_bpc'])} | "
                     f"{100 * claims.mean(pa['computed']):.0f}% | {claims.fmt(pa['lower_span'])} | {claims.fmt(pa['upper_span'])} |")
    return lines + [""] + span_notes(s) + [""]


def write_doc(results: Dict, args) -> None:
    s, u = results["span"], results["ut"]
    a, f = s["adaptive"], s["full span"]
    ut_minutes = " and ".join(f"{u[n]['seconds'] / 60:.0f}" for n in UT_VARIANTS if n in u)
    lines = [
        "# Adaptive attention span and Universal Transformer with ACT",
        "",
        f"Made by `{COMMAND}{' --quick' if args.quick else ''}` (seed 0, one thread per process). Here the four "
        f"trainings ran side by side as `--part span|ut --variant NAME`, then `--part doc`, on the shared 2-core CPU at "
        f"load average ~15-20 from other jobs (wall times: span {a['seconds'] / 60:.0f} and {f['seconds'] / 60:.0f} min, "
        f"UT {ut_minutes} min). Numbers below are what "
        f"that run produced (`runs/repro_adaptive/results.json`).",
        "",
    ]
    lines += span_section(s) + [
        "## 2. Universal Transformer with ACT on addition",
        "",
        f"`UniversalTransformer` (encoder–decoder, one shared block each, d_model 64, 4 heads, at most M = "
        f"{u['max_steps']} steps, ponder weight tau = {u['ponder_weight']}), trained {u['steps']} steps on `addition` "
        f"(batch 32) with operands of 1–{u['digits']} digits; {u['eval_examples']} test sums, difficulty = number of carries. "
        "The variants differ only in what the table names: fixed depth (every position takes all steps) or ACT with "
        "its halting bias initialisation and ponder weight. Weight on step 1: the mean halting-distribution mass p^1 "
        "on the first step (the output is sum_n p^n s^n).",
        "",
        "![ponder steps](img/ut-act-ponder.png)",
        "",
        "| variant | exact match | decoder N at init | decoder N | weight on step 1 | encoder N | digit N, carry in | "
        "digit N, no carry in |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in (k for k in u if isinstance(u[k], dict) and "by_carries" in u[k]):
        r = u[name]
        w1 = r.get("step1_weight")
        lines.append(f"| {name} | {r['exact_match']:.3f} | {r['decoder_steps_at_init']:.2f} | {r['decoder_steps']:.2f} | "
                     f"{'—' if w1 is None else f'{w1:.2f}'} | {r['encoder_steps']:.2f} | {r['digit_steps_with_carry_in']} | "
                     f"{r['digit_steps_without_carry_in']} |")
    lines += ["", "Mean decoder ponder steps by number of carries:", "",
              "| carries | " + " | ".join(k for k in u if isinstance(u[k], dict) and "by_carries" in u[k]) + " |",
              "|" + " --- |" * (1 + len([k for k in u if isinstance(u[k], dict) and "by_carries" in u[k]]))]
    names = [k for k in u if isinstance(u[k], dict) and "by_carries" in u[k]]
    for c in sorted(u[names[0]]["by_carries"]):
        cells = [f"{u[n]['by_carries'][c]['decoder_steps']:.2f} (n={u[n]['by_carries'][c]['examples']})" for n in names]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "## What this shows", ""] + notes(results) + [""]
    DOC.write_text("\n".join(lines) + "\n")


def rewrite_span_section(span: Dict, args, seconds: float) -> None:
    """Section 1 of the page (and its picture) from a span run made alone (``--part span``), the
    rest of the page left as it is; section 1's reading moves with it."""
    command = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_adaptive.py " + " ".join(sys.argv[1:])
    span = {**span, "rerun": {"command": command, "minutes": seconds / 60,
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}
    plot_spans(np.array(span["adaptive"]["spans"]), span["max_span"], span["adaptive"]["widths"])
    text = DOC.read_text()
    i, j = text.index(SPAN_START), text.index(SPAN_END)
    rest = [line for line in text[j:].split("\n")
            if not line.startswith(("- **Spans by depth.**", "- **Cost against quality.**"))]
    DOC.write_text(text[:i] + "\n".join(span_section(span)) + "\n" + "\n".join(rest))
    print(f"rewrote section 1 of {DOC}", flush=True)


SPAN_PAPER = "Sukhbaatar et al. 2019, Adaptive Attention Span in Transformers (arXiv:1905.07799)"
UT_PAPER = "Dehghani et al. 2019, Universal Transformers (arXiv:1807.03819), with Graves 2016 ACT"
SPAN_MARGIN = 0.02  # "the same bpc": within 0.02 bits per character of the full span


def gap_why(ours: List[float], base: List[float], better: str, margin: float, unit: str) -> str:
    """``""`` when the claim reproduces, else ``": "`` and what decided it (``claims.gap``)."""
    if claims.verdict(ours, base, better, margin) == "reproduced":
        return ""
    return ": " + claims.gap(ours, base, better, margin, unit)


UT_VS = ("<!-- ut-vs-transformer -->", "<!-- /ut-vs-transformer -->")


def run_ut_vs_transformer(args, steps: int = 0) -> Dict:
    """The Universal Transformer at fixed depth T = 2 (one shared block applied twice, the timestep
    signal added before each step) against a Transformer of two separate layers, the same width,
    heads, transition size, dropout and recipe, on addition; ``--seeds`` seeds each, the claim with
    >= 3. (At T = 6 the one post-LN block does not train at this budget: section 2.) ``steps``: a
    larger budget than ``--ut-steps`` (``--budgets``), added to the claim's budget curve."""
    point = bool(steps)
    steps = steps or args.ut_steps
    task = AdditionTask(min_len=1, max_len=args.digits, eval_size=args.eval_examples)
    v = task.vocab
    sizes = dict(vocab_size=v.size, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id, d_model=64, n_heads=4, d_ff=256,
                 dropout=0.1, label_smoothing=0.0)
    arms = {"ut": lambda: UniversalTransformer(UniversalTransformerConfig(**sizes, act=False, max_steps=2)),
            "transformer": lambda: Transformer(TransformerConfig(**sizes, n_layers=2))}
    out: Dict = {"steps": steps, "lr": args.ut_lr, "digits": args.digits, "eval_examples": args.eval_examples}
    for name, build in arms.items():
        runs = []
        for seed in range(args.seed, args.seed + args.seeds):
            torch.manual_seed(seed)
            model = build()
            seconds = train(model, task, steps, 32, args.ut_lr, f"vs-{name}-s{seed}" + (f"-{steps}" if point else ""), seed)
            metrics = task.evaluate(model, "test", max_examples=args.eval_examples)
            runs.append({"seed": seed, "train_seconds": round(seconds, 1), "params": sum(p.numel() for p in model.parameters()),
                         **{k: round(float(metrics[k]), 4) for k in ("exact_match", "token_accuracy") if k in metrics}})
            print("ut-vs-transformer", name, runs[-1], flush=True)
        out[name] = runs
    if args.quick:
        return out
    exact = {name: [r["exact_match"] for r in out[name]] for name in arms}
    path = OUT / "vs-transformer.json"
    if point:
        saved = json.loads(path.read_text()) if path.exists() else {}
        saved.setdefault("budgets", {})[str(steps)] = out
        path.write_text(json.dumps(saved, indent=2) + "\n")
        if len(exact["ut"]) >= claims.MIN_SEEDS:
            claims.add_point("ut-vs-transformer-addition", f"{steps} steps", exact["ut"], exact["transformer"])
        if "ut" in saved:
            publish_vs(saved)
        return out
    path.write_text(json.dumps(out, indent=2) + "\n")
    if len(exact["ut"]) >= claims.MIN_SEEDS:
        claims.record(
            id="ut-vs-transformer-addition", model="universal-transformer", paper=UT_PAPER, better="higher", measured=True,
            claim="Sharing one block's weights over depth (the Universal Transformer) learns algorithmic tasks better "
                  "than a Transformer of separate layers (its algorithmic tasks: copy, reverse, addition).",
            command=f"{COMMAND} --part ut-vs-transformer --seeds {args.seeds} --ut-steps {args.ut_steps}",
            ours=exact["ut"], baseline=exact["transformer"],
            budget=f"addition of 1-{args.digits}-digit numbers, {args.ut_steps} updates of 32, lr {args.ut_lr:g}, "
                   f"d_model 64, 4 heads, UT T = 2 against 2 layers; exact match on {args.eval_examples} test sums; "
                   "CPU, one thread",
            why=f"exact match UT {claims.fmt(exact['ut'])}, Transformer {claims.fmt(exact['transformer'])} (per seed "
                f"{[round(x, 3) for x in exact['ut']]} vs {[round(x, 3) for x in exact['transformer']]})"
                + gap_why(exact["ut"], exact["transformer"], "higher", 0.0, "exact match"))
        publish_vs(out)
    return out


def run_ut_length(args) -> Dict:
    """The Universal Transformer's central point (Dehghani et al. 2019, §3.3: algorithmic tasks
    trained on short inputs and tested on longer ones): the UT at T = 2 against the 2-layer
    Transformer of ``run_ut_vs_transformer``, both trained on sums of 1-``--digits``-digit numbers
    and tested on sums of ``--digits`` + 1 to ``--digits`` + 2 digits (never seen), besides the
    in-distribution test; ``--seeds`` seeds, the seed drawing the batches too; the claim with >= 3."""
    short = AdditionTask(min_len=1, max_len=args.digits, eval_size=args.eval_examples)
    long = AdditionTask(min_len=args.digits + 1, max_len=args.digits + 2, eval_size=args.eval_examples)
    v = short.vocab
    sizes = dict(vocab_size=v.size, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id, d_model=64, n_heads=4, d_ff=256,
                 dropout=0.1, label_smoothing=0.0)
    arms = {"ut": lambda: UniversalTransformer(UniversalTransformerConfig(**sizes, act=False, max_steps=2)),
            "transformer": lambda: Transformer(TransformerConfig(**sizes, n_layers=2))}
    out: Dict = {"steps": args.ut_steps, "lr": args.ut_lr, "digits": args.digits, "eval_examples": args.eval_examples}
    for name, build in arms.items():
        runs = []
        for seed in range(args.seed, args.seed + args.seeds):
            torch.manual_seed(seed)
            model = build()
            seconds = train(model, short, args.ut_steps, 32, args.ut_lr, f"length-{name}-s{seed}", seed)
            inside = short.evaluate(model, "test", max_examples=args.eval_examples)
            longer = long.evaluate(model, "test", max_examples=args.eval_examples)
            runs.append({"seed": seed, "train_seconds": round(seconds, 1),
                         "exact_match": round(float(inside["exact_match"]), 4),
                         "longer_exact_match": round(float(longer["exact_match"]), 4),
                         "longer_token_accuracy": round(float(longer["token_accuracy"]), 4)})
            print("ut-length", name, runs[-1], flush=True)
        out[name] = runs
    if args.quick:
        return out
    (OUT / "length.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.seeds < claims.MIN_SEEDS:
        return out
    longer = {name: [r["longer_exact_match"] for r in out[name]] for name in arms}
    inside = {name: [r["exact_match"] for r in out[name]] for name in arms}
    tokens = {name: [r["longer_token_accuracy"] for r in out[name]] for name in arms}
    d = args.digits
    claims.record(
        id="ut-length-generalisation", model="universal-transformer", paper=UT_PAPER, better="higher", measured=True,
        claim="A Universal Transformer trained on short inputs of an algorithmic task generalises to longer ones "
              "better than a Transformer (§3.3: trained on short, tested on longer sequences).",
        command=f"{COMMAND} --part ut-length --seeds {args.seeds} --ut-steps {args.ut_steps} --digits {d}",
        ours=longer["ut"], baseline=longer["transformer"],
        budget=f"trained on sums of 1-{d}-digit numbers, {args.ut_steps} updates of 32, lr {args.ut_lr:g}, d_model 64, "
               f"4 heads, UT T = 2 against 2 layers; exact match on {args.eval_examples} test sums of {d + 1}-{d + 2} "
               "digits; CPU, one thread",
        why=f"exact match on the longer sums: UT {claims.fmt(longer['ut'])}, Transformer "
            f"{claims.fmt(longer['transformer'])} (per seed {longer['ut']} vs {longer['transformer']}); token accuracy "
            f"there {claims.fmt(tokens['ut'])} vs {claims.fmt(tokens['transformer'])}; in distribution (1-{d} digits) "
            f"{claims.fmt(inside['ut'])} vs {claims.fmt(inside['transformer'])}"
            + gap_why(longer["ut"], longer["transformer"], "higher", 0.0, "exact match"))
    return out


def publish_vs(saved: Dict) -> None:
    """Section 3 of the page from ``vs-transformer.json``: the main budget's table and verdict, and
    the larger budgets' rows (``budgets``) when there are any."""
    arms = (("ut", "Universal Transformer, T = 2"), ("transformer", "Transformer, 2 layers"))
    seeds = len(saved["ut"])
    exact = {name: [r["exact_match"] for r in saved[name]] for name, _ in arms}
    params = {name: saved[name][0]["params"] for name, _ in arms}
    lines = [
        UT_VS[0], "## 3. Universal Transformer against the Transformer on addition", "",
        f"`{COMMAND} --part ut-vs-transformer --seeds {seeds} --ut-steps {saved['steps']}` (one thread): the UT at "
        f"fixed depth T = 2 (one shared block applied twice, {params['ut']:,} parameters) against a Transformer of 2 "
        f"separate layers ({params['transformer']:,} parameters), both post-LN, d_model 64, 4 heads, d_ff 256, dropout "
        f"0.1, {saved['steps']} updates of 32 sums of 1-{saved['digits']} digits at lr {saved['lr']:g}; "
        f"{saved['eval_examples']} test sums (mean ± standard error over {seeds} seeds):", "",
        "| model | updates | exact match | token accuracy | per seed (exact match) |", "| --- | --- | --- | --- | --- |"]
    runs = [(saved["steps"], saved)] + sorted(((int(k), v) for k, v in saved.get("budgets", {}).items()))
    for steps, r in runs:
        for name, label in arms:
            e = [x["exact_match"] for x in r[name]]
            t = [x.get("token_accuracy", float("nan")) for x in r[name]]
            lines.append(f"| {label} | {steps} | {claims.fmt(e)} | {claims.fmt(t)} | {[round(x, 3) for x in e]} |")
    lines += ["", f"Verdict at {saved['steps']} updates ([claims.json](claims.json)): "
                  f"**{claims.verdict(exact['ut'], exact['transformer'], 'higher')}**"
              + "".join(f"; at {steps}: {claims.verdict([x['exact_match'] for x in r['ut']], [x['exact_match'] for x in r['transformer']], 'higher')}"
                        for steps, r in runs[1:]) + "."]
    last_steps, last = runs[-1]
    if len(runs) > 1 and all(min(x["exact_match"] for x in last[name]) >= 0.99 for name, _ in arms):
        spread = [x["exact_match"] for x in saved["transformer"]]
        lines += ["", f"At {last_steps} updates every seed of both solves the task (exact match >= 0.99): any effect "
                      f"of the shared weights is on how fast addition is learnt, not whether; at {saved['steps']} updates "
                      f"the Transformer's seeds spread from {min(spread):.2f} to {max(spread):.2f}, too widely for "
                      "the UT's lead to pass the one-sided Welch t-test at 5 %."]
    lines += [UT_VS[1]]
    replace_section(DOC, "\n".join(lines), UT_VS, "## What this shows")


UT_ACT = ("<!-- ut-act-carries -->", "<!-- /ut-act-carries -->")


def rewrite_ut_act_section(u: Dict, args) -> None:
    """Section 2b of the page from a seeded ``--part ut`` run: each ACT variant's seeds (exact match,
    ponder steps, the weight on step 1, digits with and without a carry coming in), the ponder steps
    by number of carries, and whether the claim could be judged (only where every seed learned)."""
    lines = [UT_ACT[0], "", f"### ACT on addition over seeds ({u['steps']} updates)", "",
             f"`{COMMAND} --part ut --variant NAME --seeds {args.seeds} --ut-steps {u['steps']}` (one thread, "
             f"{time.strftime('%Y-%m-%d')}): the UT with ACT (at most M = {u['max_steps']} steps, ponder weight "
             f"{u['ponder_weight']}), operands of 1-{u['digits']} digits, {u['eval_examples']} test sums; N is the "
             "number of ponder steps, p1 the halting weight on step 1 (averaged over output digits).", "",
             "| variant | seed | exact match | decoder N | encoder N | p1 | digit N, carry in | digit N, no carry in |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    judged = []
    for name in UT_VARIANTS:
        r = u.get(name)
        if not isinstance(r, dict) or "per_seed" not in r or r.get("overrides", {}).get("act") is False:
            continue
        p = r["per_seed"]
        for i, seed in enumerate(p["seed"]):
            lines.append(f"| {name} | {seed} | {p['exact_match'][i]:.3f} | {p['decoder_steps'][i]:.2f} | "
                         f"{p['encoder_steps'][i]:.2f} | {p['step1_weight'][i]:.3f} | "
                         f"{p['digit_steps_with_carry_in'][i]:.3f} | {p['digit_steps_without_carry_in'][i]:.3f} |")
        judged.append((name, p))
    lines.append("")
    for name in (n for n, _ in judged):
        by = u[name]["by_carries"]
        lines.append(f"- {name}, seed {u[name]['seed']}: mean decoder N by carries in the sum (difficulty) — "
                     + ", ".join(f"{c}: {by[c]['decoder_steps']:.2f} (n={by[c]['examples']})" for c in sorted(by, key=int))
                     + "; encoder " + ", ".join(f"{c}: {by[c]['encoder_steps']:.2f}" for c in sorted(by, key=int)) + ".")
    for name, p in judged:
        if len(p["seed"]) < claims.MIN_SEEDS:
            lines.append(f"- {name}: {len(p['seed'])} seed(s), no verdict (claims need {claims.MIN_SEEDS}).")
        elif min(p["exact_match"]) < LEARNED:
            lines.append(f"- {name}: no verdict — exact match {claims.fmt(p['exact_match'])} (lowest "
                         f"{min(p['exact_match']):.3f}) is under {LEARNED}, so ponder steps would describe a model "
                         "that has not learned addition; the claim stays pending.")
        else:
            v = claims.verdict(p["digit_steps_with_carry_in"], p["digit_steps_without_carry_in"], "higher")
            lines.append(f"- {name}: every seed learned (exact match {claims.fmt(p['exact_match'])}); output digits "
                         f"with a carry coming in take {claims.fmt(p['digit_steps_with_carry_in'])} decoder steps, "
                         f"those without {claims.fmt(p['digit_steps_without_carry_in'])}: **{v}** "
                         "([claims.json](claims.json), `ut-act-carries`).")
    for path in sorted((OUT / "tagged").glob("results-budget-*.json"), key=lambda q: int(q.stem.rsplit("-", 1)[1])):
        more = json.loads(path.read_text()).get("ut", {})  # a larger budget (--budgets) of the variants above
        for name, _ in judged:
            p = more.get(name, {}).get("per_seed")
            if not p or len(p["seed"]) < claims.MIN_SEEDS:
                continue
            learned = min(p["exact_match"]) >= LEARNED
            v = claims.verdict(p["digit_steps_with_carry_in"], p["digit_steps_without_carry_in"], "higher")
            lines.append(f"- {name} at {more['steps']} updates (`--budgets`): exact match {claims.fmt(p['exact_match'])}; "
                         f"digits with a carry coming in {claims.fmt(p['digit_steps_with_carry_in'])} decoder steps, "
                         f"without {claims.fmt(p['digit_steps_without_carry_in'])} (per seed {p['digit_steps_with_carry_in']}"
                         f" vs {p['digit_steps_without_carry_in']}): "
                         + (f"**{v}** (a point of the claim's budget curve)" if learned else "no verdict (not every seed learned)")
                         + ".")
    lines += ["", UT_ACT[1]]
    replace_section(DOC, "\n".join(lines), UT_ACT, "## What this shows")


def record_claims(results: Dict, point: str = "", measured: bool = False) -> None:
    """This page's claims from per-seed results with >= 3 seeds, into claims.json (``point``: a
    larger budget, added to each claim's budget curve). The UT's claim is refused (left pending)
    while the variant has not learned the task."""

    def put(**claim):
        if point:
            try:
                claims.add_point(claim["id"], point, claim["ours"], claim["baseline"])
            except ValueError as err:  # no main-budget claim yet
                print(err, flush=True)
        else:
            claims.record(**claim, measured=measured or None)

    s, u = results.get("span", {}), results.get("ut", {})
    a, f = s.get("adaptive", {}).get("per_seed"), s.get("full span", {}).get("per_seed")
    budget = (f"{s.get('steps')} steps of 16 x {s.get('block')} characters, {s.get('layers')} layers d_model 64, "
              f"S = {s.get('max_span')}; CPU, one thread")
    n_seeds = len(a["seed"]) if a else 3
    command = f"{COMMAND} --part span --seeds {n_seeds} --init-span {s.get('init_span', 256):g} --span-coef {s.get('span_loss_coef', 2e-5):g}"
    if a and f and min(len(a["seed"]), len(f["seed"])) >= claims.MIN_SEEDS:
        cost = claims.mean(a["computed"])
        put(
            id="adaptive-span-cost", model="adaptive-span", paper=SPAN_PAPER, command=command, budget=budget,
            claim="Learned spans keep the bits per character of full-span attention at a fraction of its attention "
                  f"cost (here: test bpc within {SPAN_MARGIN} of the full span's).",
            better="lower", margin=SPAN_MARGIN, ours=a["test_bpc"], baseline=f["test_bpc"],
            why=f"test bpc {claims.fmt(a['test_bpc'])} with {100 * cost:.0f}% of the attention scores, full span "
                f"{claims.fmt(f['test_bpc'])}" + gap_why(a["test_bpc"], f["test_bpc"], "lower", SPAN_MARGIN, "bpc"))
    if a and len(a["seed"]) >= claims.MIN_SEEDS:
        put(
            id="adaptive-span-pattern", model="adaptive-span", paper=SPAN_PAPER, command=command, budget=budget,
            claim="Lower layers learn short spans while some heads of the upper layers learn long ones (Figure 3).",
            better="higher", ours=a["upper_span"], baseline=a["lower_span"],
            why=f"mean learned span: upper half of the layers {claims.fmt(a['upper_span'])}, lower half "
                f"{claims.fmt(a['lower_span'])} (from z = {s.get('init_span', 0):g})"
                + gap_why(a["upper_span"], a["lower_span"], "higher", 0.0, "positions"))
    for name, r in u.items():
        if not isinstance(r, dict) or "per_seed" not in r or r.get("overrides", {}).get("act") is False:
            continue
        p = r["per_seed"]
        if len(p["seed"]) < claims.MIN_SEEDS:
            continue
        if min(p["exact_match"]) < LEARNED:
            print(f"no verdict for {name}: exact match {p['exact_match']} < {LEARNED}, the UT has not learned "
                  "addition; the ACT claim stays pending", flush=True)
            continue
        put(
            id="ut-act-carries", model="universal-transformer", paper=UT_PAPER,
            command=f"{COMMAND} --part ut --variant '{name}' --seeds {len(p['seed'])} --ut-steps {u['steps']}",
            budget=f"{u['steps']} steps of 32 sums of 1-{u['digits']} digits, d_model 64, M = {u['max_steps']}; CPU",
            claim="ACT spends more computation where the input is harder (here: ponder steps of output digits with a "
                  "carry coming in against those without).",
            better="higher", ours=p["digit_steps_with_carry_in"], baseline=p["digit_steps_without_carry_in"],
            why=f"{name}: decoder steps {claims.fmt(p['digit_steps_with_carry_in'])} with a carry in, "
                f"{claims.fmt(p['digit_steps_without_carry_in'])} without (per seed {p['digit_steps_with_carry_in']} vs "
                f"{p['digit_steps_without_carry_in']}); weight on step 1 {claims.fmt(p['step1_weight'])}; exact match "
                f"{claims.fmt(p['exact_match'])}"
                + gap_why(p["digit_steps_with_carry_in"], p["digit_steps_without_carry_in"], "higher", 0.0, "steps"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lm-steps", type=int, default=600)
    parser.add_argument("--lm-lr", type=float, default=3e-3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--max-span", type=int, default=256)
    parser.add_argument("--ramp", type=float, default=16.0)
    parser.add_argument("--span-coef", type=float, default=2e-5)
    parser.add_argument("--eval-segments", type=int, default=64)
    parser.add_argument("--time-len", type=int, default=2048)
    parser.add_argument("--ut-steps", type=int, default=1000)
    parser.add_argument("--ut-lr", type=float, default=2e-3)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--ponder-weight", type=float, default=0.01)
    parser.add_argument("--eval-examples", type=int, default=400)
    parser.add_argument("--init-span", type=float, default=256.0)
    parser.add_argument("--no-relative", dest="relative", action="store_false",
                        help="adaptive span without the paper's relative position embeddings (the model before they were added)")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and batch order (the first seed)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per variant (--seed, --seed + 1, ...); claims need 3")
    parser.add_argument("--budgets", type=int, nargs="*", default=[],
                        help="larger budgets (--lm-steps for span, --ut-steps for ut), each run with --seeds seeds and "
                             "added to the budget curves of the claims recorded at the main budget")
    parser.add_argument("--budgets-only", action="store_true",
                        help="run only --budgets (the main budget's results and claims stay as recorded)")
    parser.add_argument("--tag", default="", help="write the results to runs/repro_adaptive/tagged/...-TAG.json, "
                                                  "outside the page's results (side measurements)")
    parser.add_argument("--part", choices=["all", "span", "ut", "ut-vs-transformer", "ut-length", "doc"], default="all",
                        help="all: every variant then the doc; ut-length: the UT and the Transformer trained on short "
                             "sums, tested on longer ones (its claim); ut-vs-transformer: the UT (T = 2) against a 2-layer Transformer on addition, its claim and section 3; span/ut: one part (with --variant: one variant), its "
                             "results to runs/repro_adaptive/results-*.json; doc: the doc from the saved results")
    parser.add_argument("--variant", help=f"one of {list(SPAN_VARIANTS)} (span) or {list(UT_VARIANTS)} (ut)")
    args = parser.parse_args()
    if args.quick:
        args.lm_steps, args.ut_steps, args.eval_segments, args.eval_examples, args.time_len = 20, 20, 4, 40, 256
        global DOC, IMG, OUT
        DOC = smoke_dir("adaptive") / "adaptive.md"
        IMG = DOC.parent / "img"
        OUT = DOC.parent / "runs"  # a smoke run's run directories: the published ones keep their numbers
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    IMG.mkdir(parents=True, exist_ok=True)
    measured: Dict = {}  # this run's results, by part
    if args.part == "ut-length":
        run_ut_length(args)
        return
    if args.part == "ut-vs-transformer":
        if not args.budgets_only:
            run_ut_vs_transformer(args)
        for budget in args.budgets if not args.quick else []:
            run_ut_vs_transformer(args, budget)
        return
    started = time.time()
    for part, fn, variants in (("span", run_span, SPAN_VARIANTS), ("ut", run_ut, list(UT_VARIANTS))):
        if args.part not in ("all", part) or args.budgets_only:
            continue
        for name in variants:
            if args.variant not in (None, name):
                continue
            t0 = time.time()
            result = fn(args, name)
            measured.setdefault(part, {}).update(result[part])
            result[part][name]["seconds"] = round(time.time() - t0, 1)
            slug = name.split(" (")[0].replace(" ", "").replace("=", "").replace("+", "p").replace("-", "m")
            if args.tag:  # a side measurement: kept out of the page's results
                (OUT / "tagged").mkdir(exist_ok=True)
                (OUT / "tagged" / f"results-{part}-{slug}-{args.tag}.json").write_text(json.dumps(result, indent=2) + "\n")
            else:
                (OUT / f"results-{part}-{slug}.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.part == "ut" and not args.quick and not args.tag and not args.budgets_only and args.seeds >= claims.MIN_SEEDS:
        record_claims(measured, measured=True)  # the ACT variants' seeds just measured (refused while the UT has not learned)
        if DOC.exists():
            rewrite_ut_act_section(measured["ut"], args)
    if args.part == "span" and not args.quick and not args.tag and not args.budgets_only:
        record_claims(measured, measured=True)  # both span variants' seeds just measured (a claim needs >= 3 of each)
        if set(SPAN_VARIANTS) <= set(measured.get("span", {})) and DOC.exists():
            rewrite_span_section(measured["span"], args, time.time() - started)
    for budget in args.budgets if not args.quick else []:
        point: Dict = {}
        for part, fn, variants in (("span", run_span, SPAN_VARIANTS), ("ut", run_ut, list(UT_VARIANTS))):
            if args.part not in ("all", part):
                continue
            steps_arg = "lm_steps" if part == "span" else "ut_steps"
            main_steps = getattr(args, steps_arg)
            setattr(args, steps_arg, budget)
            for name in variants:
                if args.variant in (None, name):
                    for key, values in fn(args, name).items():
                        point.setdefault(key, {}).update(values)
            setattr(args, steps_arg, main_steps)
        (OUT / "tagged").mkdir(exist_ok=True)
        (OUT / "tagged" / f"results-budget-{budget}.json").write_text(json.dumps(point, indent=2) + "\n")
        record_claims(point, point=f"{budget} steps")
    if args.part in ("all", "doc"):
        results: Dict = {"command": COMMAND + (" --quick" if args.quick else "")}
        for path in sorted(OUT.glob("results-*-*.json")):
            for part, values in json.loads(path.read_text()).items():
                results.setdefault(part, {}).update(values)
        plot_spans(np.array(results["span"]["adaptive"]["spans"]), results["span"]["max_span"],
                   results["span"]["adaptive"]["widths"])
        plot_ponder(results["ut"])
        (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        write_doc(results, args)
        print(f"wrote {DOC}", flush=True)
        if not args.quick:
            record_claims(results)


if __name__ == "__main__":
    main()
