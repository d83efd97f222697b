"""``ModelOutput.hidden``: the last hidden states ``(B, L, d_model)`` of every Transformer-family
model (the decoder's for encoder-decoders), what a linear probe or a pooled embedding reads."""

import inspect

import pytest
import torch

import qkv  # noqa: F401  (registers every model)
from qkv.registry import lookup, names

FAMILY = [n for n in names("model") if lookup("model", n).__module__.startswith("qkv.models.transformer")]


def _small(cls):
    values = {k: v for k, v in (cls.preset(cls.default_preset) if cls.default_preset else {}).items()
              if k not in ("train", "task")}
    return cls.from_config(values).eval()


@pytest.mark.parametrize("name", FAMILY)
def test_hidden_is_the_last_hidden_states(name):
    torch.manual_seed(0)
    model = _small(lookup("model", name))
    c = model.config
    params = inspect.signature(model.forward).parameters
    if "images" in params:
        H, W = c.image_size
        batch, length = {"images": torch.randint(0, c.n_levels, (2, H, W))}, H * W
    elif "src_ids" in params:
        batch = {"src_ids": torch.randint(0, 8, (2, 5)), "tgt_ids": torch.randint(0, 8, (2, 4))}
        length = 4
    else:
        length = getattr(c, "seq_len", None) or min(c.max_len, 16)
        batch = {"input_ids": torch.randint(0, 8, (2, length))}
        if "input_ids_2" in params:  # a two-tower model: hidden holds the first document's states
            batch["input_ids_2"] = torch.randint(0, 8, (2, length))
    with torch.no_grad():
        out = model(**batch)
    assert out.hidden is not None and out.hidden.shape == (2, length, c.d_model)
    if "labels" in params and out.logits.dim() == 3 and hasattr(model, "lm_head"):
        torch.testing.assert_close(model.lm_head(out.hidden), out.logits)  # the states the logits are read from
