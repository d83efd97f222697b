"""The ``qkv`` command: list, data, train, eval, generate, translate, viz, bench.

A run directory (``--out``) holds ``run.json`` (model, task and their options), the trainer's
``train_config.json``, ``metrics.jsonl`` and ``checkpoints/``, the final ``model/``
(``save_pretrained``) and ``attention.png`` from ``qkv viz``.

Options come from the dataclasses: every ``TrainConfig`` field is a flag (``--batch-size``);
model-config fields, task options and training fields can all be set with
``--set key=value`` / ``--set task.key=value`` / ``--set train.key=value``, parsed and
type-checked against the field's annotation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["main", "parse_value", "build_parser"]

RUN_FILE = "run.json"


class CLIError(ValueError):
    """A user error on the command line (printed without a traceback)."""


# ----------------------------------------------------------------------------- typed values


def parse_value(annotation: Any, text: str, name: str) -> Any:
    """Parse ``text`` as a value of type ``annotation`` (int, float, bool, str, Optional[...],
    Tuple[...], Literal[...], dict/list as JSON); raise ``CLIError`` naming ``name`` otherwise."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(arg, text, name)
            except CLIError as e:
                errors.append(str(e))
        raise CLIError(errors[0] if errors else f"{name}: cannot parse {text!r}")
    if origin is typing.Literal:
        for arg in args:
            if str(arg) == text:
                return arg
        raise CLIError(f"{name} must be one of {list(args)}, got {text!r}")
    if annotation is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise CLIError(f"{name} must be a bool (true/false), got {text!r}")
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise CLIError(f"{name} must be an int, got {text!r}") from None
    if annotation is float:
        try:
            return float(text)
        except ValueError:
            raise CLIError(f"{name} must be a float, got {text!r}") from None
    if annotation is str:
        return text
    if origin in (tuple, list) or annotation in (tuple, list):
        items = _json_or_none(text)
        if not isinstance(items, list):
            items = [t for t in text.split(",") if t != ""]
        if args and args[-1] is not Ellipsis and len(args) != len(items):
            raise CLIError(f"{name} needs {len(args)} comma-separated values, got {text!r}")
        types = [args[0]] * len(items) if args and args[-1] is Ellipsis else list(args) or [str] * len(items)
        values = [v if not isinstance(v, str) else parse_value(t, v, name) for t, v in zip(types, items)]
        return tuple(values) if origin is tuple or annotation is tuple else values
    if origin is dict or annotation is dict:
        value = _json_or_none(text)
        if not isinstance(value, dict):
            raise CLIError(f"{name} must be a JSON object, e.g. '{{\"key\": 1}}', got {text!r}")
        return value
    value = _json_or_none(text)
    return text if value is None else value


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _fields(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}


def _init_params(cls: type) -> Dict[str, Any]:
    import inspect

    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    return {n: hints.get(n, str) for n, p in params.items() if n != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _split_sets(pairs: Sequence[str]) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    model, task, train = {}, {}, {}
    for pair in pairs:
        if "=" not in pair:
            raise CLIError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        if key.startswith("task."):
            task[key[5:]] = value
        elif key.startswith("train."):
            train[key[6:]] = value
        else:
            model[key] = value
    return model, task, train


def _typed(values: Dict[str, str], fields: Dict[str, Any], what: str) -> Dict[str, Any]:
    out = {}
    for key, text in values.items():
        if key not in fields:
            import difflib

            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise CLIError(f"unknown {what} option {key!r}{hint}; known: {', '.join(sorted(fields))}")
        out[key] = parse_value(fields[key], text, f"{what} option {key}")
    return out


# ----------------------------------------------------------------------------- runs


def _model_hints(task: Any, fields: Dict[str, Any]) -> Dict[str, Any]:
    """Fill config fields the task determines (vocabulary size, special ids, lengths)."""
    hints: Dict[str, Any] = {}
    vocab = getattr(task, "vocab", None)
    if vocab is not None:
        for key in ("vocab_size", "src_vocab_size", "tgt_vocab_size"):
            hints[key] = vocab.size
        for key in ("pad_id", "bos_id", "eos_id"):
            if hasattr(vocab, key):
                hints[key] = getattr(vocab, key)
    for key in ("d_input", "n_classes", "num_labels", "n_features", "max_sentences"):
        if hasattr(task, key):
            hints[key] = getattr(task, key)
    if getattr(task, "kind", None) == "lm" and hasattr(task, "block_size"):
        hints["max_len"] = max(task.block_size, 64)
    extra = getattr(task, "model_hints", None)
    if callable(extra):
        hints.update(extra())
    return {k: v for k, v in hints.items() if k in fields}


def _load_run(run: str) -> Dict[str, Any]:
    path = Path(run) / RUN_FILE
    if not path.is_file():
        raise CLIError(f"{run} is not a qkv run directory (no {RUN_FILE}); create one with `qkv train MODEL --task TASK --out {run}`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CLIError(f"{path} is corrupt: {e}") from None


def _restore(run: str) -> Tuple[Any, Any, Dict[str, Any]]:
    """The run's task and model (final ``model/`` if present, else the latest checkpoint)."""
    from qkv.models import QKVModel
    from qkv.registry import lookup
    from qkv.tasks import build_task
    from qkv.train import CheckpointManager, load_checkpoint

    info = _load_run(run)
    task = build_task(info["task"], **info.get("task_options", {}))
    final = Path(run) / "model"
    if (final / "config.json").is_file():
        model = QKVModel.from_pretrained(final)
    else:
        latest = CheckpointManager(Path(run) / "checkpoints").latest()
        if latest is None:
            raise CLIError(f"{run} has neither a final model/ nor a checkpoint yet")
        model = lookup("model", info["model"]).from_config(info["model_config"])
        load_checkpoint(latest, model, rank=None)
    model.eval()
    return task, model, info


def _init_config(args: argparse.Namespace, model_cls: Any, values: Dict[str, Any], user: Dict[str, Any]):
    """``--init RUN``: RUN's architecture, the new task's head fields (``init_task_fields``), then
    the user's ``--set``; and RUN's model, whose weights the new one starts from."""
    if args.resume:
        raise CLIError("--init starts a new run from another run's weights; it cannot be combined with --resume")
    _, source, info = _restore(args.init)
    if info["model"] != args.model:
        raise CLIError(f"--init {args.init} holds a {info['model']!r} model, not {args.model!r}")
    head = {k: v for k, v in values.items() if k in model_cls.init_task_fields}
    return {**info["model_config"], **head, **user}, source


def _cmd_train(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401  (registers tasks)
    from qkv.registry import lookup
    from qkv.tasks import build_task
    from qkv.train import TrainConfig, Trainer

    model_cls = lookup("model", args.model)
    args.task = qkv.tasks.task_for_model(args.task, model_cls)  # e.g. bbc-news as token ids for BERT
    model_sets, task_sets, train_sets = _split_sets(args.set or [])
    task_cls = lookup("task", args.task)
    task_options = _typed(task_sets, _init_params(task_cls), f"task {args.task!r}")
    task = build_task(args.task, **task_options)
    fields = _fields(model_cls.config_class)
    config_values = _model_hints(task, fields)
    if args.attention is not None:
        if "attention" not in fields:
            raise CLIError(f"model {args.model!r} has no attention kernel option")
        config_values["attention"] = args.attention
    config_values.update(_typed(model_sets, fields, f"model {args.model!r}"))
    if args.init:
        config_values, init_model = _init_config(args, model_cls, config_values, _typed(model_sets, fields, "model"))
    task_kinds = getattr(model_cls, "task_kinds", None)
    if task_kinds is not None and task.kind not in task_kinds:
        raise CLIError(f"model {args.model!r} trains on {sorted(task_kinds)} tasks; {args.task!r} is a {task.kind!r} task")

    out = Path(args.out or f"runs/{args.model}-{args.task}")
    train_fields = _fields(TrainConfig)
    # a model's recommended recipe (e.g. a higher learning rate for small RNNs), then the user's flags
    train_values = dict(getattr(model_cls, "train_defaults", {}))
    train_values.update({k: getattr(args, k) for k in train_fields if getattr(args, k, None) is not None})
    train_values.update(_typed(train_sets, train_fields, "train"))
    train_values["out_dir"] = str(out)

    run_file = out / RUN_FILE
    if args.resume and run_file.is_file():
        info = _load_run(str(out))
        if (info["model"], info["task"]) != (args.model, args.task):
            raise CLIError(f"{out} holds a {info['model']} run on {info['task']}, not {args.model} on {args.task}")
        config_values, task_options = info["model_config"], info["task_options"]
    model = model_cls.from_config(config_values)
    if args.init:
        fresh = model.init_from(init_model)
        print(f"qkv: initialised from {args.init}; fresh: {', '.join(fresh) or 'nothing'}")
    config = TrainConfig(**train_values)
    from qkv._io import atomic_path

    out.mkdir(parents=True, exist_ok=True)
    info = {"model": args.model, "task": args.task, "task_options": task_options,
            "model_config": dataclasses.asdict(model.config)}
    with atomic_path(run_file) as tmp:
        tmp.write_text(json.dumps(info, indent=2, default=str) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"qkv: training {args.model} ({n_params / 1e6:.2f} M parameters) on {args.task} -> {out}")
    metrics = Trainer(model, task, config).fit(resume=args.resume)
    import os

    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 writes
        model.save_pretrained(out / "model")
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _eval_overrides(task: Any, model: Any, info: Dict[str, Any], pairs: Sequence[str]) -> Tuple[Any, Any]:
    """``qkv eval --set``: evaluation-time model options (e.g. Transformer-XL's ``eval_mem_len``)
    and task options (``task.key=value``) on a trained run; the weights must still fit."""
    from qkv.tasks import build_task

    model_sets, task_sets, train_sets = _split_sets(pairs)
    if train_sets:
        raise CLIError(f"qkv eval takes no training options, got {sorted(train_sets)}")
    if task_sets:
        options = {**info.get("task_options", {}), **_typed(task_sets, _init_params(type(task)), f"task {info['task']!r}")}
        task = build_task(info["task"], **options)
    if model_sets:
        values = {**dataclasses.asdict(model.config), **_typed(model_sets, _fields(type(model.config)), f"model {info['model']!r}")}
        rebuilt = type(model).from_config(values)
        try:
            rebuilt.load_state_dict(model.state_dict())
        except RuntimeError as e:
            raise CLIError(f"--set {sorted(model_sets)} changes the model's weights; eval can only change how it runs: {e}") from None
        model = rebuilt.eval()
    return task, model


def _cmd_eval(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401

    task, model, info = _restore(args.run)
    task, model = _eval_overrides(task, model, info, args.set or [])
    metrics = task.evaluate(model, args.split, max_examples=args.max_examples)
    if callable(getattr(model, "eval_report", None)):  # what the model itself reports (e.g. learned spans)
        metrics.update(model.eval_report())
    print(json.dumps({k: round(float(v), 4) for k, v in metrics.items()}))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    import qkv.tasks  # noqa: F401

    task, model, info = _restore(args.run)
    if hasattr(task, "write_samples"):  # tasks whose samples are pictures draw them (images)
        path = Path(args.out or Path(args.run) / "samples.png")
        options = _split_sets(args.set or [])[0]  # key=value strings; the task parses them
        print(task.write_samples(model, path, n=args.n, seed=args.seed, options=options))
        return 0
    if task.kind != "lm":
        raise CLIError(f"`qkv generate` samples from language models; {info['task']} is a {task.kind} task (try `qkv translate`)")
    ids = task.vocab.encode(args.prompt) if args.prompt else [task.vocab.bos_id if hasattr(task.vocab, "bos_id") else 0]
    if not ids:
        raise CLIError("--prompt encodes to no tokens")
    gen = torch.Generator().manual_seed(args.seed)
    out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, generator=gen)
    print(task.vocab.decode(out[0].tolist()))
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401

    task, model, info = _restore(args.run)
    if task.kind != "seq2seq":
        raise CLIError(f"`qkv translate` needs a sequence-to-sequence run; {info['task']} is a {task.kind} task")
    batch = task.collate([(text, "") for text in args.text])
    out = model.generate(batch["src_ids"], src_mask=batch["src_mask"], max_new_tokens=args.max_new_tokens, beam_size=args.beam)
    for text, row in zip(args.text, out.tolist()):
        print(f"{text}\t{task.decode_generated(row)}")
    return 0


def _cmd_viz(args: argparse.Namespace) -> int:
    import qkv.tasks  # noqa: F401
    from qkv import viz

    if args.pattern:  # a kernel's connectivity, no run needed
        path = Path(args.out or f"pattern-{args.pattern}-{args.length}.png")
        from qkv.bench.complexity import parse_kernel_kwargs

        knobs = parse_kernel_kwargs([f"{args.pattern}:{spec}" for spec in args.kernel_kwargs]).get(args.pattern, {})
        print(f"wrote {viz.plot_kernel_pattern(args.pattern, args.length, path, causal=args.causal, overrides=knobs)}")
        return 0
    if args.run is None:
        raise CLIError("qkv viz needs a RUN directory, or --pattern NAME --length N")
    task, model, info = _restore(args.run)
    if args.compare and not args.html:
        raise CLIError("--compare adds models to the --html page: give --html OUT.html too")
    if args.html:
        from qkv.viz_html import write_html

        views = [(Path(args.run).name or args.run, viz.attention_view(task, model, args.text, args.max_len))]
        for other in args.compare or []:
            _, other_model, other_info = _restore(other)
            if other_info.get("task") != info.get("task"):
                raise CLIError(f"--compare {other}: trained on {other_info.get('task')!r}, not {info.get('task')!r} "
                               "(the page compares models of the same task on the same input)")
            views.append((Path(other).name or other, viz.attention_view(task, other_model, args.text, args.max_len)))
        written = write_html(args.html, views, title=f"qkv attention: {info.get('task')}")
        print(f"wrote {written}")
        return 0
    path = Path(args.out or Path(args.run) / "attention.png")
    if callable(getattr(task, "visualize", None)):
        # tasks whose inputs are not token strings (images, sets, graphs) draw their own picture
        written = task.visualize(model, path, text=args.text)
        print(f"wrote {written}")
        return 0
    view = viz.attention_view(task, model, args.text, args.max_len)
    if view.caption:
        print(view.caption)
    view.plot(path, max_panels=args.max_panels)
    if len(view.panels) > args.max_panels:
        print(f"showing {args.max_panels} of {len(view.panels)} panels (cross-attention first); --max-panels to see more")
    print(f"wrote {path}")
    if callable(getattr(model, "visualize", None)):  # a model's own picture (e.g. learned spans)
        print(f"wrote {model.visualize(path.with_name(path.stem + '-model.png'))}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from qkv.tasks import DATASETS, fetch

    if args.action == "list":
        for name, ds in DATASETS.items():
            print(f"  {name:<14} {ds['description']}  [{ds['licence']}; {ds['package']}]")
        return 0
    unknown = [n for n in args.names if n not in DATASETS]
    if unknown:
        raise CLIError(f"unknown data set(s) {unknown}; known: {', '.join(DATASETS)}")
    fetch(args.names or None, cache_dir=args.cache_dir, force=args.force)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    import qkv
    import qkv.tasks  # noqa: F401
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


# ----------------------------------------------------------------------------- parser


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    from qkv.train import TrainConfig

    group = parser.add_argument_group("training (TrainConfig fields)")
    defaults = TrainConfig()
    for name, annotation in _fields(TrainConfig).items():
        if name == "out_dir":
            continue
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                           type=lambda text, a=annotation, n=name: _argparse_value(a, text, n),
                           help=f"default {getattr(defaults, name)!r}")


def _argparse_value(annotation: Any, text: str, name: str) -> Any:
    try:
        return parse_value(annotation, text, name)
    except CLIError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description="The attention family on PyTorch: train, evaluate, look at and benchmark every model.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list attention kernels, models and tasks")
    p.add_argument("what", nargs="?", choices=["attention", "model", "task"], help="only this kind")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("data", help="fetch or list the real data sets (cached under $QKV_DATA or ~/.cache/qkv)")
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("names", nargs="*", help="data sets to fetch (default: all)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--force", action="store_true", help="fetch again even when cached")
    p.set_defaults(func=_cmd_data)

    p = sub.add_parser("train", help="train MODEL on --task")
    p.add_argument("model", help="a model name (qkv list model)")
    p.add_argument("--task", required=True, help="a task name (qkv list task)")
    p.add_argument("--attention", default=None, help="attention kernel name for Transformer-family models")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="model config field; task.KEY for task options; train.KEY for training fields")
    p.add_argument("--out", default=None, help="run directory (default runs/MODEL-TASK)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--init", default=None, metavar="RUN", help="start from run RUN's weights (fine-tuning; the task's head starts fresh)")
    _add_train_flags(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="evaluate a run on its task's held-out split")
    p.add_argument("run")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="evaluation-time model option (e.g. eval_mem_len=512) or task.KEY=VALUE; repeatable")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("generate", help="sample text from a language-model run")
    p.add_argument("run")
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=16, help="image tasks: samples in the PNG grid")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="image tasks: class=C, temperature=T")
    p.add_argument("--out", default=None, help="image tasks: PNG path (default RUN/samples.png)")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("translate", help="translate text with a sequence-to-sequence run")
    p.add_argument("run")
    p.add_argument("text", nargs="+")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("viz", help="plot a run's attention weights (every layer and head), or a kernel's pattern, as a PNG")
    p.add_argument("run", nargs="?")
    p.add_argument("--pattern", default=None, metavar="NAME", help="plot which keys each query of kernel NAME sees")
    p.add_argument("--length", type=int, default=64, help="with --pattern: sequence length (default 64)")
    p.add_argument("--kernel-kwargs", action="append", default=[], metavar="KEY=VALUE,...",
                   help="with --pattern: the kernel's knobs, e.g. 'stride=8' or 'image_size=(8,8),block=(2,4)'")
    p.add_argument("--causal", action="store_true", help="with --pattern: the causal form")
    p.add_argument("--text", default=None, help="input to show (default: a training example)")
    p.add_argument("--out", default=None, help="PNG path (default RUN/attention.png)")
    p.add_argument("--max-len", type=int, default=48)
    p.add_argument("--max-panels", type=int, default=16)
    p.add_argument("--html", default=None, metavar="OUT.html",
                   help="write an offline, self-contained page to explore the attention interactively instead")
    p.add_argument("--compare", nargs="+", default=None, metavar="RUN",
                   help="with --html: more runs of the same task, selectable on the page")
    p.set_defaults(func=_cmd_viz)

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
    except (CLIError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
