"""``qkv bench models``: qkv's GPT and BERT against transformers' with the same weights (tiny sizes,
no timed asserts): the pairs agree before timing, and a pair that disagrees is refused."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from qkv._errors import UserError  # noqa: E402
from qkv.bench import main, models  # noqa: E402
from qkv.tasks.bbc import is_bbc_cached  # noqa: E402
from qkv.tasks.data import is_cached  # noqa: E402


def test_quick_run_writes_every_pair(tmp_path):
    out = tmp_path / "models"
    assert main(["models", "--quick", "--lengths", "16", "--threads", "1", "--out", str(out)]) == 0
    results = json.loads((out / "models.json").read_text())
    rows = {r["pair"]: r for r in results["rows"]}
    assert set(rows) == set(models.DEFAULT_PAIRS)
    for r in rows.values():
        assert r["length"] == 16 and r["qkv_s"] > 0 and r["peer_s"] > 0
        assert r["max_abs_diff"] < 1e-4
    assert "qkv / transformers" in (out / "models.md").read_text()


def test_a_pair_that_disagrees_is_not_timed(monkeypatch, tmp_path):
    original = models.build_pair

    def broken(kind, *args, **kwargs):
        ours, theirs = original(kind, *args, **kwargs)
        with torch.no_grad():
            for p in ours.parameters():  # qkv's copy of the weights is no longer transformers'
                p.add_(0.1 * torch.randn_like(p))
        return ours, theirs

    monkeypatch.setattr(models, "build_pair", broken)
    # a disagreement is a bug in qkv (or in the weight copy), not the user's: it keeps its traceback
    with pytest.raises(ValueError, match="disagree") as raised:
        main(["models", "--quick", "--pairs", "bert-forward", "--lengths", "16", "--out", str(tmp_path)])
    assert not isinstance(raised.value, UserError)


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["models", "--quick", "--d-model", "30", "--heads", "4", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["models", "--quick", "--lengths", "1", "--out", str(tmp_path)])


def test_no_onednn_is_recorded_and_the_setting_restored(tmp_path, monkeypatch):
    seen = []
    original = models._bert_cases

    def spy(*args, **kwargs):
        seen.append(torch.backends.mkldnn.enabled)
        return original(*args, **kwargs)

    monkeypatch.setattr(models, "_bert_cases", spy)
    before = torch.backends.mkldnn.enabled
    out = tmp_path / "models"
    assert main(["models", "--quick", "--pairs", "bert-forward", "--lengths", "16", "--no-onednn", "--out", str(out)]) == 0
    assert seen == [False] and torch.backends.mkldnn.enabled == before
    results = json.loads((out / "models.json").read_text())
    assert results["config"]["onednn"] is False
    assert "off (F.linear on both sides)" in (out / "models.md").read_text()


@pytest.mark.skipif(not (is_cached("minilm") and is_bbc_cached()), reason="needs qkv data fetch minilm bbc")
def test_minilm_embeddings_pair_compares_real_sentence_embeddings(tmp_path):
    """Issue 36's measurement: MiniLM sentence embeddings (mean-pooled, real BBC text) against
    transformers' sdpa, the same numbers checked before timing."""
    out = tmp_path / "bench"
    assert main(["models", "--quick", "--pairs", "minilm-embed", "--lengths", "32", "--threads", "1", "--out", str(out)]) == 0
    (row,) = json.loads((out / "models.json").read_text())["rows"]
    assert row["pair"] == "minilm-embed" and row["length"] == 32 and row["max_abs_diff"] < 1e-4
    assert row["qkv_s"] > 0 and row["peer_s"] > 0


def test_window_nll_is_the_sum_over_windows_of_next_token_losses():
    torch.manual_seed(0)
    table = torch.randn(7, 7)  # a bigram model: the logits of the next token are a row of the table

    def logits_of(ids):
        return table[ids]

    ids = torch.randint(7, (12,))
    nll, count = models.window_nll(logits_of, ids, 5)  # windows [0, 5), [5, 10), [10, 11): 11 predictions
    expected = sum(-torch.log_softmax(table[ids[t]], -1)[ids[t + 1]].item() for t in range(11))
    assert count == 11 and abs(nll - expected) < 1e-4
    with pytest.raises(ValueError, match="1-D stream of at least 2 tokens"):
        models.window_nll(logits_of, ids[:1], 5)
    with pytest.raises(ValueError, match="text must be one of"):
        models.heldout_text("enwiki")


def test_smollm2_pairs_without_the_checkpoint_say_what_to_fetch(tmp_path, monkeypatch, capsys):
    from qkv.tasks import data

    def missing(cache_dir=None):
        raise FileNotFoundError("run `qkv data fetch smollm2` first")

    monkeypatch.setattr(data, "smollm2_dir", missing)
    with pytest.raises(SystemExit):
        main(["models", "--quick", "--pairs", "smollm2-decode", "--out", str(tmp_path)])
    assert "--pairs smollm2-*: run `qkv data fetch smollm2` first" in capsys.readouterr().err
