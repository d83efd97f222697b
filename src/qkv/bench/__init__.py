"""``qkv bench``: benchmarks whose results are written with the machine they ran on.

Subcommands (``qkv bench NAME --help``):

* ``complexity`` — time and peak memory of every attention kernel over a ladder of lengths, with
  the fitted growth exponents (``qkv.bench.complexity``);
* ``kernels`` — qkv's softmax kernel and multi-head attention against PyTorch's SDPA and
  ``nn.MultiheadAttention``, as time ratios (``qkv.bench.kernels``);
* ``gpt`` — training tokens/s of a small qkv GPT against the same GPT built from
  ``nn.TransformerEncoderLayer`` (``qkv.bench.gpt``).
* ``generation`` — per-token time and memory of generation as the context grows: the Linear
  Transformer's RNN state against GPT's KV cache (``qkv.bench.generation``).
* ``depth-memory`` — peak training memory of a Reformer against depth, reversible against
  ordinary residual layers (``qkv.bench.depth_memory``).
* ``throughput`` — achieved TFLOP/s of exact attention against the measured matmul peak, and the
  pattern kernels (FlexAttention on CUDA) against SDPA with a dense mask (``qkv.bench.throughput``).
* ``models`` — whole models against transformers' GPT-2 and BERT with the same weights: a
  training step, KV-cache generation per token and an encoder forward (``qkv.bench.models``).
* ``peers`` — qkv against the other libraries' implementations of the same mechanisms
  (``qkv.bench.peers``).
* ``lra`` — Long Range Arena at small scale: every encoder kernel trained and tested on LRA's five
  tasks (or their stand-ins), and LRA's speed and memory table (``qkv.bench.lra``).
* ``context-parallel`` — every kernel on sequence shards over 1, 2, 4 gloo processes: per-rank peak
  memory, time and bytes sent per layer against the strategy's formula (``qkv.bench.context_parallel``).

Adding a benchmark: write a module exposing ``add_arguments(parser)`` (its own options) and
``run(args) -> dict`` (measure, write results into ``args.out``, print a table, return the
results), import it below and add it to ``BENCHMARKS``; its module docstring's first paragraph is
its ``--help`` description. Every subcommand also receives the shared options ``--quick``,
``--device``, ``--threads``, ``--seed`` and ``--out`` (default ``bench-out/<name>``), and
``args.command_line``, the command that produced the results. Measure with the helpers of ``qkv.bench.common``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from types import ModuleType
from typing import Dict, List, Optional

import torch

from .._errors import UserError
from .._io import output_folder
from .._values import parse_value
from . import common, complexity, context_parallel, depth_memory, generation, gpt, kernels, lra, models, peers, throughput

__all__ = ["BENCHMARKS", "build_parser", "main", "common"]

#: subcommand name -> module with ``add_arguments(parser)`` and ``run(args) -> dict``.
BENCHMARKS: Dict[str, ModuleType] = {
    "complexity": complexity,
    "kernels": kernels,
    "gpt": gpt,
    "generation": generation,
    "peers": peers,
    "depth-memory": depth_memory,
    "throughput": throughput,
    "lra": lra,
    "models": models,
    "context-parallel": context_parallel,
}


def _summary(module: ModuleType) -> str:
    """First paragraph of a benchmark module's docstring, without its leading "``qkv bench x``: "."""
    doc = (module.__doc__ or "").strip()
    first = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
    return first.split("``: ", 1)[-1] if first.startswith("``") else first


def build_parser(prog: str = "qkv bench") -> argparse.ArgumentParser:
    """The ``qkv bench`` parser: one subcommand per entry of ``BENCHMARKS``."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, module in BENCHMARKS.items():
        summary = _summary(module)
        p = sub.add_parser(name, help=summary, description=summary)
        shared = p.add_argument_group("shared options")
        shared.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
        shared.add_argument("--device", default="cpu", help="cpu or cuda[:index] (default cpu)")
        shared.add_argument("--threads", type=int,
                            help="torch CPU threads (torch.set_num_threads; default: torch's own choice)")
        shared.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
        shared.add_argument("--out", default=f"bench-out/{name}",
                            help=f"directory for the results (default bench-out/{name})")
        module.add_arguments(p)
        for action in p._actions:  # every number read by the one typed parser (finite floats: no nan, no inf)
            if action.type in (int, float):
                action.type = _number(action.type)
    return parser


def _number(kind: type):
    """An argparse ``type`` reading ``kind`` with ``qkv._values.parse_value`` (as ``qkv train --set``)."""

    def parse(text: str):
        try:
            return parse_value(kind, text, "the value")
        except UserError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = kind.__name__
    return parse


def _out_of_memory(err: BaseException) -> bool:
    """An allocation the sizes asked for could not get (CPU or GPU)."""
    if isinstance(err, MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``qkv bench ...`` and ``python -m qkv.bench ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = "qkv bench " + shlex.join(argv)
    threads_before = torch.get_num_threads()
    try:
        if args.seed < 0:
            raise UserError(f"--seed must be >= 0, got {args.seed}")
        if args.threads is not None:
            if args.threads < 1:
                raise UserError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        if getattr(args, "out", None) is not None:  # refused before measuring, not after (the folder the results go to)
            output_folder(args.out, f"--out {args.out}")
        BENCHMARKS[args.benchmark].run(args)
    except UserError as err:  # a bad value of the user's: one line; anything else is a bug and keeps its traceback
        parser.exit(2, f"qkv bench {args.benchmark}: error: {err}\n")
    except (RuntimeError, MemoryError) as err:
        if not _out_of_memory(err):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        parser.exit(2, f"qkv bench {args.benchmark}: error: out of memory with the sizes asked for ({first}); "
                       "choose smaller sizes\n")
    finally:
        torch.set_num_threads(threads_before)  # main() may be called in-process (tests, notebooks)
    return 0
