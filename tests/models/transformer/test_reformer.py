"""Reformer (Kitaev et al. 2020): reversible training gradients equal the ordinary computation of
the same equations (dropout and random hashing replayed), saved activations independent of depth,
incremental decoding equal to the parallel pass, the encoder form, save/load and the CLI."""

import pytest
import torch

from qkv.cli import main
from qkv.models import Reformer, ReformerConfig


def tiny(**kw):
    torch.manual_seed(0)
    base = dict(vocab_size=11, max_len=48, n_layers=3, d_model=16, n_heads=2, d_ff=32, bucket_size=4, n_rounds=2,
                ff_chunk_size=8)
    base.update(kw)
    return Reformer(ReformerConfig(**base))


def ids(B=2, L=37, seed=0):
    return torch.randint(0, 11, (B, L), generator=torch.Generator().manual_seed(seed))


def grads(model, fn):
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout masks and LSH rotations in both computations
    fn().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dedup", [False, True])
def test_reversible_gradients_equal_the_ordinary_computation(dedup):
    """Training runs the layers in the reversible autograd function; asking for the hidden states
    runs the same equations in a plain loop with ordinary autograd: the gradients must agree,
    with dropout on and unseeded (per-call random) hashing."""
    model = tiny(dropout=0.2, attention_dropout=0.1, dedup=dedup).double().train()
    x, y = ids(), ids(seed=1)
    rev = grads(model, lambda: model(x, labels=y).loss)

    def ordinary():
        out = model.stack(x, return_hidden=True)  # plain loop: activations kept by autograd
        return torch.nn.functional.cross_entropy(model.lm_head(out.hidden).flatten(0, 1), y.flatten())

    plain = grads(model, ordinary)
    for a, b in zip(rev, plain):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-6)


def saved_bytes(model, x):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, labels=x).loss
    return total[0]


def test_saved_activations_do_not_grow_with_depth():
    x = ids(B=1, L=48)
    rev = [saved_bytes(tiny(n_layers=n), x) for n in (1, 6)]
    plain = [saved_bytes(tiny(n_layers=n, reversible=False), x) for n in (1, 6)]
    assert rev[1] <= 1.05 * rev[0], rev  # only the last layer's outputs (and the head's inputs)
    assert plain[1] > 3 * plain[0], plain


@pytest.mark.parametrize("pieces", [[1] * 20, [7, 1, 12]])
def test_incremental_decoding_equals_parallel(pieces):
    model = tiny(hash_seed=3, n_buckets=4).eval()
    x = ids(L=20)
    with torch.no_grad():
        full = model(x).logits
        state, outs, start = None, [], 0
        for n in pieces:
            out = model(x[:, start:start + n], state=state, return_state=True)
            state, start = out.state, start + n
            outs.append(out.logits)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=1e-5)
    greedy = model.generate(x[:, :3], 6, temperature=0)
    torch.testing.assert_close(greedy, model.generate(x[:, :3], 6, temperature=0, use_cache=False))


def test_causal_lm_does_not_see_the_future():
    model = tiny(hash_seed=0).eval()
    x = ids(L=30)
    x2 = x.clone()
    x2[:, 20:] = (x2[:, 20:] + 1) % 11
    with torch.no_grad():
        torch.testing.assert_close(model(x2).logits[:, :20], model(x).logits[:, :20])


def test_encoder_classifier_ignores_padding():
    model = tiny(head="classification", num_labels=3, hash_seed=0).eval()
    x = ids(L=19)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 12:] = False
    x2 = x.clone()
    x2[0, 12:] = (x2[0, 12:] + 3) % 11
    out = model(x, attention_mask=mask, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.loss.ndim == 0
    torch.testing.assert_close(model(x2, attention_mask=mask).logits, out.logits)
    with pytest.raises(ValueError, match="head='lm'"):
        model(x, return_state=True)


def test_save_load_and_config_checks(tmp_path):
    model = tiny(hash_seed=1).eval()
    model.save_pretrained(tmp_path / "m")
    back = Reformer.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids()).logits, model(ids()).logits)
    assert back.stack.layers[0].self_attn.k_proj is None  # shared QK: no key projection
    with pytest.raises(ValueError, match="head"):
        ReformerConfig(head="seq2seq")
    with pytest.raises(ValueError, match="pre-ln"):
        ReformerConfig(residual="post-ln")
    # issue 20 item 6: attention_kwargs' LSH knobs were silently overridden by the fields
    with pytest.raises(ValueError, match=r"attention_kwargs.bucket_size=16 conflicts with bucket_size=32: .* set bucket_size"):
        ReformerConfig(attention_kwargs={"bucket_size": 16})
    with pytest.raises(ValueError, match=r"attention_kwargs.seed=3 conflicts with hash_seed=None"):
        ReformerConfig(attention_kwargs={"seed": 3})
    agreeing = ReformerConfig(bucket_size=16, attention_kwargs={"bucket_size": 16, "n_rounds": 2})
    assert agreeing.attention_kwargs["bucket_size"] == 16


def test_scores_are_the_authors_and_eq1_is_one_field_away(tmp_path):
    """The preset scores shared-QK attention as the authors' code does (unit keys, no 1/sqrt(d));
    ``score_scale=None`` gives eq. 1's 1/sqrt(d). The two differ, and the kernel holds the field's value."""
    authors, eq1 = tiny(hash_seed=1).eval(), tiny(hash_seed=1, score_scale=None).eval()
    assert authors.config.score_scale == 1.0 and authors.stack.layers[0].self_attn.kernel.score_scale == 1.0
    assert eq1.stack.layers[0].self_attn.kernel.score_scale is None
    eq1.load_state_dict(authors.state_dict())  # same weights: only the scores' factor differs
    with torch.no_grad():
        a, b = authors(ids()).logits, eq1(ids()).logits
    assert not torch.allclose(a, b, atol=1e-4)
    with pytest.raises(ValueError, match=r"attention_kwargs.score_scale=0.5 conflicts with score_scale=1.0"):
        ReformerConfig(attention_kwargs={"score_scale": 0.5})
    with pytest.raises(ValueError, match="score_scale"):
        tiny(score_scale=-1.0)
    sizes = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "max_len": 32}
    for bad in (float("nan"), True, "abc", [1.0]):  # a config.json's hostile values: one line naming the field
        with pytest.raises((TypeError, ValueError), match="score_scale") as e:
            Reformer.from_config({**sizes, "score_scale": bad})
        assert "\n" not in str(e.value)


def test_config_saved_before_score_scale_loads_with_its_own_scores(tmp_path):
    """A config.json written before the field existed (LSH knobs in attention_kwargs, no
    score_scale) was trained with eq. 1's scores: it loads with them, giving the logits it gave."""
    import json

    model = tiny(hash_seed=1, score_scale=None).eval()
    model.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    del config["score_scale"], config["attention_kwargs"]["score_scale"]  # as an older qkv wrote it
    path.write_text(json.dumps(config))
    back = Reformer.from_pretrained(tmp_path / "old").eval()
    assert back.config.score_scale is None
    with torch.no_grad():
        torch.testing.assert_close(back(ids()).logits, model(ids()).logits)
    fresh = Reformer.from_config({"vocab_size": 11, "max_len": 48, "n_layers": 1, "d_model": 16, "n_heads": 2,
                                  "d_ff": 32})  # a new dict without the field: the preset's default
    assert fresh.config.score_scale == 1.0


def test_cli_train(tmp_path, shakespeare_cache, capsys, train_argv):
    run = tmp_path / "run"
    argv = train_argv("reformer", "shakespeare-char", run, "--set", "task.block_size=64", "--set", "n_layers=2",
                      "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--set", "bucket_size=8")
    assert main(argv) == 0
    assert main(["eval", str(run), "--max-examples", "4"]) == 0
    assert "bpc" in capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "10"]) == 0
