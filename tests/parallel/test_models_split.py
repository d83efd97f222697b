"""Which models ``--context-parallel`` splits, and that a split model's answer is one process's.

Each model declares it (``QKVModel.context_parallel``, ``context_parallel_refusal``). Two tables,
kept as they are: every model that is accepted gives, on 2 gloo processes that each hold half of
every sequence (weighted as the trainer weights a shard's loss), the loss and the parameter
gradients of one process (float64, 1e-9); every model that is refused says why, in one line, before
a run is made — among them the ones that once ran and gave a wrong number or hung
(universal-transformer-lm deadlocked after step 2, al-rfou with 2 targets dropped the targets at
the shard edges, lra-encoder pooled each rank's own shard, BERT read each shard's first token as
[CLS], image-transformer failed after run.json was written).
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from qkv.registry import lookup

B, L, V = 2, 16, 11
TINY = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32, "dropout": 0.0, "vocab_size": V, "max_len": L}

# (model, config beyond TINY): each must give one process's loss and gradients on 2 ranks
SPLIT = [
    ("gpt", {}),
    ("gpt", {"attention": "window", "attention_kwargs": {"radius": 3}}),
    ("al-rfou", {"n_targets": 1}),
    ("linear-transformer", {}),
    ("performer", {}),
    ("transformer-xl", {}),  # batches of their own: no memory carried in (a stream task is refused)
    ("gtrxl", {}),
    ("adaptive-span", {}),
    ("sparse-transformer", {"stride": 4}),
    ("sparse-transformer", {"stride": 4, "sparse_mode": "heads"}),  # heads [0, h/2) one pattern, [h/2, h) the other
    ("reformer", {"bucket_size": 4}),  # LSH without a seed: rank 0 draws the rotations, as one process
    ("gpt", {"attention": "lsh", "attention_kwargs": {"bucket_size": 4, "seed": None}}),
]

# (model, config beyond TINY, what the refusal says): refused before anything is written
REFUSED = [
    ("universal-transformer-lm", {"n_layers": 1}, "adaptive computation time halts each position"),
    ("al-rfou", {"n_targets": 2}, "n_targets=2"),
    ("lra-encoder", {"n_classes": 2}, "pools every position"),
    ("lra-dual-encoder", {"n_classes": 2}, "pools every position"),
    ("bert", {"head": "pretraining"}, "next-sentence prediction from the \\[CLS\\] token"),
    ("bert", {"head": "classification"}, "classifies from the \\[CLS\\] token"),
    ("gpt", {"head": "classification"}, "reads one position of each sequence"),
    ("image-transformer", {"max_len": 784}, "reads images"),
    ("transformer", {}, "cross-attention"),
    ("lstmn", {}, "no self-attention kernel"),
]


def _build(name: str, extra: dict):
    cls = lookup("model", name)
    fields = {f for c in type.mro(cls.config_class) for f in getattr(c, "__dataclass_fields__", {})}
    config = {k: v for k, v in {**TINY, **extra}.items() if k in fields}
    torch.manual_seed(0)
    return cls.from_config(config)


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (B, L), generator=g)
    labels = torch.randint(0, V, (B, L), generator=g)
    labels[0, 3:6] = labels[1, 9] = -100  # some positions without a target
    return {"input_ids": ids, "labels": labels}


def _error(name: str, extra: dict, rank: int, group) -> float:
    from qkv import parallel

    model = _build(name, extra).double().train()
    batch = _batch()
    torch.manual_seed(7)  # one process: seeded as rank 0 below (kernels that draw: lsh, performer)
    whole = model(**batch).loss
    whole.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7 + rank)  # the ranks seeded apart, as qkv train seeds them
    sharding = parallel.enable(model, group)
    try:
        mine, length = parallel.shard_batch(batch, sharding, ("input_ids", "labels"))
        with sharding.active(length):  # backward too, as the trainer does: a recomputed block runs on shards again
            loss = model(**mine).loss
            # the trainer's weighting: a shard's mean loss times its share of the target tokens
            count = torch.tensor(float((mine["labels"] != -100).sum()), dtype=torch.float64)
            total = count.clone()
            dist.all_reduce(total)
            share = loss * count / total
            share.backward()
    finally:
        sharding.remove()
    summed = share.detach().reshape(1).clone()
    dist.all_reduce(summed)
    errors = [(summed[0] - whole.detach()).abs()]
    for n, p in model.named_parameters():
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(grad)
        errors.append((grad - reference.get(n, torch.zeros_like(p))).abs().max())
    err = torch.stack(errors).max()
    err = torch.where(err.isnan(), torch.full_like(err, float("inf")), err).reshape(1)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return float(err)


def _worker(rank: int, world: int, init: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    found = {}
    try:
        for name, extra in SPLIT:
            key = f"{name} {extra}"
            try:
                found[key] = _error(name, extra, rank, None)
            except Exception:
                found[key] = traceback.format_exc()
                raise  # a rank that fails leaves its peer waiting: stop the group
    finally:
        if rank == 0:
            results.update(found)
        dist.destroy_process_group()


def test_every_model_that_splits_gives_the_one_process_loss_and_gradients(tmp_path):
    results = mp.Manager().dict()
    try:
        mp.spawn(_worker, args=(2, f"file://{tmp_path}/store", results), nprocs=2, join=True)
    except Exception as error:
        failed = {what: r for what, r in results.items() if isinstance(r, str)}
        raise AssertionError(f"{failed or error}") from None
    assert set(results.keys()) == {f"{name} {extra}" for name, extra in SPLIT}
    bad = {what: err for what, err in results.items() if not err <= 1e-9}
    assert not bad, f"2 ranks differ from one process (max abs error of loss and gradients) in {bad}"


@pytest.mark.parametrize("name, extra, reason", REFUSED, ids=[f"{n}-{r[:20]}" for n, _, r in REFUSED])
def test_models_that_cannot_split_say_why(name, extra, reason):
    from qkv._errors import UserError
    from qkv.train.distributed import refuse_unsplittable

    with pytest.raises(UserError, match=reason):
        refuse_unsplittable(_build(name, extra), carries_state=False)


def test_every_model_declares_whether_it_splits():
    """A model either declares True or gives its reason: a new model is refused until it says."""
    from qkv.models.base import QKVModel
    from qkv.registry import names

    for name in names("model"):
        declared = lookup("model", name).context_parallel
        assert declared is True or (isinstance(declared, str) and declared), name
    assert isinstance(QKVModel.context_parallel, str)
