"""Built-in tasks: real data sets shipped by package registries, and generated tasks.

Every task is a :class:`~qkv.tasks.base.Task` (docs/contracts.md): ``get_batch(split, batch_size,
step, *, seed, rank, world_size)`` (a pure function of its arguments), ``eval_batches``,
``evaluate``, ``vocab``, ``examples``, ``kind`` (the batch kind: ``"lm"``, ``"seq2seq"``,
``"classification"``, ...) and the hooks ``Task`` declares.

name               kind       options
=================  =========  ====================================================================
shakespeare-char   lm         ``block_size=128``, ``cache_dir``, ``stream=False``
enwiki-bytes       lm         ``block_size=256``, ``cache_dir``, ``stream=False``
bible-en-es        seq2seq    ``max_chars=100``, ``cache_dir``
copy               seq2seq    ``min_len=1``, ``max_len=10``, ``alphabet="digits"``, ``eval_size=1000``
reverse            seq2seq    same as copy
sort               seq2seq    same as copy
addition           seq2seq    ``min_len=1``, ``max_len=5`` (digits per operand), ``eval_size=1000``
dates              seq2seq    ``min_year=1900``, ``max_year=2099``, ``eval_size=1000``
mqar               lm         ``vocab_size=64``, ``n_pairs=8``, ``n_queries=n_pairs``, ``seq_len`` (Zoology's recall; loss on the answers)
listops            class.     Long Range Arena (``qkv.tasks.lra``): ``min_len=500``, ``max_len=2000``, ``brackets=True``
pathfinder         class.     LRA: ``size=32``, ``contour_length=14`` (difficulty), ``n_distractors=3``
bbc-bytes          class.     LRA Text stand-in: BBC News topic from bytes, ``max_len=4096``
bbc-match          class.     LRA Retrieval stand-in: two BBC articles, same category?, ``max_len=4096``
fashion-mnist-seq  class.     LRA Image stand-in: Fashion-MNIST pixels as a sequence, ``size=32``
=================  =========  ====================================================================
=======
``list_tasks()`` (``qkv list task``) names every registered task with its one-line description.

Real data is cached by :func:`fetch` (``qkv data fetch NAME``); :data:`DATASETS` lists the sets.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from qkv import registry
from qkv.tasks import sword, vocab, base, data
from qkv.tasks import lm, translation, generated, mqar
from qkv.tasks import captions, pointer_tasks
from qkv.tasks import babi, bags, bbc, classify, digits, graphs, ntm_copy, regression
from qkv.tasks import images
from qkv.tasks import bert_tasks
from qkv.tasks import lra
from qkv.tasks.base import GeneratedSeq2SeqTask, LanguageModelTask, PairsSeq2SeqTask, Seq2SeqTask, Task
from qkv.tasks.data import DATASETS, fetch, load_bible, load_enwiki, load_mnist, load_shakespeare
from qkv.tasks.generated import AdditionTask, CopyTask, DatesTask, ReverseTask, SortTask
from qkv.tasks.lm import EnwikiBytes, ShakespeareChar
from qkv.tasks.mqar import MQARTask
from qkv.tasks.translation import BibleEnEs
from qkv.tasks.vocab import ByteVocab, CharVocab

__all__ = [
    "build_task", "list_tasks", "fetch", "DATASETS",
    "Task", "LanguageModelTask", "Seq2SeqTask", "GeneratedSeq2SeqTask", "PairsSeq2SeqTask",
    "ShakespeareChar", "EnwikiBytes", "BibleEnEs",
    "CopyTask", "ReverseTask", "SortTask", "AdditionTask", "DatesTask", "MQARTask",
    "CharVocab", "ByteVocab",
    "load_shakespeare", "load_enwiki", "load_bible", "load_mnist",
]


def build_task(name: str, **kwargs: Any) -> Task:
    """The task registered as ``name``, built with keyword options (unknown ones raise TypeError)."""
    return registry.build("task", name, **kwargs)


def list_tasks() -> List[Tuple[str, str]]:
    """``(name, one-line description)`` for every registered task."""
    return [(name, registry.describe(registry.lookup("task", name))) for name in registry.names("task")]


def task_for_model(name: str, model_cls: type) -> str:
    """The form of task ``name`` that ``model_cls`` reads: a task whose batches come in another
    form for other models lists it as ``variants = {model input key: task name}``; the model's
    ``input_key`` picks one (``bbc-news`` is ``bbc-news-tokens`` for a model whose ``input_key`` is
    ``input_ids`` and not ``doc``)."""
    cls = registry.lookup("task", name)
    if model_cls.input_key is None or model_cls.input_key == cls.input_key:
        return name
    return cls.variants.get(model_cls.input_key, name)
