"""repro_rnn_attention.py --parts transformer-vs-rnn (issue 38): the page section the learning-rate
sweep writes, and the learning rates a larger budget (``--budgets``) trains at — from synthetic
results, no training."""

from __future__ import annotations

import json


def synthetic_results(script) -> dict:
    """A main-budget run as ``run_transformer_vs_rnn`` saves it: the sweep (seed 0), the choice, 3 seeds."""
    losses = {"transformer": (2.40, 2.20, 2.30), "rnn": (1.90, 1.70, 1.80)}
    sweep = {name: [{"lr": lr, "warmup": warmup, "train_seconds": 100.0, "valid_loss": loss,
                     "valid_token_accuracy": 0.5, "selected": loss == min(losses[name])}
                    for (lr, warmup), loss in zip(grid, losses[name])] for name, grid in script.TVR_GRID.items()}
    per_seed = {name: [{"seed": s, "lr": grid[1][0], "warmup": grid[1][1], "params": 1000, "chrf": chrf + s,
                        "bleu": 1.0, "char_accuracy": 0.1, "train_seconds": 100.0} for s in range(3)]
                for (name, grid), chrf in zip(script.TVR_GRID.items(), (10.0, 20.0))}
    return {"transformer-vs-rnn": {"steps": 1000, "batch_size": 32, "test_verses": 483, "valid_verses": 504,
                                   "per_seed": per_seed, "sweep": sweep,
                                   "selected": {name: {"lr": grid[1][0], "warmup": grid[1][1]}
                                                for name, grid in script.TVR_GRID.items()}}}


def test_sweep_section_replaces_the_marked_one_and_names_the_choice(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("repro_rnn_attention")
    page = tmp_path / "page.md"
    page.write_text("# t\n\nbefore\n\n<!-- transformer-vs-rnn -->\nold table\n<!-- /transformer-vs-rnn -->\n\nafter\n")
    monkeypatch.setattr(script, "DOC", page)
    script.write_transformer_vs_rnn_section(synthetic_results(script))
    text = page.read_text()
    assert "old table" not in text and text.count("<!-- transformer-vs-rnn -->") == 1
    assert text.index("before") < text.index("| Transformer | **0.002** | 100 | **2.200** |") < text.index("after")
    assert "| GRU + Bahdanau attention | **0.003** | 50 | **1.700** |" in text
    assert "edge of its grid" not in text  # both choices are the middle of their grids
    assert "+0.700 nats per character at the old recipe" in text and "+0.500 at the chosen rates" in text
    assert "**not reproduced**" in text  # chrF 11 vs 21


def test_a_larger_budget_trains_at_the_main_budgets_choice(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("repro_rnn_attention")
    monkeypatch.setattr(script, "OUT", tmp_path)
    results = synthetic_results(script)
    assert script.selected_lrs(results) == {"transformer": [2e-3, 100], "rnn": [3e-3, 50]}
    # a --budgets-only run (its own results file) reads the main run's file
    (tmp_path / "results-transformer-vs-rnn.json").write_text(json.dumps(results))
    assert script.selected_lrs({}) == {"transformer": [2e-3, 100], "rnn": [3e-3, 50]}
    (tmp_path / "results-transformer-vs-rnn.json").unlink()  # no sweep yet: the old recipe
    assert script.selected_lrs({}) == {"transformer": [1e-3, 50], "rnn": [3e-3, 50]}


def test_the_claim_compares_each_arm_at_its_chosen_lr(benchmark_script, monkeypatch):
    script = benchmark_script("repro_rnn_attention")
    recorded = {}
    monkeypatch.setattr(script.claims, "record", lambda **fields: recorded.update(fields))
    script.record_transformer_vs_rnn(synthetic_results(script)["transformer-vs-rnn"])
    assert recorded["id"] == "transformer-vs-rnn" and recorded.pop("measured") is True
    assert recorded["ours"] == [10.0, 11.0, 12.0] and recorded["baseline"] == [20.0, 21.0, 22.0]
    assert "504 validation verses" in recorded["budget"] and "Transformer 0.001, 0.002, 0.004" in recorded["budget"]
    assert "chosen lr: Transformer 0.002 (warm-up 100), recurrent 0.003 (warm-up 50)" in recorded["why"]
    assert script.claims.make_claim(**recorded)["verdict"] == "not reproduced"
