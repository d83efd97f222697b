"""LRA ListOps (Tay et al. 2020, §2.2.1): LRA's generator of nested MAX/MIN/MED/SM expressions,
their evaluator and the ``listops`` task."""

from __future__ import annotations

import random
import statistics
from typing import Any, Dict, List, Optional, Tuple

import torch

from qkv.registry import register
from qkv.tasks.base import check_positive_int
from qkv.tasks.lra.base import LRATask, int_option
from qkv.tasks.vocab import WordVocab

__all__ = ["OPERATORS", "listops_expression", "listops_value", "ListOps"]


#: the four operators of LRA's ListOps, as its expressions write them (the opening bracket is part of the token)
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
CLOSE = "]"


def _apply(op: str, args: List[int]) -> int:
    """MAX, MIN, MED (the integer part of the median) or SM (the sum modulo 10) of ``args``."""
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        return int(statistics.median(args))  # an even count averages the middle two; int() keeps the integer part
    return sum(args) % 10


class _TooLong(Exception):
    pass


def listops_expression(rng: random.Random, max_depth: int = 10, max_args: int = 10, max_len: int = 2000,
                       p_operator: float = 0.25) -> Optional[Tuple[List[str], int]]:
    """One random ListOps expression and its value, or None when it grew past ``max_len`` tokens.

    LRA's generator (Tay et al. 2020, §2.2.1, after Nangia & Bowman 2018): the root is an
    operator; below it every node at depth ``< max_depth`` is an operator with probability
    ``p_operator`` (otherwise a digit 0-9, and always a digit at ``max_depth``); an operator takes
    2 to ``max_args`` arguments, drawn uniformly. Tokens: ``[MAX``/``[MIN``/``[MED``/``[SM``,
    the digits and ``]``, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` (value 9).
    """
    tokens: List[str] = []

    def node(depth: int) -> int:
        if depth == 1 or (depth < max_depth and rng.random() < p_operator):
            op = rng.choice(OPERATORS)
            tokens.append(op)
            args = []
            for _ in range(rng.randint(2, max_args)):
                args.append(node(depth + 1))
                if len(tokens) >= max_len:  # the closing bracket would not fit either
                    raise _TooLong
            tokens.append(CLOSE)
            return _apply(op, args)
        digit = rng.randrange(10)
        tokens.append(str(digit))
        return digit

    try:
        value = node(1)
    except _TooLong:
        return None
    if len(tokens) > max_len:  # the closing brackets of the outer operators overflowed
        return None
    return tokens, value


def listops_value(expression: str) -> int:
    """The value of a ListOps expression in LRA's syntax (``[MAX 2 9 [MIN 4 7 ] 0 ]`` -> 9)."""
    stack: List[List[Any]] = []  # open operators: [op, arguments so far]
    value: Optional[int] = None
    for token in expression.split():
        if token in OPERATORS:
            stack.append([token, []])
        elif token == CLOSE:
            if not stack:
                raise ValueError(f"unbalanced ']' in {expression[:60]!r}")
            op, args = stack.pop()
            result = _apply(op, args)
            if stack:
                stack[-1][1].append(result)
            else:
                value = result
        elif token.isdigit() and len(token) == 1:
            if not stack:
                raise ValueError(f"a digit outside any operator in {expression[:60]!r}")
            stack[-1][1].append(int(token))
        else:
            raise ValueError(f"unknown ListOps token {token!r}")
    if stack or value is None:
        raise ValueError(f"incomplete ListOps expression {expression[:60]!r}")
    return value


def _released_split(text: str) -> List[str]:
    """LRA's released tokenisation: brackets dropped (``[MAX`` -> ``MAX``, ``]`` gone; issues #6, #14)."""
    return [t.lstrip("[") for t in text.split() if t != CLOSE]


@register("task", "listops", "lra-listops")
class ListOps(LRATask):
    """LRA ListOps: the value (0-9) of a nested MAX/MIN/MED/SM expression of 500-2,000 tokens (Tay et al. 2020).

    Args:
        min_len, max_len: the accepted lengths in tokens (LRA: 500-2,000); expressions are drawn
            until one falls in the range, and batches are padded to ``max_len``.
        max_depth: deepest nesting (LRA: 10); max_args: most arguments of an operator (LRA: 10).
        brackets: keep the brackets as tokens (default) — the task as LRA describes it. False is
            LRA's *released* tokenisation, which dropped them (``MAX 2 9 MIN 4 7 0``; long-range-arena
            issues #6 and #14) and so made the nesting ambiguous.
        eval_size: examples in each fixed held-out set (LRA: 2,000 test).

    ``examples(n)`` gives ``{"input": "[MAX 2 9 [MIN 4 7 ] 0 ]", "label": 9}`` dicts (the input in
    LRA's syntax, whatever ``brackets``); batches: ``input_ids``, ``attention_mask``, ``labels``.
    """

    n_classes = 10

    def __init__(self, *, min_len: int = 500, max_len: int = 2000, max_depth: int = 10, max_args: int = 10,
                 brackets: bool = True, eval_size: int = 2000) -> None:
        self.min_len = int_option("min_len", min_len)
        self.max_len = int_option("max_len", max_len, 3)
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({min_len}) must be <= max_len ({max_len})")
        self.max_depth = int_option("max_depth", max_depth)
        self.max_args = int_option("max_args", max_args, 2)
        if not isinstance(brackets, bool):
            raise TypeError(f"brackets must be a bool, got {brackets!r}")
        self.brackets = brackets
        self.eval_size = int_option("eval_size", eval_size)
        words = [str(d) for d in range(10)] + (list(OPERATORS) + [CLOSE] if brackets else [op[1:] for op in OPERATORS])
        self.vocab = WordVocab(words, split=str.split if brackets else _released_split)
        self._held: Dict[str, List[tuple]] = {}

    def _options_key(self) -> tuple:
        return (self.min_len, self.max_len, self.max_depth, self.max_args)

    def sample(self, rng: random.Random, max_tries: int = 100_000) -> Tuple[str, int]:
        """One ``(expression, value)`` with a length in ``[min_len, max_len]`` tokens."""
        for _ in range(max_tries):
            drawn = listops_expression(rng, self.max_depth, self.max_args, self.max_len)
            if drawn is not None and len(drawn[0]) >= self.min_len:
                return " ".join(drawn[0]), drawn[1]
        raise ValueError(f"listops: no expression of {self.min_len}-{self.max_len} tokens in {max_tries:,} draws with "
                         f"max_depth={self.max_depth}, max_args={self.max_args}; widen the length range")

    def _draw(self, split, n, seed, step, rank, world_size):
        rng = random.Random(self._rng_seed(seed, split, step, rank, world_size))
        return [self.sample(rng) for _ in range(n)]

    def _held_out(self, split, n):
        held = self._held.setdefault(split, [])
        while len(held) < n:  # example i of a held-out set depends on i only: a prefix is always the same
            held.append(self.sample(random.Random(self._rng_seed("held-out", split, len(held)))))
        return held[:n]

    def _held_out_size(self, split):
        return self.eval_size

    def collate(self, examples):
        ids, mask = self._pad([self.vocab.encode(text) for text, _ in examples], self.vocab.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([v for _, v in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training expressions in LRA's syntax with their values."""
        check_positive_int("n", n)
        return [{"input": text, "label": value} for text, value in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on a held-out expression (or ``text``), its first ``max_len`` tokens."""
        text, value = (text, listops_value(text)) if text is not None else self._held_out("test", 1)[0]
        batch = self.collate([(text, value)])
        tokens = [self.vocab.words[i] for i in batch["input_ids"][0, : int(batch["attention_mask"][0].sum())].tolist()]
        return self._token_view(model, batch, tokens, f"value {value}", max_len)
