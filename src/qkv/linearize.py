"""Linearizing a pretrained softmax decoder: ``qkv linearize`` (Zhang et al. 2024, "LoLCATs: On
Low-Rank Linearizing of Large Language Models", arXiv:2410.10254; Hedgehog, arXiv:2402.04347).

Two stages, each a qkv run (checkpoints, ``metrics.jsonl``, progress, resume after kill -9):

1. **Attention transfer** (``OUT/transfer``). Every layer's softmax attention is swapped for a
   linear-time kernel, keeping the q/k/v/o projections (``swap_attention``). Only the kernel's new
   parameters train — Hedgehog's feature maps, LoLCATs' window factors, GLA's and Gated DeltaNet's
   gate projections — to reproduce each layer's softmax outputs on real text:

       loss = (1 / n_layers) sum_l mean((y_l^linear - y_l^softmax)^2)

   where both outputs are the kernel's heads ``(B, H, L, Ev)`` computed in the same pass from the
   same q, k, v, and the softmax output (not the linear one) goes on to the output projection and
   the next layer: each layer learns from the teacher's hidden states, as in LoLCATs (§3.1). The
   rest of the model is frozen; in evaluation the model is the linearized one alone, so the run's
   validation loss is its language-model loss.
2. **Low-rank fine-tune** (``OUT/finetune``, when ``finetune_steps > 0``; LoLCATs §3.2): LoRA
   adapters (``peft``, rank ``lora_rank``) on the four attention projections of every layer,
   trained on the language-model loss with everything else frozen (the feature maps too), then
   merged into the projections: the saved model is a plain qkv model with the new kernel.

``OUT/linearize.json`` records what was asked, and for each stage the tokens read and the CPU
seconds it took; ``qkv.runs.load(OUT)`` (``qkv eval OUT``, ``qkv generate OUT``, ``qkv export
OUT``) opens the last stage's run.

Kernels (``kernel_for``): ``linear`` with a feature map (``hedgehog``, learned, the default;
``elu``; ``performer``: Performer's positive random features, the ``performer`` kernel), ``linear``
with ``window=W`` (LoLCATs' sliding window of exact softmax beside the linear part, the
``linear-window`` kernel), and any other causal kernel by name (``gla``, ``gated-deltanet``, ...). A
kernel that cannot take the pretrained q/k/v (shared queries and keys: ``lsh``; not causal) is
refused, as is a source whose attention cannot be transferred (cross-attention, a relative or
ALiBi bias, a kernel that is not softmax's).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._errors import UserError, user_input
from ._io import atomic_path
from ._modelfile import RUN_FILE
from .runs.directory import LINEARIZE_RECORD as RECORD, final_run, read_json
from .models.base import ModelOutput, QKVModel
from .registry import lookup

__all__ = ["linearize", "kernel_for", "swap_attention", "AttentionTransfer", "LowRankFinetune", "final_run",
           "FEATURE_MAPS", "RECORD"]

#: ``--feature-map`` names -> ``LinearAttention(feature_map=...)`` (``performer``: the ``performer`` kernel)
FEATURE_MAPS = {"hedgehog": "hedgehog", "elu": "elu+1", "performer": None}
#: the teacher kernels whose outputs a student can be fitted to (softmax; Mistral's sliding window of it)
TEACHER_KERNELS = ("softmax", "window")
#: the projections the low-rank fine-tune adapts (``MultiHeadAttention``'s names)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")


def kernel_for(attention: str, feature_map: Optional[str] = None, window: Optional[int] = None) -> Tuple[str, Dict[str, Any]]:
    """The registered kernel and its knobs for ``--attention``, ``--feature-map`` and ``--window``."""
    if feature_map is not None and feature_map not in FEATURE_MAPS:
        raise UserError(f"--feature-map must be one of {sorted(FEATURE_MAPS)}, got {feature_map!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UserError(f"--window must be an int >= 1 (LoLCATs' sliding window, in tokens), got {window!r}")
    if attention != "linear":
        if feature_map is not None or window is not None:
            raise UserError(f"--feature-map and --window belong to --attention linear; {attention!r} takes neither")
        return attention, {}
    feature_map = feature_map or "hedgehog"
    if feature_map == "performer":
        if window is not None:
            raise UserError("--window goes with a feature map of linear attention (hedgehog, elu), not performer's")
        return "performer", {}
    knobs = {"feature_map": FEATURE_MAPS[feature_map]}
    return ("linear-window", {**knobs, "window": window}) if window is not None else ("linear", knobs)


def _check_teacher(model: Any) -> None:
    """Refuse a source whose attention cannot be transferred, in one line."""
    name = getattr(model, "registry_name", type(model).__name__)
    stack = getattr(model, "stack", None)
    if stack is None or not getattr(stack, "causal", False) or getattr(model.config, "head", "lm") != "lm":
        raise UserError(f"linearize takes a decoder-only language model (gpt, llama); the source is {name!r}")
    config = model.config
    if callable(getattr(config, "alibi", None)) and config.alibi():
        raise UserError(f"the source's attention has a relative position bias ({config.positional}), which a "
                        f"linear-time kernel's feature products cannot hold: it cannot be transferred")
    for block in stack.layers:
        if getattr(block, "cross_attn", None) is not None:
            raise UserError("the source has cross-attention (an encoder-decoder): only self-attention is transferred")
        kernel = block.self_attn.kernel
        if kernel.registry_name not in TEACHER_KERNELS:
            raise UserError(f"the source's attention is {kernel.registry_name!r}; linearize transfers from "
                            f"{' or '.join(TEACHER_KERNELS)} attention")
        if getattr(kernel, "alibi", False):
            raise UserError("the source's attention has an ALiBi bias, which a linear-time kernel's feature products "
                            "cannot hold: it cannot be transferred")


def swap_attention(teacher: Any, attention: str, attention_kwargs: Optional[Mapping[str, Any]] = None,
                   seed: int = 0) -> Tuple[Any, List[str]]:
    """A copy of the decoder ``teacher`` with every layer's attention kernel ``attention``
    (``attention_kwargs`` its knobs), the q/k/v/o projections and every other weight kept; returns
    ``(student, names)``, the names of the parameters that start fresh (the kernel's own, its gate
    projections), initialised from ``seed``. Refused (``UserError``): a kernel that is not causal,
    that shares queries and keys, or that would drop a pretrained weight."""
    _check_teacher(teacher)
    cls = lookup("attention", attention)
    if not cls.supports_causal:
        raise UserError(f"attention {attention!r} cannot be causal: a decoder's attention cannot become it")
    from .runs.training import build_model

    values = {**dataclasses.asdict(teacher.config), "attention": attention, "attention_kwargs": dict(attention_kwargs or {})}
    values.pop("sliding_window", None) if attention != "window" else None
    student = build_model(type(teacher), values, seed)
    if any(block.self_attn.k_proj is None for block in student.stack.layers):
        raise UserError(f"attention {attention!r} shares queries and keys (Reformer): the pretrained key projections "
                        f"would be dropped; choose another kernel")
    dropped = sorted(set(teacher.state_dict()) - set(student.state_dict()))
    if dropped:
        raise UserError(f"attention {attention!r} has no place for the pretrained {', '.join(dropped[:3])}"
                        f"{' ...' if len(dropped) > 3 else ''}: it cannot take the pretrained q/k/v")
    fresh = student.init_from(teacher)
    strange = [n for n in fresh if ".self_attn.kernel." not in n and ".self_attn.gates." not in n]
    if strange:
        raise UserError(f"attention {attention!r} would start {', '.join(strange[:3])} fresh, outside the attention "
                        f"kernel: it cannot be transferred")
    student.to(next(teacher.parameters()).dtype)
    return student, fresh


class _Delegate(nn.Module):
    """A training objective around a qkv model: what the trainer and the run read that the
    objective does not define (``config``, ``registry_name``, ``carries_state``, ...) is the model's."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)

    def save_pretrained(self, directory: Any, **kwargs: Any) -> None:
        self.plain().save_pretrained(directory, **kwargs)

    def plain(self) -> Any:
        """The qkv model this objective trains, as it will be saved."""
        return self.model


class AttentionTransfer(_Delegate):
    """Stage 1: ``model(**batch).loss`` is the mean over layers of the MSE between the student
    kernel's outputs and the teacher kernel's on the same q, k, v (the teacher's output passed on);
    in eval mode the student alone (its language-model loss and logits). Only ``trainable`` (the
    fresh parameters' names) require gradients."""

    def __init__(self, student: Any, teacher: Any, trainable: List[str]) -> None:
        super().__init__(student)
        # the teacher's kernels, one per layer: copies outside the module tree (not in the state dict)
        self._teachers = tuple(copy.deepcopy(block.self_attn.kernel) for block in teacher.stack.layers)
        names = set(trainable)
        for name, p in student.named_parameters():
            p.requires_grad_(name in names)
        self._losses: Optional[List[torch.Tensor]] = None
        for index, block in enumerate(student.stack.layers):
            block.self_attn.kernel.register_forward_hook(self._hook(index), with_kwargs=True)

    def _hook(self, index: int):
        def transfer(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._losses is None:  # not inside a transfer forward: the student's own output
                return None
            q, k, v = args[:3]
            extra = {"position_ids": kwargs["position_ids"]} if kwargs.get("position_ids") is not None else {}
            with torch.no_grad():
                target = self._teachers[index](q, k, v, mask=kwargs.get("mask"), **extra).output
            acc = torch.promote_types(target.dtype, torch.float32)  # half outputs compared in float32
            self._losses.append(F.mse_loss(output.output.to(acc), target.to(acc)))
            return output._replace(output=target)
        return transfer

    def forward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None, **kwargs: Any) -> ModelOutput:
        if not self.training:
            return self.model(input_ids, labels=labels, **kwargs)
        self._losses = []
        try:
            mask, position_ids = kwargs.get("attention_mask"), kwargs.get("position_ids")
            extra = {} if position_ids is None else {"position_ids": position_ids}
            self.model.stack(input_ids, None, mask=mask, **extra)  # the language-model head is not needed
            loss = torch.stack(self._losses).mean()
        finally:
            self._losses = None
        return ModelOutput(loss=loss, logits=None)


class LowRankFinetune(_Delegate):
    """Stage 2: LoRA adapters (``peft``) on the attention projections, the language-model loss;
    saved with the adapters merged into the projections (a plain model)."""

    def __init__(self, model: Any, rank: int, alpha: float) -> None:
        from peft import LoraConfig, get_peft_model

        super().__init__(get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                          target_modules=list(LORA_TARGETS))))

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> ModelOutput:
        return self.model(input_ids=input_ids, **kwargs)

    def plain(self) -> Any:
        merged = copy.deepcopy(self.model).merge_and_unload()
        for block in merged.stack.layers:
            block.self_attn._pack_in_proj()  # the merged projections fused again, as a freshly built model's
        return merged

    def __getattr__(self, name: str) -> Any:
        try:
            return nn.Module.__getattr__(self, name)
        except AttributeError:
            return getattr(self._modules["model"].get_base_model(), name)


def _source_model_name(source: str) -> Tuple[str, Any]:
    """The registry name of the source's model and the model itself (a run's, a model directory's)."""
    from . import runs

    path = Path(source).expanduser()
    with user_input():
        if (path / RUN_FILE).is_file():
            model = runs.load(path).model
        else:
            model = QKVModel.from_pretrained(path)
    return model.registry_name, model


def _stage(directory: Path, settings: Any, model: nn.Module, train: Dict[str, Any], resume: bool, say: Any) -> Dict[str, Any]:
    """Run one stage as a qkv run in ``directory``; its tokens and CPU seconds (None when it was done already)."""
    from .runs import Run

    staged = dataclasses.replace(settings, model_config=dataclasses.asdict(model.config), train=train, _model=model,
                                 _init_model=None)
    cpu, wall = time.process_time(), time.perf_counter()
    with Run.create(directory, staged, resume=resume, say=say) as run:
        if run.finished:
            return {"done_before": True}
        metrics = run.train()
    block = int(settings._task.get_batch("train", 1, 0)["input_ids"].shape[-1])
    trained = any(p.requires_grad for p in model.parameters())  # none: the trainer only evaluated
    return {"steps": train["steps"] if trained else 0,
            "tokens": train["steps"] * train["batch_size"] * block if trained else 0,
            "cpu_seconds": round(time.process_time() - cpu, 3), "wall_seconds": round(time.perf_counter() - wall, 3),
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def linearize(source: str, task: str, out: str, *, attention: str = "linear", feature_map: Optional[str] = None,
              window: Optional[int] = None, steps: int = 200, finetune_steps: int = 0, lora_rank: int = 8,
              lora_alpha: Optional[float] = None, lr: float = 1e-2, finetune_lr: float = 1e-4, batch_size: int = 4,
              seed: int = 0, overrides: Optional[Mapping[str, Any]] = None, resume: bool = False,
              say: Any = print) -> Dict[str, Any]:
    """Linearize the decoder in ``source`` (a Hugging Face checkpoint, a ``save_pretrained``
    directory or a qkv run) on ``task`` (a text task, read with the source's tokenizer) into
    ``out``: attention transfer for ``steps`` updates at ``lr``, then (``finetune_steps > 0``) LoRA
    of rank ``lora_rank`` (``lora_alpha``: default twice the rank) at ``finetune_lr``. ``overrides``:
    ``"task.KEY"`` and ``"train.KEY"`` settings as ``qkv train --set`` takes them. Returns the record
    written to ``out/linearize.json``."""
    from .runs import resolve, split_overrides

    for name, value in (("steps", steps), ("lora_rank", lora_rank), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be an int >= 1, got {value!r}")
    if isinstance(finetune_steps, bool) or not isinstance(finetune_steps, int) or finetune_steps < 0:
        raise UserError(f"--finetune-steps must be an int >= 0, got {finetune_steps!r}")
    model_sets, task_sets, train_sets = split_overrides(dict(overrides or {}))
    if model_sets:
        raise UserError(f"linearize keeps the source's architecture; only task.* and train.* settings are taken, got "
                        f"{sorted(model_sets)}")
    kernel, knobs = kernel_for(attention, feature_map, window)
    with user_input():
        lookup("attention", kernel)  # an unknown name: one line listing the kernels
    out_dir = Path(out)
    record = {"source": str(source), "task": task, "attention": attention, "feature_map": feature_map, "window": window,
              "kernel": kernel, "kernel_kwargs": knobs, "steps": steps, "finetune_steps": finetune_steps,
              "lora_rank": lora_rank, "lora_alpha": lora_alpha, "lr": lr, "finetune_lr": finetune_lr,
              "batch_size": batch_size, "seed": seed, "overrides": {k: v for k, v in dict(overrides or {}).items()}}
    _check_record(out_dir, record, resume)
    name, _ = _source_model_name(source)
    given = {**{f"task.{k}": v for k, v in task_sets.items()}, **{f"train.{k}": v for k, v in train_sets.items()}}
    try:
        settings = resolve(name, task, overrides=given, init=str(source), say=say)
    except UserError as e:  # resolve speaks of `qkv train --init`; here the checkpoint is the SOURCE argument
        raise UserError(str(e).replace(f"--init {source}", f"SOURCE {source}")) from None
    teacher = settings._init_model
    with user_input():
        student, fresh = swap_attention(teacher, kernel, knobs, seed)
    base_train = {**settings.train, "batch_size": batch_size, "seed": seed}  # train.* given: typed by resolve
    every = (lambda n: base_train["eval_every"]) if "eval_every" in train_sets else (lambda n: max(1, n // 4))
    results: Dict[str, Any] = {**record, "stages": {}, "final": "transfer"}
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir, {**results, "final": None})
    learned = dict(student.named_parameters())
    fresh = [name for name in fresh if name in learned]  # a fresh buffer (Performer's features) is not trained
    if fresh:
        say(f"linearize: {attention} ({kernel}) in every layer; training {len(fresh)} new tensors by attention transfer")
        objective = AttentionTransfer(student, teacher, fresh)
        train = {**base_train, "steps": steps, "lr": lr, "warmup": min(base_train.get("warmup", 0), steps // 10),
                 "eval_every": every(steps)}
        results["stages"]["transfer"] = _stage(out_dir / "transfer", settings, objective, train, resume, say)
    else:  # nothing new to learn: the swapped model is the transfer stage's result as it is
        say(f"linearize: {kernel} has no parameters of its own; the transfer stage saves the swapped model")
        objective = AttentionTransfer(student, teacher, [])
        train = {**base_train, "steps": 1, "lr": lr, "warmup": 0, "eval_every": 1}
        results["stages"]["transfer"] = _stage(out_dir / "transfer", settings, objective, train, resume, say)
    del teacher, settings._init_model
    if finetune_steps:
        from . import runs

        tuned = runs.load(out_dir / "transfer").model
        tuned.train()
        alpha = float(2 * lora_rank if lora_alpha is None else lora_alpha)
        objective = LowRankFinetune(tuned, lora_rank, alpha)
        train = {**base_train, "steps": finetune_steps, "lr": finetune_lr,
                 "warmup": min(base_train.get("warmup", 0), finetune_steps // 10),
                 "eval_every": every(finetune_steps)}
        results["stages"]["finetune"] = _stage(out_dir / "finetune", settings, objective, train, resume, say)
        results["final"] = "finetune"
    _write(out_dir, results)
    return results


def _check_record(out: Path, record: Dict[str, Any], resume: bool) -> None:
    """A directory that holds another linearization (or anything else) is refused; ``resume``
    continues one made with the same arguments."""
    path = out / RECORD
    if path.is_file():
        previous = read_json(path)  # a UserError naming the file when it is not JSON
        if not isinstance(previous, dict):
            raise UserError(f"{path} is corrupt: expected a JSON object, got {type(previous).__name__}")
        if not resume:
            raise UserError(f"{out} holds a linearization already; continue it with --resume or choose another --out")
        differ = sorted(k for k in record if previous.get(k) != record[k])
        if differ:
            raise UserError(f"--resume: {out} was linearized with other {', '.join(differ)} "
                            f"({', '.join(f'{k}={previous.get(k)!r}' for k in differ)}); choose another --out")
    elif out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not a linearization directory; choose an empty or new --out")


def _write(out: Path, record: Dict[str, Any]) -> None:
    with atomic_path(out / RECORD) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n")
