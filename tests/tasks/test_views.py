"""Every non-text task labels its models' attention with what the input really was (``qkv viz``).

Tiny untrained models: the test is about what the panels hold and how they are labelled, not
about what the models learned.
"""

import pytest
import torch

from qkv.models.memory.memnet import EndToEndMemoryNetwork, MemoryNetworkConfig
from qkv.models.memory.ntm import LSTMBaseline, LSTMBaselineConfig, NeuralTuringMachine, NTMConfig
from qkv.models.pooling.graph_attention import GATConfig, GraphAttention
from qkv.models.pooling.nadaraya_watson import NadarayaWatson, NadarayaWatsonConfig
from qkv.tasks.babi import BabiSingle
from qkv.tasks.graphs import KarateClub
from qkv.tasks.ntm_copy import NTMCopy
from qkv.tasks.regression import NWRegression
from qkv.viz_html import render_html


def test_nadaraya_watson_weights_are_labelled_by_the_training_points():
    task = NWRegression(n_train=20, n_test=10)
    model = NadarayaWatson(NadarayaWatsonConfig())
    view = task.attention_view(model)
    (name, w), = view.panels
    assert w.shape == (10, 20)
    assert torch.allclose(w.sum(-1), torch.ones(10), atol=1e-5)
    assert view.x_labels == [f"{v:.2f}" for v in task.x_train.tolist()]
    assert len(view.y_labels) == 10


def test_memory_network_hops_are_labelled_by_the_story_sentences():
    task = BabiSingle(n_train=50, n_valid=10, n_test=10)
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=task.vocab.size, d_model=16, n_hops=3,
                                                      max_sentences=task.max_sentences))
    view = task.attention_view(model, text="2")
    sentences, question, answer, support = task.stories["test"][2]
    (name, w), = view.panels
    assert w.shape == (3, len(sentences))
    assert [x.lstrip("* ") for x in view.x_labels] == list(sentences)
    assert [x.startswith("* ") for x in view.x_labels] == [i in support for i in range(len(sentences))]
    assert question in view.caption and answer in view.caption
    assert torch.allclose(w.sum(-1), torch.ones(3), atol=1e-5)
    with pytest.raises(ValueError, match="test story of this task by its index"):
        task.attention_view(model, text="999999")


def test_ntm_weightings_over_time_and_lstm_has_none():
    task = NTMCopy(width=4, max_len=5)
    model = NeuralTuringMachine(NTMConfig(input_dim=5, output_dim=4, memory_slots=16, memory_width=8, controller_size=16))
    view = task.attention_view(model, text="3")
    names = [n for n, _ in view.panels]
    assert names[0] == "write weighting" and names[1].startswith("read weighting")
    T = 2 * 3 + 1
    assert view.panels[0][1].shape == (T, 16)
    assert view.y_labels[:4] == ["in 1", "in 2", "in 3", "delim"] and view.y_labels[-1] == "out 3"
    lstm = LSTMBaseline(LSTMBaselineConfig(input_dim=5, output_dim=4, hidden_size=8))
    with pytest.raises(ValueError, match="forms no attention weights"):
        task.attention_view(lstm)


def test_gat_edge_weights_sit_on_the_graph():
    task = KarateClub()
    model = GraphAttention(GATConfig(in_dim=34, n_classes=2, hidden_dim=4, n_heads=2))
    view = task.attention_view(model)
    assert [n for n, _ in view.panels] == ["layer 0 H0", "layer 0 H1", "layer 1 H0"]
    adjacency = torch.eye(34, dtype=torch.bool)
    src, dst = task.edge_index
    adjacency[dst, src] = True
    for _, w in view.panels:
        assert w.shape == (34, 34)
        assert not bool(w[~adjacency].any())  # no weight off the graph (self-loops included)
        assert torch.allclose(w.sum(-1), torch.ones(34), atol=1e-5)  # softmax over each node's neighbours
    assert view.x_labels[0] == "0 (0)" and view.x_labels[33] == "33 (1)"
    assert "layer 0" in render_html([("gat", view)])


def test_pointer_distributions_are_labelled_by_the_inputs():
    from qkv.models.rnn.pointer import PointerNetwork, PointerNetworkConfig
    from qkv.tasks.pointer_tasks import PointerSortTask

    task = PointerSortTask(min_len=4, max_len=5, eval_size=8)
    model = PointerNetwork(PointerNetworkConfig(d_input=1, d_embed=8, d_hidden=8, attn_dim=8))
    view = task.attention_view(model, text="0.3 0.9 0.1")
    (name, w), = view.panels
    assert view.x_labels == ["0: 0.30", "1: 0.90", "2: 0.10", "END"]
    assert w.shape[1] == 4 and torch.allclose(w.sum(-1), torch.ones(w.shape[0]), atol=1e-5)
    assert len(view.y_labels) == w.shape[0] and "target [2, 0, 1]" in view.caption


def test_a_story_index_that_is_not_a_number_names_text():
    task = BabiSingle(n_train=20, n_valid=5, n_test=5)
    with pytest.raises(ValueError, match=r"--text picks a test story .* got 'mary went'"):
        task.attention_view(None, text="mary went")


def test_text_index_names_text_and_the_range():
    from qkv.tasks.views import text_index

    assert text_index(None, 5, "bag", default=2) == 2 and text_index("4", 5, "bag") == 4
    for bad in ("x", "5", "-1", "1.5"):
        with pytest.raises(ValueError, match=r"--text picks a test bag .* \[0, 5\)"):
            text_index(bad, 5, "bag")
