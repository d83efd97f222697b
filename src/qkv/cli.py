"""The ``qkv`` command: list, data, train, eval, generate, translate, viz and bench."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main"]


def _cmd_list(args: argparse.Namespace) -> int:
    import qkv
    from qkv.registry import describe, lookup, names

    sections = {"attention": "attention kernels", "model": "models", "task": "tasks"}
    for kind, title in sections.items():
        if args.what not in (None, kind):
            continue
        try:
            listed = names(kind)
        except ValueError:
            listed = []
        print(f"{title}:")
        for name in listed:
            print(f"  {name:<22} {describe(lookup(kind, name))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list attention kernels, models and tasks")
    p.add_argument("what", nargs="?", choices=["attention", "model", "task"], help="only this kind")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("bench", help="benchmarks (qkv bench --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: __import__("qkv.bench", fromlist=["main"]).main(a.rest))
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
