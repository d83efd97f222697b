"""The ``qkv`` command: list, data, train, eval, generate, translate, viz, export, bench, reproduce.

A thin face over the library: each command parses its arguments, calls ``qkv.runs`` (a run's
settings, directory, training and evaluation; its docstring describes the run directory, where a
value comes from and what ``--resume`` may change) or the module the command is about, and prints.

Options come from the dataclasses: every ``TrainConfig`` field is a flag (``--batch-size``);
model-config fields, task options and training fields can all be set with
``--set key=value`` / ``--set task.key=value`` / ``--set train.key=value``, parsed and
type-checked against the field's annotation (``qkv._values.parse_value``);
``--set attention_kwargs.radius=8`` sets one key of a dict field.

Layout, for adding to it: each command is a ``_cmd_NAME(args) -> int`` function and a block in
``build_parser``. A user error is a ``qkv.UserError`` (``CLIError`` here): one line on stderr, exit
status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from qkv._errors import UserError, user_input
from qkv._machine import announce, default_threads, load_average, physical_cores, set_threads
from qkv._values import parse_value
from qkv.runs import RESUME_MAY_CHANGE, fields_of

__all__ = ["main", "parse_value", "build_parser", "CLIError", "RESUME_MAY_CHANGE", "default_threads", "parameter_count"]

#: the command line's name for ``qkv.UserError``
CLIError = UserError


def _pairs(pairs: Optional[Sequence[str]]) -> Dict[str, str]:
    """``--set key=value`` pairs as ``{key: "value"}`` (``qkv.runs`` parses each against its field)."""
    out: Dict[str, str] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise CLIError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = value
    return out


def _positive_int(text: str) -> int:
    value = parse_value(int, text, "value")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    value = parse_value(int, text, "value")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = parse_value(float, text, "value")
    except CLIError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a float >= 0, got {text!r}")
    return value


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="CPU threads for torch (default: the physical cores that the load average leaves free, "
                             "at least 1)")


def parameter_count(n: int) -> str:
    """``n`` parameters as a reader takes them in: every digit below a million ("12,345
    parameters"), three significant digits above ("1.23 M parameters", "1.5 B parameters")."""
    if n < 1_000_000:
        return f"{n:,} parameter{'' if n == 1 else 's'}"
    if n < 1_000_000_000:
        return f"{n / 1e6:.3g} M parameters"
    return f"{n / 1e9:,.3g} B parameters"


# ----------------------------------------------------------------------------- commands


def _check_text(task: Any, task_name: str, text: str, flag: str) -> None:
    """Refuse text with characters the task's character vocabulary lacks (they would silently become
    ``<unk>``), naming them and the characters it has. Word and byte vocabularies take any text."""
    unknown = getattr(task.vocab, "unknown", None)
    bad = unknown(text) if unknown is not None else []
    if bad:
        raise CLIError(f"{flag} {text!r}: {task_name} has no {''.join(bad)!r} (a model trained on it reads only "
                       f"{''.join(task.vocab.chars)!r})")


def _cmd_train(args: argparse.Namespace) -> int:
    from qkv import runs
    from qkv.train import TrainConfig

    overrides: Dict[str, Any] = {f"train.{k}": getattr(args, k) for k in fields_of(TrainConfig)
                                 if getattr(args, k, None) is not None}
    if args.attention is not None:
        overrides["attention"] = args.attention
    overrides.update(_pairs(args.set))
    with runs.start(args.model, args.task, args.out, preset=args.preset, overrides=overrides, init=args.init,
                    resume=args.resume, say=announce) as run:
        if run.finished:
            return 0
        threads = set_threads(args.threads, warn_load=True, say=announce)
        n_params = sum(p.numel() for p in run.model.parameters())
        preset_note = f", preset {run.settings.preset}" if run.settings.preset else ""
        if run.settings.init:  # the architecture is the checkpoint's or the run's, not a preset's
            preset_note += f", from {run.settings.init}"
        print(f"qkv: training {run.settings.model} ({parameter_count(n_params)}{preset_note}) on {run.settings.task} "
              f"-> {run.directory} [{run.config.steps} steps, batch {run.config.batch_size}, {threads} thread(s)]", flush=True)
        metrics = run.train()
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 prints
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _load_run(path: str) -> Any:
    """``runs.load(path)``, saying on stderr when the run has no final ``model/`` (killed, or still
    training) and its latest checkpoint stands in for the trained model."""
    from qkv import runs
    from qkv.train import CheckpointManager

    run = runs.load(path)
    if not (run.directory / "model" / "config.json").is_file():
        latest = CheckpointManager(run.directory / "checkpoints").latest()
        step = int(latest.stem.rsplit("-", 1)[-1]) if latest is not None else "?"
        announce(f"{path} has no final model/ (training unfinished or still running): using its latest checkpoint, "
                 f"step {step} of {run.settings.train.get('steps', '?')}")
    return run


def _cmd_eval(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    metrics = _load_run(args.run).evaluate(args.split, max_examples=args.max_examples, overrides=_pairs(args.set),
                                           progress=True)
    print(json.dumps({k: round(float(v), 4) for k, v in metrics.items()}))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from qkv import runs
    from qkv.models.sampling import check_sampling

    set_threads(args.threads)
    run = _load_run(args.run)
    task, model = run.task, run.model
    options = runs.split_overrides(_pairs(args.set))[0]  # key=value strings; the task parses them
    with user_input():  # tasks whose samples are pictures draw them (images)
        written = task.write_samples(model, Path(args.out or Path(args.run) / "samples.png"), n=args.n, seed=args.seed,
                                     options=options)
    if written is not None:
        print(written)
        return 0
    if task.kind != "lm":
        hint = " (try `qkv translate`)" if task.kind == "seq2seq" else ""
        raise CLIError(f"`qkv generate` samples from language models; {run.settings.task} is a {task.kind} task{hint}")
    if not model.can_generate():
        raise CLIError(f"a {run.settings.model} model cannot generate text (it has no generate method); "
                       "`qkv eval` and `qkv viz` work on this run")
    if args.prompt:
        _check_text(task, run.settings.task, args.prompt, "--prompt")
    ids = task.vocab.encode(args.prompt) if args.prompt else [task.vocab.bos_id if hasattr(task.vocab, "bos_id") else 0]
    if not ids:
        raise CLIError("--prompt encodes to no tokens")
    gen = torch.Generator().manual_seed(args.seed)
    with user_input():  # the user's sampling options; a failure inside generate is a bug, with its traceback
        check_sampling(args.temperature, args.top_k, args.top_p)
    with runs.forward_progress(model, "generating", total=args.max_new_tokens, unit="token"):
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, generator=gen)
    print(task.vocab.decode(out[0].tolist()))
    from qkv.tasks.vocab import CharVocab

    specials = CharVocab.SPECIALS  # ids 0 .. 3 of a character vocabulary
    drawn = [i for i in out[0, len(ids):].tolist() if i < len(specials)] if isinstance(task.vocab, CharVocab) else []
    if drawn:  # a little-trained model samples them; the text leaves them out, so it is shorter than asked
        names = ", ".join(sorted({specials[i] for i in drawn}))
        announce(f"{len(drawn)} of the {args.max_new_tokens} sampled tokens were special ({names}), left out of the text")
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    from qkv import runs

    set_threads(args.threads)
    run = _load_run(args.run)
    task, model = run.task, run.model
    if task.kind != "seq2seq":
        raise CLIError(f"`qkv translate` needs a sequence-to-sequence run; {run.settings.task} is a {task.kind} task")
    for text in args.text:
        if not text:
            raise CLIError("TEXT: an empty source has nothing to translate")
        _check_text(task, run.settings.task, text, "TEXT")
    with user_input():
        batch = task.collate([(text, "") for text in args.text])
    # an output that has not ended by the task's longest target (+ its <eos>) never will
    max_new = args.max_new_tokens or task.max_target_len + 1
    with runs.forward_progress(model, "translating"):
        out = model.generate(batch["src_ids"], src_mask=batch["src_mask"], max_new_tokens=max_new, beam_size=args.beam)
    for text, row in zip(args.text, out.tolist()):
        print(f"{text}\t{task.decode_generated(row)}")
    return 0


def _say_cut(view: Any) -> None:
    """One line when ``--text`` was longer than ``--max-len`` and only its start is shown."""
    if getattr(view, "cut", None):
        kept, given = view.cut
        print(f"text cut to {kept} tokens; pass --max-len {given}")


def _cmd_viz(args: argparse.Namespace) -> int:
    from qkv import viz

    set_threads(args.threads)
    if args.pattern:  # a kernel's connectivity, no run needed
        path = Path(args.out or f"pattern-{args.pattern}-{args.length}.png")
        from qkv._values import parse_kernel_kwargs

        with user_input():
            knobs = parse_kernel_kwargs([f"{args.pattern}:{spec}" for spec in args.kernel_kwargs]).get(args.pattern, {})
            print(f"wrote {viz.plot_kernel_pattern(args.pattern, args.length, path, causal=args.causal, overrides=knobs)}")
        return 0
    if args.run is None:
        raise CLIError("qkv viz needs a RUN directory, or --pattern NAME --length N")
    run = _load_run(args.run)
    task, model, task_name = run.task, run.model, run.settings.task
    if args.text is not None and task.kind in ("lm", "seq2seq"):
        _check_text(task, task_name, args.text, "--text")
    if args.compare and not args.html:
        raise CLIError("--compare adds models to the --html page: give --html OUT.html too")
    if args.html:
        from qkv.viz_html import write_html

        with user_input():
            views = [(Path(args.run).name or args.run, viz.attention_view(task, model, args.text, args.max_len))]
        _say_cut(views[0][1])
        for other in args.compare or []:
            other_run = _load_run(other)
            if other_run.settings.task != task_name:
                raise CLIError(f"--compare {other}: trained on {other_run.settings.task!r}, not {task_name!r} "
                               "(the page compares models of the same task on the same input)")
            with user_input():
                views.append((Path(other).name or other, viz.attention_view(task, other_run.model, args.text, args.max_len)))
        print(f"wrote {write_html(args.html, views, title=f'qkv attention: {task_name}')}")
        return 0
    path = Path(args.out or Path(args.run) / "attention.png")
    with user_input():
        # tasks whose inputs are not token strings (images, sets, graphs) may draw their own picture
        written = task.visualize(model, path, text=args.text)
        if written is not None:
            print(f"wrote {written}")
            return 0
        view = viz.attention_view(task, model, args.text, args.max_len)
    _say_cut(view)
    if view.caption:
        print(view.caption)
    path = view.plot(path, max_panels=args.max_panels)
    if len(view.panels) > args.max_panels:
        first = " (cross-attention first)" if any("cross" in name for name, _ in view.panels) else ""
        print(f"showing {args.max_panels} of {len(view.panels)} panels{first}; --max-panels to see more")
    print(f"wrote {path}")
    own = model.visualize(path.with_name(path.stem + "-model.png"))  # a model's own picture (e.g. learned spans)
    if own is not None:
        print(f"wrote {own}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from qkv.hf.export import export_run

    set_threads(args.threads)
    print(f"wrote {export_run(_load_run(args.run), args.out, args.format)}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from qkv.tasks import DATASETS, fetch
    from qkv.tasks.data import cache_root

    if args.action == "list" and args.names:
        raise CLIError(f"`qkv data list` takes no names (it lists every data set), got {' '.join(args.names)}; "
                       "`qkv data fetch NAME` fetches one")
    if args.action == "list":
        print(f"data sets (cache: {cache_root(args.cache_dir)}):")
        for name, ds in DATASETS.items():
            cached = _data_cached(name, args.cache_dir)
            mark = {True: "cached ", False: "missing", None: "?      "}[cached]
            print(f"  {name:<14} {mark}  {ds['description']}  [{ds['licence']}; {ds['package']}]")
        return 0
    unknown = [n for n in args.names if n not in DATASETS]
    if unknown:
        raise CLIError(f"unknown data set(s) {unknown}; known: {', '.join(DATASETS)}")
    from tqdm.auto import tqdm

    names = args.names or list(DATASETS)
    with tqdm(names, desc="data", unit="set", disable=not sys.stderr.isatty(), leave=False) as bar:
        for name in bar:
            bar.set_postfix_str(name)
            folder = fetch([name], cache_dir=args.cache_dir, force=args.force)[name]
            tqdm.write(f"  {name:<14} {folder}")
    return 0


def _data_cached(name: str, cache_dir: Optional[str]) -> Optional[bool]:
    """Whether data set ``name`` is in the cache (None when that cannot be told without fetching)."""
    from qkv.tasks import data

    try:
        return data.is_cached(name, cache_dir)
    except (KeyError, ValueError):
        folder = data.cache_root(cache_dir) / name
        return folder.is_dir() and any(folder.iterdir())


def _task_kind(cls: type) -> str:
    return cls.kind or "?"


def _cmd_list(args: argparse.Namespace) -> int:
    import qkv
    import qkv.tasks  # noqa: F401
    from qkv.registry import describe, lookup, names

    sections = {"attention": "attention kernels", "model": "models", "task": "tasks"}
    tasks = {name: lookup("task", name) for name in names("task")}
    for kind, title in sections.items():
        if args.what not in (None, kind):
            continue
        try:
            listed = names(kind)
        except ValueError:
            listed = []
        print(f"{title}:")
        for name in listed:
            cls = lookup(kind, name)
            print(f"  {name:<22} {describe(cls)}")
            if kind == "model":
                suggested = [t for t in cls.suggested_tasks if t in tasks]
                kinds = sorted(cls.task_kinds or {_task_kind(tasks[t]) for t in suggested})
                presets = sorted(cls.presets)
                line = f"task kinds: {', '.join(kinds) or 'any'}; tasks: {', '.join(suggested) or '-'}"
                if presets:
                    line += f"; presets: {', '.join(presets)}"
                print(f"  {'':<22}   {line}")
            elif kind == "task":
                print(f"  {'':<22}   kind: {_task_kind(cls)}")
    return 0


# ----------------------------------------------------------------------------- parser


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    from qkv.train import TrainConfig

    group = parser.add_argument_group("training (TrainConfig fields)")
    defaults = TrainConfig()
    for name, annotation in fields_of(TrainConfig).items():
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


def _version() -> str:
    import qkv

    return f"qkv {qkv.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkv", description="The attention family on PyTorch: train, evaluate, look at and benchmark every model.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _list_parser(sub)
    _data_parser(sub)
    _train_parser(sub)
    _eval_parser(sub)
    _generate_parser(sub)
    _translate_parser(sub)
    _viz_parser(sub)
    _export_parser(sub)
    _linearize_parser(sub)
    _bench_parser(sub)
    _reproduce_parser(sub)
    return parser


def _list_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv list [attention|model|task]`."""
    p = sub.add_parser("list", help="list attention kernels, models (with their task kinds) and tasks",
                       description="List attention kernels, models and tasks. Example: qkv list model")
    p.add_argument("what", nargs="?", type=_list_kind, choices=["attention", "model", "task"],
                   help="only this kind (plurals and 'kernels' are read too)")
    p.set_defaults(func=_cmd_list)


#: what `qkv list` also reads for its kinds: the plurals a user types, and the kernels' other name
_LIST_ALIASES = {"attentions": "attention", "kernel": "attention", "kernels": "attention", "models": "model",
                 "tasks": "task"}


def _list_kind(text: str) -> str:
    return _LIST_ALIASES.get(text.lower(), text.lower())


def _data_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv data fetch|list [NAMES]`."""
    p = sub.add_parser("data", help="fetch or list the real data sets (cached under $QKV_DATA or ~/.cache/qkv)",
                       description="Fetch or list the real data sets. Example: qkv data fetch shakespeare")
    p.add_argument("action", choices=["fetch", "list"])
    p.add_argument("names", nargs="*", help="data sets to fetch (default: all)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--force", action="store_true", help="fetch again even when cached")
    p.set_defaults(func=_cmd_data)


def _train_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv train MODEL --task TASK ...`."""
    p = sub.add_parser("train", help="train MODEL on --task",
                       description="Train MODEL on --task. Example: qkv train gpt --task shakespeare-char")
    p.add_argument("model", help="a model name (qkv list model)")
    p.add_argument("--task", required=True, help="a task name (qkv list task)")
    p.add_argument("--preset", default=None, help="a named configuration of the model (e.g. paper; qkv list model "
                                                 "shows them); default: the model's CPU-sized preset")
    p.add_argument("--attention", default=None, help="attention kernel name for Transformer-family models")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="model config field (KEY.SUB=VALUE sets one key of a dict field, e.g. attention_kwargs.radius=8); "
                        "task.KEY for task options; train.KEY for training fields")
    p.add_argument("--out", default=None, help="run directory (default runs/MODEL-TASK)")
    p.add_argument("--init", default=None, metavar="RUN", help="start from run RUN's weights, or a pretrained checkpoint "
                                                               "directory's (Hugging Face bert/gpt2, e.g. qkv data fetch minilm) "
                                                               "(fine-tuning; the task's head starts fresh)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest intact checkpoint, with the run's own settings "
                        "(--steps N extends it; a flag that contradicts the run is refused)")
    _add_threads(p)
    _add_train_flags(p)
    p.set_defaults(func=_cmd_train)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv eval RUN ...`."""
    p = sub.add_parser("eval", help="evaluate a run on its task's held-out split",
                       description="Evaluate a run. Example: qkv eval runs/main --split test --max-examples 512")
    p.add_argument("run")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--max-examples", type=_positive_int, default=None)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="evaluation-time model option (e.g. eval_mem_len=512) or task.KEY=VALUE; repeatable")
    _add_threads(p)
    p.set_defaults(func=_cmd_eval)


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv generate RUN ...`."""
    p = sub.add_parser("generate", help="sample text from a language-model run",
                       description='Sample text from a language-model run. Example: qkv generate runs/main --prompt "ROMEO:"')
    p.add_argument("run")
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=_positive_int, default=200)
    p.add_argument("--temperature", type=_nonnegative_float, default=0.8)
    p.add_argument("--top-k", type=_positive_int, default=None)
    p.add_argument("--top-p", type=_nonnegative_float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=_positive_int, default=16, help="image tasks: samples in the PNG grid")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="image tasks: class=C, temperature=T")
    p.add_argument("--out", default=None, help="image tasks: PNG path (default RUN/samples.png)")
    _add_threads(p)
    p.set_defaults(func=_cmd_generate)


def _translate_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv translate RUN TEXT ...`."""
    p = sub.add_parser("translate", help="translate text with a sequence-to-sequence run",
                       description="Translate with a sequence-to-sequence run. Example: qkv translate runs/rev 12345")
    p.add_argument("run")
    p.add_argument("text", nargs="+")
    p.add_argument("--beam", type=_positive_int, default=1)
    p.add_argument("--max-new-tokens", type=_positive_int, default=None,
                   help="longest output (default: the task's longest target + 1, for <eos>)")
    _add_threads(p)
    p.set_defaults(func=_cmd_translate)


def _viz_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv viz [RUN] ...`."""
    p = sub.add_parser("viz", help="plot a run's attention weights (every layer and head), or a kernel's pattern, as a PNG",
                       description='Plot a run\'s attention. Example: qkv viz runs/main --text "ROMEO: But, soft!"; '
                                   'a kernel\'s pattern: qkv viz --pattern strided --length 64 --kernel-kwargs stride=8')
    p.add_argument("run", nargs="?")
    p.add_argument("--pattern", default=None, metavar="NAME", help="plot which keys each query of kernel NAME sees")
    p.add_argument("--length", type=int, default=64, help="with --pattern: sequence length (default 64)")
    p.add_argument("--kernel-kwargs", action="append", default=[], metavar="KEY=VALUE,...",
                   help="with --pattern: the kernel's knobs, e.g. 'stride=8' or 'image_size=(8,8),block=(2,4)'")
    p.add_argument("--causal", action="store_true", help="with --pattern: the causal form")
    p.add_argument("--text", default=None, help="input to show (default: a held-out example): text for language "
                   "and sequence-to-sequence tasks; for bAbI and digit-bags a test example's index, for ntm-copy a "
                   "sequence length")
    p.add_argument("--out", default=None, help="PNG path (default RUN/attention.png)")
    p.add_argument("--max-len", type=_positive_int, default=48, help="tokens of the input shown (default 48)")
    p.add_argument("--max-panels", type=_positive_int, default=16)
    p.add_argument("--html", default=None, metavar="OUT.html",
                   help="write an offline, self-contained page to explore the attention interactively instead")
    p.add_argument("--compare", nargs="+", default=None, metavar="RUN",
                   help="with --html: more runs of the same task, selectable on the page")
    _add_threads(p)
    p.set_defaults(func=_cmd_viz)


def _export_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv export RUN OUT ...`."""
    p = sub.add_parser("export", help="write a run's model where other tools read it (a Hugging Face pipeline)",
                       description="Write a run's model, tokenizer and labels into OUT (a new or empty folder, or "
                                   "an earlier qkv export, replaced; any other folder is refused; OUT appears only complete). Example: qkv export "
                                   "runs/bbc out/bbc, then transformers.pipeline('text-classification', model='out/bbc')")
    p.add_argument("run")
    p.add_argument("out")
    p.add_argument("--format", default="huggingface", choices=["huggingface", "qkv"],
                   help="huggingface (default): config.json, model.safetensors, tokenizer.json, tokenizer_config.json, "
                        "generation_config.json for LMs; qkv: the run's model/ with its vocabulary")
    _add_threads(p)
    p.set_defaults(func=_cmd_export)


def _linearize_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv linearize SOURCE --attention NAME --task TASK ...`."""
    p = sub.add_parser("linearize", help="make a pretrained decoder's attention linear-time: attention transfer, then LoRA",
                       description="Swap every layer's softmax attention of a pretrained decoder for a linear-time "
                                   "kernel, train the kernel's new parameters to reproduce each layer's softmax outputs "
                                   "(attention transfer), then optionally fine-tune low-rank adapters (LoLCATs). "
                                   "Example: qkv linearize smollm2 --attention linear --feature-map hedgehog --window 64 "
                                   "--task shakespeare-char --steps 100 --finetune-steps 50 --set task.block_size=256")
    p.add_argument("source", help="a decoder to linearize: a Hugging Face checkpoint directory (Llama, Mistral, Qwen2, "
                                  "Qwen3, GPT-2), a save_pretrained directory, a qkv run, or 'smollm2' (qkv data fetch smollm2)")
    p.add_argument("--attention", default="linear", help="the linear-time kernel (default linear; gla, gated-deltanet, "
                                                        "performer, ...: qkv list attention)")
    p.add_argument("--feature-map", default=None, choices=["hedgehog", "elu", "performer"],
                   help="--attention linear's feature map (default hedgehog, learned)")
    p.add_argument("--window", type=_positive_int, default=None,
                   help="--attention linear: a sliding window of exact softmax over the last WINDOW tokens beside the "
                        "linear part (LoLCATs; the linear-window kernel)")
    p.add_argument("--task", required=True, help="a text task read with the source's tokenizer (e.g. shakespeare-char)")
    p.add_argument("--steps", type=_positive_int, default=200, help="attention-transfer updates (default 200)")
    p.add_argument("--finetune-steps", type=_nonnegative_int, default=0,
                   help="low-rank fine-tune updates after the transfer (default 0: none)")
    p.add_argument("--lora-rank", type=_positive_int, default=8, help="LoRA rank of the fine-tune (default 8)")
    p.add_argument("--lora-alpha", type=_nonnegative_float, default=None, help="LoRA alpha (default twice the rank)")
    p.add_argument("--lr", type=_nonnegative_float, default=1e-2, help="attention-transfer learning rate (default 1e-2)")
    p.add_argument("--finetune-lr", type=_nonnegative_float, default=1e-4, help="fine-tune learning rate (default 1e-4)")
    p.add_argument("--batch-size", type=_positive_int, default=4, help="sequences per update (default 4)")
    p.add_argument("--seed", type=_nonnegative_int, default=0, help="seeds the new parameters and the batches (default 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="task.KEY for task options (task.block_size=256), train.KEY for training fields")
    p.add_argument("--out", default=None, help="output directory (default runs/linearize-ATTENTION)")
    p.add_argument("--resume", action="store_true", help="continue the linearization in --out (same arguments)")
    _add_threads(p)
    p.set_defaults(func=_cmd_linearize)


def _cmd_linearize(args: argparse.Namespace) -> int:
    from qkv.linearize import linearize

    source = args.source
    if source == "smollm2" and not Path(source).exists():
        from qkv.tasks import data

        with user_input():
            source = str(data.smollm2_dir())
    threads = set_threads(args.threads, warn_load=True, say=announce)
    out = args.out or f"runs/linearize-{args.attention}"
    announce(f"linearizing {args.source} -> {out} [{args.steps} transfer + {args.finetune_steps} fine-tune steps, "
             f"batch {args.batch_size}, {threads} thread(s)]")
    record = linearize(source, args.task, out, attention=args.attention, feature_map=args.feature_map,
                       window=args.window, steps=args.steps, finetune_steps=args.finetune_steps,
                       lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lr=args.lr, finetune_lr=args.finetune_lr,
                       batch_size=args.batch_size, seed=args.seed, overrides=_pairs(args.set), resume=args.resume,
                       say=announce)
    print(json.dumps({"out": out, "final": record["final"], "stages": record["stages"]}))
    return 0


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv bench ...`: listed for `qkv --help`; main() hands the arguments to qkv.bench.main whole."""
    p = sub.add_parser("bench", help="benchmarks (qkv bench --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: _run_bench(a.rest))

def _reproduce_parser(sub: argparse._SubParsersAction) -> None:
    """`qkv reproduce ID [--seeds N] [--dry-run]` / `qkv reproduce --list`."""
    p = sub.add_parser("reproduce", help="rerun one paper claim of docs/reproductions/claims.json at HEAD",
                       description="Rerun one claim's recorded command (a source checkout's benchmarks/) and print "
                                   "the new verdict beside the recorded one. Example: qkv reproduce "
                                   "performer-orthogonal --dry-run")
    p.add_argument("id", nargs="?", help="the claim (qkv reproduce --list lists them)")
    p.add_argument("--list", action="store_true", help="list every claim: id, kind, status, seeds, estimated minutes, "
                                                       "paper, budget")
    p.add_argument("--seeds", type=_positive_int, default=None,
                   help="seeds to run (default: as recorded); fewer than recorded runs in a scratch copy and writes "
                        "nothing")
    p.add_argument("--dry-run", action="store_true", help="print what would run and where it would write")
    p.set_defaults(func=_cmd_reproduce)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "reproduce.py").is_file():
        raise CLIError(f"qkv reproduce needs a source checkout of qkv (benchmarks/reproduce.py); none at {root}")
    if args.list == (args.id is not None):
        raise CLIError("give a claim id or --list (qkv reproduce --list lists the claims)")
    spec = importlib.util.spec_from_file_location("qkv_reproduce", root / "benchmarks" / "reproduce.py")
    reproduce = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    if args.list:
        print("\n".join(reproduce.listing(root)))
        return 0
    plan = reproduce.plan(reproduce.find(reproduce.load(root), args.id), args.seeds)
    if args.dry_run:
        print("\n".join(reproduce.describe(plan, root)))
        return 0
    return reproduce.run(plan, root)


def _run_bench(argv: List[str]) -> int:
    """``qkv bench ARGS``: qkv.bench.main, with ``--threads`` defaulting to the physical cores, or
    to 1 (with a warning) when other processes already keep the CPU busy."""
    from qkv import bench

    argv = list(argv)
    if argv and argv[0] in bench.BENCHMARKS and not ({"-h", "--help"} & set(argv)) \
            and not any(a == "--threads" or a.startswith("--threads=") for a in argv):
        threads = physical_cores()
        load = load_average()
        if load >= 0.5:
            announce(f"warning: the load average is {load:.1f}; other processes use the CPU, so timings run "
                      "with --threads 1 (pass --threads N to choose)")
            threads = 1
        argv = [argv[0], "--threads", str(threads), *argv[1:]]
    return int(bench.main(argv) or 0)


def _one_line_warning(message: Any, category: type, filename: str, lineno: int, line: Optional[str] = None) -> str:
    """A library warning as the command shows it: ``qkv: warning: ...``, without Python's file,
    line and source."""
    return f"qkv: warning: {message}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning  # for this command only
    try:
        if argv and argv[0] == "bench":  # its own parser, so that `qkv bench --help` is bench's help
            return _run_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (UserError, FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError,
            NotADirectoryError) as e:  # not a bug (a value or a path the user gave): no traceback
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`qkv list | head`): stop quietly; point stdout at /dev/null so that
        # Python's own flush at exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatwarning


if __name__ == "__main__":
    sys.exit(main())
