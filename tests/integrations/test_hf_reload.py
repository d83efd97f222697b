"""A transformers model saved under ``attn_implementation="qkv-..."`` loads under it again
(qkv.hf.attention records the kernel in config.json): save -> reload -> the same logits, not
sdpa's; a name registered with knobs is registered again from the record in a process that has
not; a name registered here as another kernel is refused."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from qkv.hf import attention as hf  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def registered():
    return hf.register()


def _gpt2(impl):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.set_attn_implementation(impl)
    return model


def _logits(model):
    ids = torch.randint(1, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits


def _forget(impl):
    """This process as one that never registered ``impl``."""
    hf._registered.pop(impl, None)
    AttentionInterface._global_mapping.pop(impl, None)
    AttentionMaskInterface._global_mapping.pop(impl, None)


def test_a_model_saved_under_a_qkv_kernel_reloads_under_it(tmp_path):
    model = _gpt2("qkv-performer")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"] == "qkv-performer"
    assert saved[hf.RECORD_KEY] == {"attn_implementation": "qkv-performer", "kernel": "performer", "knobs": {"seed": 0}}
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config._attn_implementation == "qkv-performer"
    torch.testing.assert_close(_logits(again), _logits(model), atol=1e-6, rtol=0)
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert (_logits(sdpa) - _logits(model)).abs().max() > 1e-4  # what a silent fallback to sdpa would give


def test_a_name_with_knobs_is_registered_again_from_the_record(tmp_path):
    impl = "qkv-window-test-reload"
    hf.register(impl, "window", radius=2)
    try:
        model = _gpt2(impl)
        model.save_pretrained(tmp_path)
        expected = _logits(model)
        _forget(impl)  # a new process: the name is not registered
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        assert hf.registered()[impl] == ("window", {"radius": 2})
        torch.testing.assert_close(_logits(again), expected, atol=1e-6, rtol=0)
        _forget(impl)
        hf.register(impl, "window", radius=3)  # the name now means another window
        with pytest.raises(ValueError, match=r"saved under qkv's 'window' kernel with knobs \{'radius': 2\}.*radius': 3"):
            transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    finally:
        _forget(impl)


def test_a_model_switched_back_to_sdpa_is_saved_without_a_record(tmp_path):
    model = _gpt2("qkv-performer")
    model.save_pretrained(tmp_path / "qkv")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "qkv")
    again.set_attn_implementation("sdpa")
    again.save_pretrained(tmp_path / "sdpa")
    saved = json.loads((tmp_path / "sdpa" / "config.json").read_text())
    assert "attn_implementation" not in saved and hf.RECORD_KEY not in saved
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sdpa").config._attn_implementation == "sdpa"
