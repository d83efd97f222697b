"""What each non-text task's models attend to, as labelled ``qkv.viz.AttentionView``s.

``qkv viz RUN`` (PNG) and ``qkv viz RUN --html`` draw any ``AttentionView``; the language-model and
sequence-to-sequence kinds are labelled with their tokens by ``qkv.viz.attention_view``. The tasks
whose inputs are bags of images, documents, stories, bit sequences, points or graphs define
``attention_view(model, text=None, max_len=48)`` with the functions below, so that every panel is
labelled with what the paper's figure shows: MIL instance weights over the bag's digits, HAN word
and sentence weights over the article's text, memory-network hops over the story's sentences,
NTM read/write weightings over time, Nadaraya-Watson weights over the training points, GAT edge
weights on the karate graph, SE channel gates per digit class.

A model of such a task that forms no attention weights (Deep Sets' sum pooling, the flat GRU and
LSTM baselines) gets a ``ValueError`` saying so: there is nothing to show.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .._nn import evaluating, module_device
from ..viz import AttentionView

__all__ = ["run_with_weights", "token_view", "image_view", "nadaraya_watson_view", "bag_view", "document_view", "story_view",
           "ntm_view", "graph_view", "gates_view"]


@torch.no_grad()
def text_index(text: Optional[str], n: int, what: str, default: int = 0) -> int:
    """``qkv viz --text`` read as the index of a test example (``what``: e.g. ``"story"``) among
    ``n``; ``default`` without a text. A ValueError names ``--text`` and the range otherwise."""
    if text is None:
        return default
    try:
        pick = int(text)
    except ValueError:
        pick = None
    if pick is None or not 0 <= pick < n:
        raise ValueError(f"--text picks a test {what} of this task by its index, an int in [0, {n}); got {text!r}")
    return pick


def run_with_weights(model: torch.nn.Module, batch: Dict[str, Tensor], meta_keys: Sequence[str] = ()) -> Any:
    """``model(**batch, need_weights=True)`` in eval mode on the model's device; refuses a model
    that returns no weights."""
    with evaluating(model):
        device = module_device(model)
        out = model(**{k: v.to(device) for k, v in batch.items() if k not in meta_keys}, need_weights=True)
    if out.weights is None:
        raise ValueError(f"{type(model).__name__} forms no attention weights on this task: nothing to show "
                         "(its attention-based siblings do)")
    return out


def _cpu(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach().float().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


def nadaraya_watson_view(model: torch.nn.Module, x: Tensor, keys_x: Tensor, batch: Dict[str, Tensor]) -> AttentionView:
    """Rows: query points ``x``; columns: the training inputs ``x_i`` (sorted); kernel weights."""
    out = run_with_weights(model, batch)
    w = _cpu(out.weights)  # (B, N)
    return AttentionView([("kernel weights", w)], x_labels=[f"{v:.2f}" for v in keys_x.tolist()],
                         y_labels=[f"{v:.2f}" for v in x.tolist()],
                         title=f"{type(model).__name__}: weights of each query x (rows) over the training x_i",
                         caption="Nadaraya-Watson: f(x) = sum_i softmax_i(-(x - x_i)^2 w^2 / 2) y_i")


def bag_view(model: torch.nn.Module, batch: Dict[str, Tensor], digits: Tensor, target: int,
             meta_keys: Sequence[str]) -> AttentionView:
    """One bag (batch of one): the weight on each instance, labelled with its digit (target starred)."""
    out = run_with_weights(model, batch, meta_keys)
    k = int(batch["mask"][0].sum())
    w = _cpu(out.weights)[0, :k][None]  # (1, k)
    labels = [f"{int(d)}*" if int(d) == target else str(int(d)) for d in digits[:k].tolist()]
    prob = _cpu(out.logits).softmax(-1)[0, 1].item()
    truth = "positive" if int(batch["labels"][0]) == 1 else "negative"
    return AttentionView([("instance weights", w)], x_labels=labels, y_labels=["bag"],
                         title=f"{type(model).__name__}: attention over the bag's digits (* = a {target})",
                         caption=f"bag {truth}; P(contains a {target}) = {prob:.2f}")


def document_view(model: torch.nn.Module, doc: Tensor, decode_word, class_names: Sequence[str],
                  label: int, n_sentences: int = 4, max_words: int = 48) -> AttentionView:
    """HAN: the sentence weights over the article's sentences, and the word weights inside its
    ``n_sentences`` most attended sentences (each panel labelled with the words)."""
    out = run_with_weights(model, {"doc": doc[None]})
    weights = _cpu(out.weights)
    word, sentence = weights["word"][0], weights["sentence"][0]  # (S, J), (S,)
    lengths = (doc != 0).sum(-1)  # (S,)
    S = int((lengths > 0).sum())
    words = [[decode_word(int(i)) for i in doc[s, : int(lengths[s])].tolist()] for s in range(S)]
    heads = [" ".join(ws[:4]) + (" ..." if len(ws) > 4 else "") for ws in words]
    panels = [("sentence weights", sentence[:S][None])]
    labels = {"sentence": ([f"{s}: {h}" for s, h in enumerate(heads)], ["article"])}
    for s in sorted(sorted(range(S), key=lambda s: -float(sentence[s]))[:n_sentences]):
        n = min(int(lengths[s]), max_words)
        name = f"words of sentence {s}"
        panels.append((name, word[s, :n][None]))
        labels[name] = (words[s][:n], [f"sentence {s}"])
    pred = int(_cpu(out.logits).argmax(-1)[0])
    return AttentionView(panels, labels=labels, title=f"{type(model).__name__}: sentence and word attention",
                         caption=f"class {class_names[label]}, predicted {class_names[pred]}")


def story_view(model: torch.nn.Module, batch: Dict[str, Tensor], sentences: List[str], question: str,
               answer: str, decode) -> AttentionView:
    """Memory networks / stacked attention: each hop's weights over the story's sentences."""
    out = run_with_weights(model, batch, meta_keys=("supporting",))
    hops = _cpu(out.weights)
    S = len(sentences)
    support = batch["supporting"][0, :S].tolist() if "supporting" in batch else [False] * S
    x = [("* " if sup else "") + s for s, sup in zip(sentences, support)]
    w = torch.stack([h[0, :S] for h in hops])  # (hops, S)
    pred = decode([int(_cpu(out.logits).argmax(-1)[0])])
    return AttentionView([("hops", w)], x_labels=x, y_labels=[f"hop {k + 1}" for k in range(len(hops))],
                         title=f"{type(model).__name__}: attention of each hop over the story (* = supporting fact)",
                         caption=f"{question}? answer {answer}, predicted {pred}")


def ntm_view(model: torch.nn.Module, batch: Dict[str, Tensor], length: int) -> AttentionView:
    """NTM: write and read weightings (rows: time steps, columns: memory locations)."""
    out = run_with_weights(model, batch, meta_keys=("labels", "label_mask"))
    w = _cpu(out.weights)
    write, read = w["write"][0], w["read"][0]  # (T, N), (T, R, N)
    T = write.shape[0]
    steps = [f"in {t + 1}" if t < length else ("delim" if t == length else f"out {t - length}") for t in range(T)]
    slots = [str(i) for i in range(write.shape[-1])]
    panels = [("write weighting", write)] + [(f"read weighting head {r}", read[:, r]) for r in range(read.shape[1])]
    return AttentionView(panels, x_labels=slots, y_labels=steps,
                         title=f"{type(model).__name__}: memory locations (columns) addressed at each step (rows)",
                         caption=f"copy of {length} random {batch['inputs'].shape[-1] - 1}-bit vectors")


def graph_view(model: torch.nn.Module, batch: Dict[str, Tensor], node_labels: Sequence[str]) -> AttentionView:
    """GAT: per layer and head, the edge weights ``alpha_ij`` as an (N, N) matrix (row i attends
    over its neighbours j; zero where there is no edge)."""
    out = run_with_weights(model, batch)
    N = batch["x"].shape[0]
    panels = []
    for layer, entry in enumerate(out.weights):
        edges, alpha = entry["edge_index"].cpu(), _cpu(entry["alpha"])  # (2, E), (E, K)
        src, dst = edges
        for k in range(alpha.shape[1]):
            m = torch.zeros(N, N)
            m[dst, src] = alpha[:, k]  # node dst aggregates from its neighbour src
            panels.append((f"layer {layer} H{k}", m))
    return AttentionView(panels, x_labels=list(node_labels), y_labels=list(node_labels),
                         title=f"{type(model).__name__}: attention of each member (rows) over its neighbours",
                         caption="karate club; labels: member (club 0 = Mr. Hi, 1 = Officer)")


def gates_view(model: torch.nn.Module, images: Tensor, digits: Sequence[int]) -> AttentionView:
    """Squeeze-and-excitation: the channel gates ``s`` of each stage for one image per class
    (rows: digit class, columns: channels) — the class dependence of Hu et al. 2018, Fig. 6."""
    out = run_with_weights(model, {"images": images})
    gates = _cpu(out.weights)
    panels = [(f"stage {i} gates", g) for i, g in enumerate(gates)]
    return AttentionView(panels, y_labels=[f"digit {d}" for d in digits],
                         title=f"{type(model).__name__}: excitation gates per channel, one test image per class",
                         caption="s = sigmoid(W2 relu(W1 GAP(U)))")


def token_view(model: torch.nn.Module, batch: Dict[str, Tensor], decode_token, caption: str = "",
               meta_keys: Sequence[str] = ()) -> AttentionView:
    """An encoder over token ids (BERT and its siblings): every layer's and head's self-attention
    on one example (a batch of one), cut to its real tokens and labelled with them."""
    out = run_with_weights(model, batch, meta_keys)
    ids = batch["input_ids"][0]
    n = int(batch["attention_mask"][0].sum()) if "attention_mask" in batch else len(ids)
    tokens = [decode_token(int(i)) for i in ids[:n].tolist()]
    layers = [w[:, :, :n, :n] for w in _cpu(out.weights)]
    return AttentionView.from_weights(layers, x_labels=tokens, y_labels=tokens,
                                      title=f"{type(model).__name__}: self-attention", caption=caption)


def image_view(model: torch.nn.Module, batch: Dict[str, Tensor], queries: Sequence[Tuple[int, int]] = ()) -> AttentionView:
    """An image model's self-attention (Image Transformer) laid on the image: for each layer and a
    few query pixels, the weight (averaged over the heads) that the query puts on every pixel, as an
    ``(H, W)`` map — the pixels generated before it that its local block lets it see. The model's
    ``order`` maps its sequence positions (generation order) to raster indices."""
    out = run_with_weights(model, batch)
    H, W = batch["images"].shape[-2:]
    order = getattr(model, "order", torch.arange(H * W)).cpu()  # (P,) raster index of position t
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))  # raster index -> sequence position
    queries = list(queries) or [(r, c) for r in (H // 4, 3 * H // 4) for c in (W // 4, 3 * W // 4)]
    panels = []
    for layer, w in enumerate(_cpu(out.weights)):  # (1, heads, P, P) in generation order
        mean = w[0].float().mean(0)[:, position]  # (P, H W): keys in raster order
        for r, c in queries:
            row = mean[int(position[r * W + c])]  # (H W)
            # over its largest weight: a query spreads 1 over hundreds of pixels, invisible on a 0..1 scale
            panels.append((f"L{layer} query r{r}c{c}", (row / row.max().clamp_min(1e-30)).view(H, W)))
    return AttentionView(panels, x_labels=[str(c) for c in range(W)], y_labels=[str(r) for r in range(H)],
                         title=f"{type(model).__name__}: where a few pixels look, on the image",
                         caption="each panel: one query pixel's weights over the image, averaged over heads and "
                                 "divided by their largest; only pixels generated before the query can carry weight",
                         axis_names=("column", "row"))
