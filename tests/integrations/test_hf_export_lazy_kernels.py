"""torch.export of a transformers model running a qkv kernel: qkv.integrations.huggingface builds
each layer's kernel at its first call, so an export before any eager call built it while tracing.
For Performer that drew the random features as traced (fake) tensors and cached the kernel: the
export "worked" and every later eager call of the model returned a FakeTensor (found by the hqa
audit). Now the export is refused in one line saying to call the model once first; after that
call it exports and equals eager, called again and on other ids."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from qkv.integrations import huggingface as hf  # noqa: E402

hf.register()


def _bert(impl):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=32)
    model = transformers.BertModel(config).eval()
    model.set_attn_implementation(impl)
    return model


IDS = torch.randint(1, 40, (2, 9), generator=torch.Generator().manual_seed(1))
OTHER = torch.randint(1, 40, (2, 9), generator=torch.Generator().manual_seed(2))


def _hidden(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def test_export_before_the_first_call_is_refused_and_leaves_the_model_usable():
    model = _bert("qkv-performer")
    with warnings.catch_warnings(), pytest.raises(Exception, match="call the model once before exporting"):
        warnings.simplefilter("ignore")
        torch.export.export(model, (IDS,))
    with torch.no_grad():
        out = model(IDS).last_hidden_state
    assert type(out) is torch.Tensor and torch.isfinite(out).all()


@pytest.mark.parametrize("impl", ["qkv-performer", "qkv-lsh", "qkv-window"])
def test_export_after_one_call_equals_eager(impl):
    model = _bert(impl)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = {id(ids): model(ids).last_hidden_state for ids in (IDS, OTHER)}
        program = torch.export.export(model, (IDS,)).module()
        for ids in (IDS, IDS, OTHER):
            got = _hidden(program(ids))
            assert type(got) is torch.Tensor
            torch.testing.assert_close(got, expected[id(ids)], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(model(IDS).last_hidden_state, expected[id(IDS)], atol=0, rtol=0)


@pytest.mark.parametrize("impl", ["qkv-window", "qkv-lsh"])
def test_no_kernel_is_built_inside_an_export_trace(impl):
    """The rule holds in one place (the bridge's kernel cache) for every kernel, not only for those
    with random features: nothing built while tracing is kept."""
    model = _bert(impl)
    with warnings.catch_warnings(), pytest.raises(Exception, match="call the model once before exporting"):
        warnings.simplefilter("ignore")
        torch.export.export(model, (IDS,))
    assert not any(hf.layer_kernels(m) for m in model.modules())
