"""Absurd sizes and bad weights are refused before any work (issue 20, item 5): the size guard takes
the same time for 10**9 layers as for 2, and weights of the wrong dtype or with NaN/inf are refused
at load with one line naming the tensor."""

import signal
import sys

import pytest
import torch

from qkv.cli import main
from qkv.models import QKVModel
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.registry import lookup
from qkv._modelfile import write_tensors as _write
from qkv.train.checkpoint import CheckpointError, load_model_tensors

TINY = dict(vocab_size=11, max_len=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)


@pytest.fixture
def deadline():
    """Fail (rather than hang) a block that runs past ``seconds`` (the alarm repeats every second,
    so code that catches the first one is interrupted again)."""
    if sys.platform == "win32":
        pytest.skip("SIGALRM is POSIX")

    def expire(signum, frame):
        raise TimeoutError("ran past its deadline")

    previous = signal.signal(signal.SIGALRM, expire)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_a_billion_layers_is_refused_at_once(deadline):
    deadline(30)  # building 10**9 blocks, even on the meta device, takes hours and many GB
    with pytest.raises(ValueError, match=r"n_layers=1000000000.*|more than the .* of memory available"):
        GPT.from_config({**TINY, "n_layers": 10**9})


@pytest.mark.parametrize("model, values", [
    ("gpt", {**TINY, "n_layers": 70}),
    ("al-rfou", {**TINY, "n_layers": 70, "n_targets": 3}),
    ("transformer", dict(vocab_size=11, tgt_vocab_size=13, max_len=16, n_layers=70, n_decoder_layers=66,
                         d_model=8, n_heads=2, d_ff=16)),
])
def test_extrapolated_size_matches_the_exact_build(model, values):
    cls = lookup("model", model)
    config = cls.config_class(**values)
    assert cls.estimate_bytes(config) == cls._meta_bytes(config)


def _saved(tmp_path, change):
    """A tiny GPT saved to ``tmp_path/m``, one of its tensors changed by ``change`` and the file
    rewritten with a valid checksum (as a hostile or broken writer would)."""
    torch.manual_seed(0)
    GPT.from_config(TINY).save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_model_tensors(tmp_path / "m")
    name = "stack.layers.0.ff.w1.weight"
    tensors[name] = change(tensors[name])
    _write(weights, tensors, {"format": "pt"})
    return tmp_path / "m", name


def test_weights_of_another_dtype_are_refused_naming_the_tensor(tmp_path):
    directory, name = _saved(tmp_path, lambda t: t.to(torch.float16))
    with pytest.raises(CheckpointError, match=rf"{name}.*float16.*expects float32"):
        QKVModel.from_pretrained(directory)


def test_a_model_saved_in_float64_loads_in_float64(tmp_path):
    torch.manual_seed(0)
    model = GPT.from_config(TINY).double()
    model.save_pretrained(tmp_path / "m")
    back = QKVModel.from_pretrained(tmp_path / "m")
    assert all(p.dtype == torch.float64 for p in back.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, bad):
    def poison(t):
        t = t.clone()
        t.view(-1)[3] = bad
        return t

    directory, name = _saved(tmp_path, poison)
    with pytest.raises(CheckpointError, match=rf"{name}.*1 non-finite value"):
        QKVModel.from_pretrained(directory)


def test_generate_on_nan_weights_is_one_line(shakespeare_cache, train_argv, capsys):
    run = shakespeare_cache / "run"
    assert main(train_argv("gpt", "shakespeare-char", run, "--set", "n_layers=1", "--set", "d_model=16", "--set",
                           "n_heads=2", "--set", "d_ff=32", "--set", "task.block_size=8", "--threads", "1")) == 0
    tensors = load_model_tensors(run / "model")
    tensors["stack.layers.0.ff.w1.weight"] = torch.full_like(tensors["stack.layers.0.ff.w1.weight"], float("nan"))
    _write(run / "model" / "model.safetensors", tensors, {"format": "pt"})
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "To", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stack.layers.0.ff.w1.weight" in err and "non-finite" in err


@pytest.mark.parametrize("knob", [{"n_rounds": 10**9}, {"n_buckets": 2**40}])
def test_reformer_hashing_too_large_is_refused_at_the_config(knob):
    from qkv.models.transformer.reformer import ReformerConfig

    name, value = next(iter(knob.items()))
    with pytest.raises(ValueError, match=rf"{name}={value}.*more than the .* of memory available"):
        ReformerConfig(**knob)
    ReformerConfig(n_rounds=8)  # the paper's largest


# ----------------------------------------------------------------------------- estimates that cannot be made (issue 37, item 4)


def test_a_size_that_cannot_be_estimated_is_refused_not_passed(deadline):
    """d_model=10**9 overflows PyTorch's size arithmetic even on the meta device: the estimate is
    None, and that is a refusal (it used to pass, and the real allocation was attempted)."""
    deadline(60)
    config = GPTConfig(**{**TINY, "d_model": 10**9})
    assert GPT.estimate_bytes(config) is None
    with pytest.raises(ValueError, match=r"cannot be estimated before allocating.*too large.*d_model=1000000000"):
        GPT.from_config(config)


def test_train_with_a_billion_wide_model_is_one_line_and_writes_nothing(tmp_path, capsys, deadline):
    deadline(60)
    out = tmp_path / "run"
    code = main(["train", "transformer", "--task", "reverse", "--set", "d_model=1000000000", "--out", str(out),
                 "--threads", "1", "--progress", "false", "--tensorboard", "false"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "d_model=1000000000" in err and "cannot be estimated" in err
    assert not out.exists()


def test_every_registered_model_can_be_sized_on_the_meta_device():
    """A model that cannot be built on the meta device would now be refused by the size guard:
    every registered model, at its defaults and its default preset, must be estimable."""
    from qkv.models.base import config_from_dict
    from qkv.registry import names

    for name in names("model"):
        cls = lookup("model", name)
        for preset in {None, cls.default_preset}:
            values = cls.preset(preset) if preset else {}
            values.pop("train", None)
            values.pop("task", None)
            config = config_from_dict(cls.config_class, values)
            need, why = cls._estimate(config)
            assert need is not None and need > 0, f"{name} (preset {preset}): {why}"
