"""Reproduce docs/reproductions/long-context.md in one command.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py               # lm, tmaze, tmaze_wide: ~35 min of one core
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py --only tmaze  # one section (~25 min of one idle core)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py --only tmaze_budgets --tmaze-budgets 1200  # the memory claim's curve
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py --quick       # smoke run (numbers meaningless)

Sections:

1. ``lm``    Transformer-XL (Dai et al. 2019) vs a GPT of the same size (parameters within 1%, same
             steps, batch and segment length) on shakespeare-char. XL trains on contiguous streams
             with its memory carried by the trainer (``task.stream=true``); both are scored on the
             same test characters, XL with an evaluation memory of 0, 1, 2 and 4 segments.
2. ``tmaze`` a passive T-maze (a cue at step 0, a corridor of L steps, the choice at the junction;
             reward 1 for the cued arm), trained with REINFORCE on corridors drawn from 1..3S-2 with
             segments and memory of S = 4, so for L > 2S-2 the cue lies beyond the junction's direct
             span and reaches it only through the XL memory across layers: GTrXL (GRU gate), post-LN
             Transformer-XL and an LSTM, each over learning rate x depth x seed (5 seeds). The
             transformers act online, segment by segment, with their XL memory; the LSTM carries its
             state. Greedy success vs L, and the fraction of runs that learn beyond the span (>= 0.9).
3. ``tmaze_wide`` the longest corridor again with segments that hold the whole episode.

Results accumulate in ``docs/reproductions/long-context.json``; the markdown is rewritten from it.
"""

from __future__ import annotations

# What this script's claims depend on (benchmarks/claims.py: a claim is stale when one of these, or this
# script, changed since the commit it was measured at): claim id or "*" -> paths, "@group" = claims.GROUPS.
DEPENDS = {'*': ['@training',
       '@transformer',
       '@text',
       'src/qkv/models/transformer/transformer_xl.py',
       'src/qkv/attention/relative.py'],
 'transformer-xl-lm': ['src/qkv/models/transformer/gpt.py'],
 'transformer-xl-memory': ['src/qkv/models/transformer/gpt.py']}

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from qkv.models import GPT, GPTConfig, GTrXL, GTrXLConfig, TransformerXL, TransformerXLConfig  # noqa: E402
from qkv.tasks.lm import ShakespeareChar  # noqa: E402
import qkv.runs  # noqa: E402

import claims  # noqa: E402  (benchmarks/claims.py: the claims table and its verdicts)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions" / "long-context.md"
RESULTS = ROOT / "docs" / "reproductions" / "long-context.json"
IMG = ROOT / "docs" / "reproductions" / "img"
ADAPTIVE_DOC = ROOT / "docs" / "reproductions" / "adaptive.md"


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- 1. language model


def section_lm(quick: bool, seed: int = 0, plot: bool = True, steps: int = 1500) -> Dict[str, Any]:
    L, B = (16, 4) if quick else (48, 16)
    steps = 20 if quick else steps
    size = dict(n_layers=3, d_model=96, n_heads=4, dropout=0.0) if not quick else dict(n_layers=1, d_model=32, n_heads=2, dropout=0.0)
    d_ff = 4 * size["d_model"]
    stream_task, window_task = ShakespeareChar(block_size=L, stream=True), ShakespeareChar(block_size=L)
    V = stream_task.vocab.size
    torch.manual_seed(seed)
    xl = TransformerXL(TransformerXLConfig(vocab_size=V, d_ff=d_ff, residual="pre-ln", mem_len=L, max_len=L, **size))
    # GPT's feed-forward is widened until its parameter count matches XL's (XL adds W_{k,R} per layer, u, v)
    best = None
    for ff in range(d_ff, 2 * d_ff, 4):
        count = n_params(GPT(GPTConfig(vocab_size=V, d_ff=ff, max_len=L, **size)))
        if best is None or abs(count - n_params(xl)) < abs(best[1] - n_params(xl)):
            best = (ff, count)
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(vocab_size=V, d_ff=best[0], max_len=L, **size))
    result: Dict[str, Any] = {"seed": seed, "segment": L, "batch": B, "steps": steps, "size": size,
                              "params": {"transformer-xl": n_params(xl), "gpt": n_params(gpt)}, "gpt_d_ff": best[0]}
    recipe = dict(steps=steps, batch_size=B, lr=2e-3, warmup=50, weight_decay=0.0, schedule="cosine", eval_every=0,
                  eval_batches=0, eval_max_examples=64, log_every=10, progress=False, tensorboard=False, seed=seed)
    eval_examples = 64 if quick else 8 * 80  # 8 streams x 80 segments of the test split
    curves = {}
    for name, model, task in (("transformer-xl", xl, stream_task), ("gpt", gpt, window_task)):
        with tempfile.TemporaryDirectory() as out:
            start = time.time()
            with qkv.runs.Run.of(out, model, task, recipe) as run:
                run.train(save=False)
            records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], r["loss"]) for r in records if r["event"] == "train"]
        result[f"{name}_train_s"] = round(time.time() - start, 1)
    memories = [0, L, 2 * L, 4 * L]
    result["memories"] = memories
    result["xl_bpc"] = []
    for m in memories:
        xl.config.eval_mem_len = m
        metrics = stream_task.evaluate(xl, "test", max_examples=eval_examples, batch_size=8)
        result["xl_bpc"].append(round(metrics["bpc"], 4))
        result["tokens"] = int(metrics["tokens"])
    xl.config.eval_mem_len = None
    gpt_metrics = stream_task.evaluate(gpt, "test", max_examples=eval_examples, batch_size=8)  # same characters, no memory
    result["gpt_bpc"] = round(gpt_metrics["bpc"], 4)
    result["curves"] = curves
    if not plot:
        return result

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([m // L for m in memories], result["xl_bpc"], "o-", label="Transformer-XL")
    ax1.axhline(result["gpt_bpc"], color="C1", ls="--", label="GPT, fixed segments")
    ax1.set_xticks(range(5))
    ax1.set_xlabel(f"evaluation memory (segments of {L} characters)")
    ax1.set_ylabel("test bits per character")
    ax1.set_title("shakespeare-char")
    ax1.legend()
    for name, curve in curves.items():
        s, loss = zip(*curve)
        ax2.plot(s, [x / 0.6931 for x in loss], label=name)
    ax2.set_xlabel("update")
    ax2.set_ylabel("train bits per character")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(IMG / "long-context-xl-memory.png", dpi=110)
    plt.close(fig)
    return result


def section_lm_seeds(quick: bool, seeds: int) -> Dict[str, Any]:
    """Section 1 once per seed (initialisation and batch order): the first seed's result with its
    plot, and ``per_seed``, each seed's bits per character, for the claims."""
    result = section_lm(quick, seed=0)
    per_seed = [{k: result[k] for k in ("seed", "xl_bpc", "gpt_bpc")}]
    for seed in range(1, seeds):
        more = section_lm(quick, seed=seed, plot=False)
        per_seed.append({k: more[k] for k in ("seed", "xl_bpc", "gpt_bpc")})
        print("lm seed", seed, per_seed[-1], flush=True)
    return {**result, "per_seed": per_seed}


def section_lm_budgets(quick: bool, seeds: int, budgets: List[int]) -> Dict[str, Any]:
    """Section 1 at larger step budgets (``--lm-budgets``), every seed, no plot: the points of the
    two claims' budget curves (does a longer evaluation memory start to help with training?)."""
    out: Dict[str, Any] = {}
    for steps in budgets:
        start = time.time()
        per_seed = []
        for seed in range(seeds):
            r = section_lm(quick, seed=seed, plot=False, steps=steps)
            per_seed.append({k: r[k] for k in ("seed", "xl_bpc", "gpt_bpc", "transformer-xl_train_s", "gpt_train_s")})
            print("lm budget", steps, per_seed[-1], flush=True)
        out[str(r["steps"])] = {"memories": r["memories"], "segment": r["segment"], "per_seed": per_seed,
                                "seconds": round(time.time() - start, 1)}
    return out


# ----------------------------------------------------------------------------- 2. T-maze

CUE_UP, CUE_DOWN, CORRIDOR, JUNCTION = 0, 1, 2, 3


def tmaze_episodes(n: int, corridor: int, g: torch.Generator):
    """``(obs (n, corridor + 2) long, cue (n,) in {0, 1})``: the cue, the corridor, the junction."""
    cue = torch.randint(0, 2, (n,), generator=g)
    obs = torch.full((n, corridor + 2), CORRIDOR, dtype=torch.long)
    obs[:, 0] = cue  # CUE_UP = 0, CUE_DOWN = 1
    obs[:, -1] = JUNCTION
    return obs, cue


class XLPolicy(nn.Module):
    """A Transformer-XL / GTrXL body acting online: the episode is fed in segments, the memory
    (``XLMemory``, detached) carries what came before; a linear head scores the two arms."""

    def __init__(self, body: TransformerXL, segment: int) -> None:
        super().__init__()
        self.body, self.segment = body, segment
        self.head = nn.Linear(body.config.d_model, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        state, h = None, None
        for s in range(0, obs.shape[1], self.segment):
            h, _, state = self.body.encode(obs[:, s:s + self.segment], state=state, return_state=True)
        return self.head(h[:, -1])  # (n, 2) logits at the junction


class LSTMPolicy(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, d_model)
        self.lstm = nn.LSTM(d_model, d_model, batch_first=True)
        self.head = nn.Linear(d_model, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(obs))
        return self.head(h[:, -1])


def make_policy(kind: str, d_model: int, segment: int, n_layers: int = 2) -> nn.Module:
    common = dict(vocab_size=4, n_layers=n_layers, d_model=d_model, n_heads=2, d_ff=2 * d_model, dropout=0.0,
                  mem_len=segment, max_len=segment)
    if kind == "gtrxl":
        return XLPolicy(GTrXL(GTrXLConfig(**common)), segment)
    if kind == "xl-post-ln":
        return XLPolicy(TransformerXL(TransformerXLConfig(residual="post-ln", **common)), segment)
    if kind == "xl-pre-ln":
        return XLPolicy(TransformerXL(TransformerXLConfig(residual="pre-ln", **common)), segment)
    return LSTMPolicy(d_model)


def train_tmaze(kind: str, corridor: int, seed: int, updates: int, batch: int, segment: int,
                n_layers: int = 2, lr: float = 1e-3, train_lengths: Optional[Sequence[int]] = None,
                test_lengths: Sequence[int] = ()) -> Dict[str, Any]:
    """REINFORCE with a running-mean baseline on the junction choice; greedy success on 256 episodes
    of corridor ``corridor``. ``train_lengths``: each update draws its corridor from these (one length
    per batch) instead of ``corridor``; ``test_lengths``: greedy success at each of them too (``by_length``)."""
    torch.manual_seed(seed)
    policy = make_policy(kind, 32, segment, n_layers)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1000 + seed)
    lengths = list(train_lengths) if train_lengths else [corridor]
    baseline, first_solved, diverged = 0.5, None, None
    for update in range(updates):
        L = lengths[int(torch.randint(len(lengths), (1,), generator=g))] if len(lengths) > 1 else lengths[0]
        obs, cue = tmaze_episodes(batch, L, g)
        logits = policy(obs)
        if not torch.isfinite(logits).all():  # a run that diverged has failed to learn; it stops, it does not crash the grid
            diverged = update + 1
            break
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        reward = (action == cue).float()  # 1 for the cued arm
        loss = -((reward - baseline) * dist.log_prob(action)).mean() - 0.01 * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        baseline = 0.9 * baseline + 0.1 * float(reward.mean())
        if first_solved is None and baseline > 0.9:
            first_solved = update + 1

    def greedy(L: int) -> float:  # a diverged policy (non-finite logits) scores 0
        obs, cue = tmaze_episodes(256, L, torch.Generator().manual_seed(99))
        logits = policy(obs)
        return round(float(((logits.argmax(-1) == cue) & torch.isfinite(logits).all(-1)).float().mean()), 4)

    with torch.no_grad():
        out: Dict[str, Any] = {"success": greedy(corridor), "solved_at": first_solved}
        if diverged is not None:
            out["diverged_at"] = diverged
        if test_lengths:
            out["by_length"] = {str(L): greedy(L) for L in test_lengths}
    return out


TMAZE_KINDS = ("gtrxl", "xl-post-ln", "lstm")


def tmaze_reach(segment: int, n_layers: int) -> int:
    """The longest corridor whose cue (position 0) an ``n_layers`` XL stack with segments and memory of
    ``segment`` can reach from the junction (position L + 1, in segment t = (L + 1) // segment): layer n
    attends to its segment and the memory of the previous one, so n layers reach back to segment t - n.
    ``tmaze_reach(S, 1) = 2S - 2`` is the junction's direct span."""
    return (n_layers + 1) * segment - 2


def section_tmaze(quick: bool) -> Dict[str, Any]:
    """GTrXL, post-LN Transformer-XL and an LSTM on T-mazes whose corridor is drawn per update from
    1 .. 3S - 2: the longer ones put the cue beyond the junction's direct span, reachable only through
    the memory across layers. Every arm over a grid of learning rate x depth x seed."""
    segment = 4
    lrs = [1e-3, 1e-2] if quick else [1e-3, 3e-3, 1e-2]
    depths = [2] if quick else [2, 4, 8]
    seeds = [0] if quick else [0, 1, 2, 3, 4]
    updates, batch = (10, 16) if quick else (400, 64)
    lengths = list(range(1, tmaze_reach(segment, 2) + 1))
    runs: Dict[str, Dict[str, List[Dict[str, Any]]]] = {k: {} for k in TMAZE_KINDS}
    start = time.time()
    for kind in TMAZE_KINDS:
        for depth in depths if kind != "lstm" else [1]:
            for lr in lrs:
                cell = f"{depth}/{lr:g}"
                runs[kind][cell] = [train_tmaze(kind, lengths[-1], seed, updates, batch, segment, depth, lr,
                                                lengths, lengths) for seed in seeds]
                print("tmaze", kind, cell, [(r["success"], r["solved_at"]) for r in runs[kind][cell]], flush=True)
    result = {"lengths": lengths, "direct": tmaze_reach(segment, 1), "lrs": lrs, "depths": depths, "seeds": seeds,
              "updates": updates, "batch": batch, "segment": segment, "mem_len": segment, "runs": runs,
              "seconds": round(time.time() - start, 1)}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, kind in enumerate(TMAZE_KINDS):
        rs = [r for cell in runs[kind].values() for r in cell]
        ax.plot(lengths, [mean_of(r["by_length"][str(L)] for r in rs) for L in lengths], "o-", color=f"C{i}",
                label=f"{kind} ({len(rs)} runs)")
    ax.axvline(result["direct"] + 0.5, color="grey", ls=":", lw=1)  # beyond: the cue leaves the direct span
    ax.set_xlabel("corridor length L (right of the dotted line: cue beyond the direct span)")
    ax.set_ylabel("greedy success (mean of runs)")
    ax.set_title(f"passive T-maze, segments of {segment}, {updates} updates x {batch}", fontsize=9)
    ax.legend(fontsize=8)
    for i, kind in enumerate(TMAZE_KINDS[:2]):
        for j, depth in enumerate(depths):
            frac = [mean_of(learned(r, result) for r in runs[kind][f"{depth}/{lr:g}"]) for lr in lrs]
            bx.plot(lrs, frac, "o-" if kind == "gtrxl" else "s--", color=f"C{i}", alpha=1 - 0.25 * j,
                    label=f"{kind}, {depth} layers")
    bx.set_xscale("log")
    bx.set_xlabel("learning rate")
    bx.set_ylabel("fraction of seeds that learn beyond the span")
    bx.set_ylim(-0.05, 1.05)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig((Path(tempfile.gettempdir()) if quick else IMG) / "long-context-tmaze.png", dpi=110)
    plt.close(fig)
    return result


def section_tmaze_budgets(quick: bool, budgets: List[int]) -> Dict[str, Any]:
    """The memory claim's budget curve: section 2's 2-layer GTrXL and its LSTM (the same corridors, learning
    rates and seeds) trained for more updates (``--tmaze-budgets``). If GTrXL's shortfall beyond the direct
    span were a matter of training time, it would close here; if it is the bounded XL memory, it would not."""
    segment = 4
    lrs = [1e-3, 1e-2] if quick else [1e-3, 3e-3, 1e-2]
    seeds = [0] if quick else [0, 1, 2, 3, 4]
    batch = 16 if quick else 64
    lengths = list(range(1, tmaze_reach(segment, 2) + 1))
    points: Dict[str, Dict[str, Any]] = {}
    for updates in budgets:
        start, runs = time.time(), {}
        for kind, depth in (("gtrxl", 2), ("lstm", 1)):
            runs[kind] = {f"{depth}/{lr:g}": [train_tmaze(kind, lengths[-1], seed, updates, batch, segment, depth, lr,
                                                          lengths, lengths) for seed in seeds] for lr in lrs}
            print("tmaze budget", updates, kind, {c: [r["success"] for r in rs] for c, rs in runs[kind].items()}, flush=True)
        points[str(updates)] = {"runs": runs, "seconds": round(time.time() - start, 1)}
    return {"lengths": lengths, "direct": tmaze_reach(segment, 1), "lrs": lrs, "seeds": seeds, "batch": batch,
            "segment": segment, "budgets": points}


def tmaze_budget_values(tb: Dict[str, Any], updates: str) -> Dict[str, List[float]]:
    """``{kind: [greedy success beyond the direct span, one per run]}`` at one budget of ``tmaze_budgets``."""
    return {kind: [beyond_success(r, tb) for cell in cells.values() for r in cell]
            for kind, cells in tb["budgets"][updates]["runs"].items()}


def _tmaze_budget_lines(tb: Optional[Dict[str, Any]], tm: Optional[Dict[str, Any]]) -> List[str]:
    """``--only tmaze_budgets``: the memory claim at more updates (its budget curve)."""
    if not tb or not tb.get("budgets"):
        return []
    rows = []
    if tm and "lengths" in tm:
        shallow = [r for lr in tm["lrs"] for r in tm["runs"]["gtrxl"][f"{tm['depths'][0]}/{lr:g}"]]
        lstm = [r for lr in tm["lrs"] for r in tm["runs"]["lstm"][f"1/{lr:g}"]]
        rows.append(f"| {tm['updates']:,} (section 2) | {claims.fmt([beyond_success(r, tm) for r in shallow])} | "
                    f"{claims.fmt([beyond_success(r, tm) for r in lstm])} |")
    for updates in sorted(tb["budgets"], key=int):
        v = tmaze_budget_values(tb, updates)
        rows.append(f"| {int(updates):,} | {claims.fmt(v['gtrxl'])} | {claims.fmt(v['lstm'])} |")
    return [f"**More updates** (`--only tmaze_budgets --tmaze-budgets {' '.join(sorted(tb['budgets'], key=int))}`): "
            f"the 2-layer GTrXL and the LSTM of section 2, {len(tb['lrs'])} learning rates x {len(tb['seeds'])} seeds "
            f"each, greedy success on the corridors beyond the direct span (L = {tb['direct'] + 1}..{tb['lengths'][-1]}; "
            "mean ± standard error over the runs; the claim's curve in claims.json):", "",
            "| updates | GTrXL, 2 layers | LSTM |", "| --- | --- | --- |", *rows, ""]


def mean_of(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def beyond_success(run: Dict[str, Any], tm: Dict[str, Any]) -> float:
    """Greedy success averaged over the corridors whose cue is beyond the junction's direct span."""
    return mean_of(run["by_length"][str(L)] for L in tm["lengths"] if L > tm["direct"])


def learned(run: Dict[str, Any], tm: Dict[str, Any]) -> float:
    """1.0 when a run learns the corridors beyond the direct span (greedy success >= 0.9), else 0.0."""
    return 1.0 if beyond_success(run, tm) >= 0.9 else 0.0


def section_tmaze_wide(quick: bool) -> Dict[str, Any]:
    """The longest corridor again, with segments long enough to hold the whole episode: is the
    failure beyond the span a matter of the memory path, or of learning at all?"""
    L = 8 if quick else 20
    seeds = [0, 1] if quick else [0, 1, 2]
    updates, batch = (20, 16) if quick else (200, 64)
    segment = L + 4
    start = time.time()
    runs = {kind: [train_tmaze(kind, L, seed, updates, batch, segment) for seed in seeds]
            for kind in ("gtrxl", "xl-post-ln", "xl-pre-ln")}
    print(runs, flush=True)
    return {"corridor": L, "segment": segment, "seeds": seeds, "updates": updates, "batch": batch, "runs": runs,
            "seconds": round(time.time() - start, 1)}


def section_tmaze_depth(quick: bool, depths: List[int]) -> Dict[str, Any]:
    """The stability claim's curve along the axis the paper names (deep post-LN stacks): GTrXL and
    post-LN Transformer-XL on a single-corridor T-maze (L = 12, segments of 8: the cue in the junction's
    direct span; section 2's earlier design) with deeper stacks (``--depths``), lr 1e-3, 3 seeds. Section 2
    now runs depth inside its own grid, with the cue beyond the span."""
    L, seeds = (6, [0, 1]) if quick else (12, [0, 1, 2])
    updates, batch, segment = (20, 16, 8) if quick else (200, 64, 8)
    runs: Dict[str, Dict[str, List[Dict[str, float]]]] = {"gtrxl": {}, "xl-post-ln": {}}
    seconds: Dict[str, float] = {}
    for depth in depths:
        start = time.time()
        for kind in runs:
            runs[kind][str(depth)] = [train_tmaze(kind, L, seed, updates, batch, segment, depth) for seed in seeds]
            print("tmaze depth", depth, kind, runs[kind][str(depth)], flush=True)
        seconds[str(depth)] = round(time.time() - start, 1)
    return {"corridor": L, "depths": depths, "seeds": seeds, "updates": updates, "batch": batch, "segment": segment,
            "runs": runs, "seconds": seconds}


# ----------------------------------------------------------------------------- the page


def write_doc(results: Dict[str, Any], command: str) -> None:
    lines = ["# Long context: Transformer-XL and GTrXL", "",
             "Made by one command (numbers below are what it printed; plots in `img/`; each section can be rerun "
             "alone with `--only lm|tmaze|tmaze_wide`, which is how the numbers below were produced "
             "on the shared 2-core machine; each claim's commit and date are in claims.json):", "",
             f"    {command}", ""]
    lm = results.get("lm")
    if lm:
        L = lm["segment"]
        rows = "\n".join(f"| {m // L} x {L} = {m} | {b:.3f} | {lm['gpt_bpc']:.3f} |" for m, b in zip(lm["memories"], lm["xl_bpc"]))
        best = min(lm["xl_bpc"])
        lines += [
            "## Transformer-XL vs GPT: bits per character vs evaluation memory", "",
            f"shakespeare-char, segments of {L} characters, batch {lm['batch']}, {lm['steps']} updates (AdamW, lr 2e-3, "
            f"cosine), both pre-LN, {lm['size']['n_layers']} layers, d_model {lm['size']['d_model']}, "
            f"{lm['size']['n_heads']} heads, no dropout. Parameters: Transformer-XL {lm['params']['transformer-xl']:,}, "
            f"GPT {lm['params']['gpt']:,} (GPT's d_ff widened to {lm['gpt_d_ff']} to match XL's W_R). "
            f"XL trains on {lm['batch']} contiguous streams (`task.stream=true`), its memory of {L} states per layer "
            f"carried by the trainer from step to step; GPT on random windows with learned positions. "
            f"Both are scored on the same {lm['tokens']:,} test characters (8 contiguous streams); GPT sees each "
            f"segment alone, XL segment by segment with its memory (`--set eval_mem_len=M`). "
            f"Training took {lm['transformer-xl_train_s']} s (XL) and {lm['gpt_train_s']} s (GPT) of wall-clock time, "
            f"single-threaded, on the 2-core machine with one other one-thread training on the other core.", "",
            "| XL evaluation memory | Transformer-XL bpc | GPT bpc (fixed segments) |", "| --- | --- | --- |", rows, "",
            "![bpc vs memory](img/long-context-xl-memory.png)", "",
            _lm_verdict(lm, best), "", *_lm_seeds_table(lm), *_lm_budgets_lines(results.get("lm_budgets"))]
    tm = results.get("tmaze")
    if tm and "lengths" in tm:
        S, direct, reach = tm["segment"], tm["direct"], tm["lengths"][-1]
        head = "| model | " + " | ".join(f"L = {L}" for L in tm["lengths"]) + " |"
        sep = "| --- |" + " --- |" * len(tm["lengths"])
        rows = []
        for kind, cells in tm["runs"].items():
            rs = [r for cell in cells.values() for r in cell]
            rows.append(f"| {kind} ({len(rs)} runs) | " + " | ".join(
                f"{mean_of(r['by_length'][str(L)] for r in rs):.2f}" for L in tm["lengths"]) + " |")
        grid_head = "| model | layers | " + " | ".join(f"lr {lr:g}" for lr in tm["lrs"]) + " |"
        grid_sep = "| --- | --- |" + " --- |" * len(tm["lrs"])
        grid = []
        for kind, cells in tm["runs"].items():
            for depth in sorted({int(c.split("/")[0]) for c in cells}):
                out = []
                for lr in tm["lrs"]:
                    rs = cells[f"{depth}/{lr:g}"]
                    solved = [r["solved_at"] if r["solved_at"] is not None else tm["updates"] for r in rs]
                    div = sum("diverged_at" in r for r in rs)
                    out.append(f"{int(sum(learned(r, tm) for r in rs))}/{len(rs)}, solved at {solved}"
                               + (f", {div} diverged (non-finite logits)" if div else ""))
                grid.append(f"| {kind} | {depth if kind != 'lstm' else '1 (LSTM)'} | " + " | ".join(out) + " |")
        lines += [
            "## GTrXL vs Transformer-XL vs LSTM on a passive T-maze with the cue beyond the attention span", "",
            f"An episode shows the cue (up or down) at step 0, then L corridor steps, then the junction, where the "
            f"agent picks an arm: reward 1 for the cued arm, 0 otherwise. Each update draws one corridor length "
            f"L from 1 to {reach} for its {tm['batch']} episodes; policies are trained with REINFORCE (running-mean "
            f"baseline, entropy bonus 0.01, Adam, gradient norm clipped at 1) for {tm['updates']} updates; success "
            f"is the greedy policy's on 256 new episodes per length. Transformers: d_model 32, 2 heads, acting "
            f"online in segments of {S} steps with an XL memory of {S} states per layer (detached: a stop-gradient, "
            f"as in the paper); `gtrxl` is the GRU gate with b_g = 2, `xl-post-ln` the canonical Transformer-XL "
            f"wiring. LSTM: one layer of 32, back-propagated through the whole episode.", "",
            f"**Where the cue is.** The junction (position L + 1) sits in segment t = floor((L + 1) / {S}). Layer n "
            f"attends to its own segment and the memory of layer n-1's states from segment t - 1, so the junction's "
            f"first layer sees the cue *directly* only while L <= {direct}; for {direct + 1} <= L <= {reach} the cue "
            f"lies beyond that window, and reaches the junction only across layers: layer 2 reads the memory of "
            f"layer-1 states computed in the previous segment, which had the cue in their own window (Transformer-XL's "
            f"longest dependency growing with the number of layers, about N x memory). No gradient flows along that path "
            f"(the memory is detached), so what carries the cue there is what layer 1 learned on the short "
            f"corridors, where the cue sits in the junction segment's window with gradient. Every {reach}-step "
            f"corridor is within two layers' reach, so depth adds capacity, not reach.", "",
            f"Every arm runs over a grid of learning rates {tm['lrs']} x depths {tm['depths']} (the LSTM: one layer) "
            f"x seeds {tm['seeds']} (the seed sets initialisation and episodes). A run *learns* when its greedy "
            f"success averaged over the corridors beyond the direct span (L = {direct + 1} .. {reach}) reaches 0.9. "
            f"Run time: {tm['seconds']} s wall-clock on the shared machine.", "",
            "Mean greedy success by corridor length, over every run of the grid:", "", head, sep, *rows, "",
            "Runs that learn beyond the direct span, and the update at which the running reward first passed 0.9 "
            f"({tm['updates']}: never), per cell of the grid:", "", grid_head, grid_sep, *grid, "",
            "![T-maze](img/long-context-tmaze.png)", "",
            _tmaze_verdict(tm), ""]
    lines += _tmaze_budget_lines(results.get("tmaze_budgets"), tm)
    lines += _tmaze_depth_lines(results.get("tmaze_depth"))
    wide = results.get("tmaze_wide")
    if wide:
        cells = ", ".join(f"{k} {sum(r['success'] >= 0.9 for r in rs)}/{len(rs)} (mean success "
                          f"{sum(r['success'] for r in rs) / len(rs):.2f})" for k, rs in wide["runs"].items())
        lines += [f"The same transformers at L = {wide['corridor']} with segments of {wide['segment']} steps (the whole "
                  f"episode in one segment, so the cue is in the junction's span with gradient), same recipe: seeds "
                  f"that learn — {cells} ({wide['seconds']} s wall-clock). Beyond the segment-plus-memory span an "
                  f"XL agent only keeps what its earlier segments happened to compute; inside it, it learns.", ""]
    if ADAPTIVE_DOC.is_file():
        lines += ["See also [adaptive.md](adaptive.md): adaptive attention span, ACT and the Universal Transformer.", ""]
    DOC.write_text("\n".join(lines))


def _lm_verdict(lm: Dict[str, Any], best: float) -> str:
    xl, gpt = lm["xl_bpc"], lm["gpt_bpc"]
    parts = []
    parts.append(f"With memory, XL {'beats' if min(xl[1:]) < gpt else 'does not beat'} the GPT of the same size "
                 f"({min(xl[1:]):.3f} vs {gpt:.3f} bpc); without memory it scores {xl[0]:.3f}.")
    monotone = all(b <= a + 1e-4 for a, b in zip(xl, xl[1:]))
    parts.append("A longer evaluation memory than in training keeps helping (the paper's claim, §4)." if monotone else
                 "A longer memory than in training does not help monotonically here: " +
                 ", ".join(f"{m}: {b:.3f}" for m, b in zip(lm["memories"], xl)) + ".")
    return " ".join(parts)


def _lm_seeds_table(lm: Dict[str, Any]) -> List[str]:
    """Every seed's numbers (``--seeds N``); the claims' verdicts are computed from them in claims.json."""
    per_seed = lm.get("per_seed", [])
    if len(per_seed) < 2:
        return []
    head = "| seed | " + " | ".join(f"XL, memory {m}" for m in lm["memories"]) + " | GPT |"
    sep = "| --- |" + " --- |" * (len(lm["memories"]) + 1)
    rows = [f"| {r['seed']} | " + " | ".join(f"{b:.4f}" for b in r["xl_bpc"]) + f" | {r['gpt_bpc']:.4f} |"
            for r in per_seed]
    means = [claims.fmt([r["xl_bpc"][i] for r in per_seed]) for i in range(len(lm["memories"]))]
    rows.append("| mean ± se | " + " | ".join(means) + f" | {claims.fmt([r['gpt_bpc'] for r in per_seed])} |")
    return [f"Test bits per character with {len(per_seed)} seeds (initialisation and batch order; the plot and the "
            "paragraph above are seed 0); the verdicts of the two claims measured here — XL against GPT, and memory "
            "beyond the training memory — are computed in [claims.json](claims.json):", "", head, sep, *rows, ""]


def _lm_budgets_lines(budgets: Optional[Dict[str, Any]]) -> List[str]:
    """``--only lm_budgets``: the memory sweep again after more updates (the budget curve)."""
    if not budgets:
        return []
    head = None
    rows, changes = [], []

    def bpc4(xs):  # the memory effects are in the third decimal
        return f"{claims.mean(xs):.4f} ± {claims.standard_error(xs):.4f}"

    for steps, b in sorted(budgets.items(), key=lambda kv: int(kv[0])):
        ps, mems = b["per_seed"], b["memories"]
        head = head or ("| updates | " + " | ".join(f"XL, memory {m}" for m in mems) + " | GPT |")
        rows.append(f"| {int(steps):,} | " + " | ".join(bpc4([r["xl_bpc"][i] for r in ps]) for i in range(len(mems)))
                    + f" | {bpc4([r['gpt_bpc'] for r in ps])} |")
        at = [claims.mean([r["xl_bpc"][i] for r in ps]) for i in range(len(mems))]
        changes.append(f"{int(steps):,} updates: {at[-1] - at[1]:+.4f} bpc from memory {mems[1]} to {mems[-1]} "
                       f"({at[1] - at[0]:+.4f} from 0 to {mems[1]})")
    seeds = len(next(iter(budgets.values()))["per_seed"])
    return [f"**Larger budgets** (`--only lm_budgets --seeds {seeds} --lm-budgets "
            f"{' '.join(sorted(budgets, key=int))}`, the same models and recipe trained longer; test bpc, mean ± "
            f"standard error over {seeds} seeds; the points of both claims' budget curves in "
            "[claims.json](claims.json)):", "", head, "| --- |" + " --- |" * (len(mems) + 1), *rows, "",
            "Memory beyond the training memory, by budget (mean over seeds; negative = lower loss): "
            + "; ".join(changes) + ".", ""]


def _tmaze_depth_lines(td: Optional[Dict[str, Any]]) -> List[str]:
    """``--only tmaze_depth``: GTrXL against post-LN Transformer-XL with deeper stacks."""
    if not td:
        return []
    rows = []
    for depth in td["depths"]:
        cells = []
        for kind in ("gtrxl", "xl-post-ln"):
            rs = td["runs"][kind][str(depth)]
            solved = [r["solved_at"] if r["solved_at"] is not None else td["updates"] for r in rs]
            cells.append(f"{claims.fmt([r['success'] for r in rs])} ({sum(r['success'] >= 0.9 for r in rs)}/{len(rs)}), "
                         f"solved at {solved}")
        rows.append(f"| {depth} | " + " | ".join(cells) + f" | {td['seconds'][str(depth)]:.0f} |")
    return [f"**Deeper stacks** (`--only tmaze_depth --depths {' '.join(map(str, td['depths']))}`): the paper "
            f"places the post-LN instability in deep stacks; an earlier, single-corridor version of the T-maze above ran "
            f"deeper stacks at L = {td['corridor']} (the cue in the junction's direct span), segments of {td['segment']}, "
            f"lr 1e-3, seeds {td['seeds']}; greedy success (seeds that "
            f"learn) and the update at which the running reward passed 0.9 ({td['updates']} where it never did):", "",
            "| layers | GTrXL | post-LN Transformer-XL | seconds |", "| --- | --- | --- | --- |", *rows, ""]


def _tmaze_verdict(tm: Dict[str, Any]) -> str:
    arms = {k: [r for cell in cells.values() for r in cell] for k, cells in tm["runs"].items()}
    frac = {k: mean_of(learned(r, tm) for r in rs) for k, rs in arms.items()}
    within = {k: mean_of(r["by_length"][str(L)] for r in rs for L in tm["lengths"] if L <= tm["direct"])
              for k, rs in arms.items()}
    beyond = {k: mean_of(beyond_success(r, tm) for r in rs) for k, rs in arms.items()}
    return " ".join([
        "Fraction of runs that learn beyond the direct span: " +
        ", ".join(f"{k} {frac[k]:.2f} ({int(frac[k] * len(rs) + 0.5)}/{len(rs)})" for k, rs in arms.items()) + ".",
        "Mean greedy success within the direct span / beyond it: " +
        ", ".join(f"{k} {within[k]:.2f} / {beyond[k]:.2f}" for k in arms) + ".",
        "The three claims this section measures, with their per-run numbers and computed verdicts, are in "
        "[claims.json](claims.json) ([README](README.md)): GTrXL against the LSTM by success beyond the span, and "
        "against post-LN Transformer-XL by updates to solve and by the fraction of the grid's runs that learn."])


GTRXL = "Parisotto et al. 2019, Stabilizing Transformers for Reinforcement Learning (arXiv:1910.06764)"


XL = "Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context (arXiv:1901.02860)"


def record_lm_claims(lm: Dict[str, Any], command: str, measured: bool = False) -> None:
    """Section 1's two claims, one value per seed, into docs/reproductions/claims.json."""
    per_seed = lm.get("per_seed", [])
    if len(per_seed) < claims.MIN_SEEDS:
        return
    L, memories = lm["segment"], lm["memories"]
    at = {m: [r["xl_bpc"][i] for r in per_seed] for i, m in enumerate(memories)}
    gpt = [r["gpt_bpc"] for r in per_seed]
    fmt = claims.fmt
    budget = (f"shakespeare-char, {lm['steps']} updates of {lm['batch']} x {L} characters, {lm['size']['n_layers']} "
              f"layers d_model {lm['size']['d_model']}, {lm['params']['transformer-xl']:,} vs {lm['params']['gpt']:,} "
              f"parameters; test bpc on {lm['tokens']:,} characters; CPU, one thread")
    cmd = f"{command} --only lm --seeds {len(per_seed)}"
    claims.record(
        id="transformer-xl-lm", model="transformer-xl", paper=XL, measured=measured or None,
        claim="Segment-level recurrence gives a lower bits per character than a Transformer of the same size "
              "trained and evaluated on fixed-length segments.",
        command=cmd, better="lower", ours=at[L], baseline=gpt, budget=budget,
        why={"reproduced": f"test bpc Transformer-XL (memory {L}) {fmt(at[L])}, GPT on fixed {L}-character "
                           f"segments {fmt(gpt)}; XL without memory {fmt(at[0])}",
             "not reproduced": f"test bpc Transformer-XL (memory {L}) {fmt(at[L])} against GPT's {fmt(gpt)}: "
                               + claims.gap(at[L], gpt, "lower")})
    longest = memories[-1]
    gains = " / ".join(f"{m}: {fmt(at[m])}" for m in memories)
    # the effective context length (Khandelwal et al. 2018, the base of the paper's RECL): the shortest
    # memory from which one step longer lowers the mean loss by less than r = 1 % (relative)
    mean_at = [claims.mean(at[m]) for m in memories]
    ecl = next((m for m, a, b in zip(memories, mean_at, mean_at[1:]) if (a - b) / a < 0.01), longest)
    claims.record(
        id="transformer-xl-memory", model="transformer-xl", paper=XL, measured=measured or None,
        claim="An evaluation memory longer than the one used in training keeps lowering the loss (the attention "
              "length grows beyond the training memory).",
        command=cmd, better="lower", ours=at[longest], baseline=at[L], budget=budget,
        why={"reproduced": f"test bpc by evaluation memory {gains}",
             "not reproduced": f"test bpc by evaluation memory {gains}: memory beyond the training memory of {L} "
                               f"changes the loss by {claims.mean(at[longest]) - claims.mean(at[L]):+.4f} bpc; what "
                               f"helps is the first segment of memory (from 0 to {L} it lowers the loss by "
                               f"{claims.mean(at[0]) - claims.mean(at[L]):.4f} bpc): the effective context length (the shortest memory that one "
                               f"step longer improves by under 1 %, the measure RECL is built on) is {ecl} positions "
                               f"of memory, the training memory"})


def record_curves(results: Dict[str, Any], only: List[str]) -> None:
    """The budget-curve points of the sections just run (``lm_budgets``, ``tmaze_depth``)."""
    if "lm_budgets" in only:
        for steps, b in results.get("lm_budgets", {}).items():
            ps, mems, L = b["per_seed"], b["memories"], b["segment"]
            if len(ps) < claims.MIN_SEEDS:
                continue
            at = {m: [r["xl_bpc"][i] for r in ps] for i, m in enumerate(mems)}
            claims.add_point("transformer-xl-lm", f"{steps} updates", at[L], [r["gpt_bpc"] for r in ps])
            claims.add_point("transformer-xl-memory", f"{steps} updates", at[mems[-1]], at[L])
    tb = results.get("tmaze_budgets")
    if "tmaze_budgets" in only and tb and len(tb["seeds"]) >= claims.MIN_SEEDS:
        for updates in tb["budgets"]:
            v = tmaze_budget_values(tb, updates)
            claims.add_point("gtrxl-vs-lstm-memory", f"{updates} updates", v["gtrxl"], v["lstm"])
    td = results.get("tmaze_depth")
    if "tmaze_depth" in only and td and len(td["seeds"]) >= claims.MIN_SEEDS:
        for depth in td["depths"]:
            runs = {k: td["runs"][k][str(depth)] for k in ("gtrxl", "xl-post-ln")}
            solved = {k: [r["solved_at"] if r["solved_at"] is not None else td["updates"] for r in rs]
                      for k, rs in runs.items()}
            claims.add_point("gtrxl-vs-trxl-stability", f"{depth} layers",
                             [r["success"] for r in runs["gtrxl"]], [r["success"] for r in runs["xl-post-ln"]])
            claims.add_point("gtrxl-vs-trxl-speed", f"{depth} layers", solved["gtrxl"], solved["xl-post-ln"])


def record_claims(results: Dict[str, Any], command: str, ran: Sequence[str] = ()) -> None:
    """The claims of sections 1 and 2, one value per seed, into docs/reproductions/claims.json
    (``ran``: the sections this process measured; the others are re-recorded from saved results)."""
    if results.get("lm"):
        record_lm_claims(results["lm"], command, measured="lm" in ran)
    tm = results.get("tmaze")
    if not tm or "lengths" not in tm or len(tm["seeds"]) < claims.MIN_SEEDS:
        return
    S, updates, direct, reach = tm["segment"], tm["updates"], tm["direct"], tm["lengths"][-1]
    cells = [f"{d}/{lr:g}" for d in tm["depths"] for lr in tm["lrs"]]
    shallow = [f"{tm['depths'][0]}/{lr:g}" for lr in tm["lrs"]]
    arm = {k: [r for c in (cells if k != "lstm" else [f"1/{lr:g}" for lr in tm["lrs"]]) for r in tm["runs"][k][c]]
           for k in tm["runs"]}
    gtrxl_shallow = [r for c in shallow for r in tm["runs"]["gtrxl"][c]]
    n_grid = f"{len(tm['lrs'])} learning rates {tm['lrs']} x {len(tm['depths'])} depths {tm['depths']} x {len(tm['seeds'])} seeds"
    budget = (f"{updates} REINFORCE updates x {tm['batch']} episodes, corridor L drawn from 1..{reach} per update, "
              f"segments and XL memory of {S} (cue beyond the direct span for L > {direct}), d_model 32, grid of "
              f"{n_grid}; CPU, one thread")
    cmd = command + " --only tmaze"
    mean, fmt = claims.mean, claims.fmt

    def solved(rs):  # updates until the running reward passed 0.9; a run that never did counts the budget
        return [r["solved_at"] if r["solved_at"] is not None else updates for r in rs]

    g_mem = [beyond_success(r, tm) for r in gtrxl_shallow]
    lstm_mem = [beyond_success(r, tm) for r in arm["lstm"]]
    claims.record(
        id="gtrxl-vs-lstm-memory", model="gtrxl", paper=GTRXL, measured="tmaze" in ran or None,
        claim="The Gated Transformer-XL surpasses LSTMs on memory environments.",
        command=cmd, better="higher", ours=g_mem, baseline=lstm_mem, budget=budget,
        why={"reproduced": f"greedy success on the corridors whose cue lies beyond the direct span (L = {direct + 1}.."
                           f"{reach}), one value per run of {len(tm['lrs'])} learning rates x {len(tm['seeds'])} seeds: "
                           f"{tm['depths'][0]}-layer GTrXL {fmt(g_mem)}, LSTM {fmt(lstm_mem)}; updates to solve "
                           f"{mean(solved(gtrxl_shallow)):.0f} / {mean(solved(arm['lstm'])):.0f}",
             "not reproduced": f"greedy success on the corridors whose cue lies beyond the direct span (L = "
                               f"{direct + 1}..{reach}), one value per run of {len(tm['lrs'])} learning rates x "
                               f"{len(tm['seeds'])} seeds: {tm['depths'][0]}-layer GTrXL {fmt(g_mem)} against the "
                               f"LSTM's {fmt(lstm_mem)}: " + claims.gap(g_mem, lstm_mem, "higher") +
                               f"; updates to solve {mean(solved(gtrxl_shallow)):.0f} / {mean(solved(arm['lstm'])):.0f}"
                               " (the LSTM's state is unbounded, the XL memory is not)"})
    g, p = solved(arm["gtrxl"]), solved(arm["xl-post-ln"])
    claims.record(
        id="gtrxl-vs-trxl-speed", model="gtrxl", paper=GTRXL, measured="tmaze" in ran or None,
        claim="The gating layers give GTrXL faster learning than the canonical (post-LN) Transformer-XL.",
        command=cmd, better="lower", ours=g, baseline=p, budget=budget,
        why={"reproduced": f"updates until the running reward passed 0.9 (the budget, {updates}, for a run that never "
                           f"did), one value per run of the grid ({n_grid}): GTrXL {mean(g):.0f}, post-LN TrXL {mean(p):.0f}",
             "not reproduced": f"updates until the running reward passed 0.9 ({updates} for a run that never did), "
                               f"one value per run of the grid ({n_grid}): GTrXL {mean(g):.0f} against post-LN TrXL's "
                               f"{mean(p):.0f}: " + claims.gap(g, p, "lower")})
    gs, ps = [learned(r, tm) for r in arm["gtrxl"]], [learned(r, tm) for r in arm["xl-post-ln"]]
    design = (f"one value per run of the grid ({n_grid}): 1 if the run learns the corridors beyond the direct span "
              f"(greedy success >= 0.9), else 0, so the mean is the fraction of runs that learn and the Welch test "
              f"on these values is the two-proportion comparison the paper's hyperparameter sweeps make; each run "
              f"is an independent training (its own initialisation and episodes)")
    by_cell = "; ".join(f"{c}: {int(sum(learned(r, tm) for r in tm['runs']['gtrxl'][c]))}/{len(tm['seeds'])} vs "
                        f"{int(sum(learned(r, tm) for r in tm['runs']['xl-post-ln'][c]))}/{len(tm['seeds'])}"
                        for c in cells)
    claims.record(
        id="gtrxl-vs-trxl-stability", model="gtrxl", paper=GTRXL, measured="tmaze" in ran or None,
        claim="Where the canonical post-LN Transformer-XL often fails to learn in RL, the gated GTrXL learns reliably.",
        command=cmd, better="higher", ours=gs, baseline=ps, budget=budget,
        why={"reproduced": f"fraction of runs that learn, GTrXL {mean(gs):.2f}, post-LN TrXL {mean(ps):.2f}; {design}; "
                           f"by depth/lr cell, GTrXL vs post-LN: {by_cell}",
             "not reproduced": f"fraction of runs that learn, GTrXL {mean(gs):.2f} against post-LN TrXL's "
                               f"{mean(ps):.2f}: " + claims.gap(gs, ps, "higher") + f"; {design}; by depth/lr cell, "
                               f"GTrXL vs post-LN: {by_cell}"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=["lm", "tmaze", "tmaze_wide", "lm_budgets", "tmaze_depth",
                                                      "tmaze_budgets"], default=None,
                        help="sections to run (default: lm, tmaze, tmaze_wide); lm_budgets, tmaze_depth and "
                             "tmaze_budgets are the claims' budget curves (--lm-budgets, --depths, --tmaze-budgets)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; numbers meaningless, doc not rewritten")
    parser.add_argument("--doc", action="store_true", help="only rewrite the markdown from the saved results")
    parser.add_argument("--seeds", type=int, default=1,
                        help="lm: seeds (initialisation and batch order) of both models; claims need 3")
    parser.add_argument("--lm-budgets", type=int, nargs="+", default=[3000, 6000],
                        help="lm_budgets: larger numbers of updates for section 1 (each with --seeds seeds)")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8],
                        help="tmaze_depth: deeper stacks for GTrXL and post-LN Transformer-XL")
    parser.add_argument("--tmaze-budgets", type=int, nargs="+", default=[1200],
                        help="tmaze_budgets: more REINFORCE updates for section 2's GTrXL and LSTM (the memory claim's curve)")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be a positive integer, got {args.seeds}")
    if any(b < 1 for b in args.tmaze_budgets + args.lm_budgets + args.depths):
        parser.error("--tmaze-budgets, --lm-budgets and --depths take positive integers")
    torch.set_num_threads(1)
    IMG.mkdir(parents=True, exist_ok=True)
    sections = {"lm": lambda quick: section_lm_seeds(quick, args.seeds), "tmaze": section_tmaze,
                "tmaze_wide": section_tmaze_wide,
                "lm_budgets": lambda quick: section_lm_budgets(quick, args.seeds, args.lm_budgets),
                "tmaze_depth": lambda quick: section_tmaze_depth(quick, args.depths),
                "tmaze_budgets": lambda quick: section_tmaze_budgets(quick, args.tmaze_budgets)}
    for name in [] if args.doc else args.only or ["lm", "tmaze", "tmaze_wide"]:
        result = sections[name](args.quick)
        print(name, json.dumps({k: v for k, v in result.items() if k not in ("curves", "runs", "per_seed")}), flush=True)
        if not args.quick:  # re-read: another section may have finished meanwhile
            results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
            RESULTS.write_text(json.dumps({**results, name: result}, indent=1) + "\n")
    if not args.quick:
        results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        write_doc(results, "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py")
        record_claims(results, "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/repro_long_context.py",
                      [] if args.doc else args.only or ["lm", "tmaze", "tmaze_wide"])
        record_curves(results, [] if args.doc else args.only or [])


if __name__ == "__main__":
    main()
