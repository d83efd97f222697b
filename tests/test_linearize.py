"""``qkv linearize`` (qkv/linearize.py): the swap keeps every pretrained weight, the transfer loss is
the per-layer MSE between the new kernel and softmax on the teacher's own hidden states, only the new
parameters learn, the LoRA stage saves its adapters merged, and the run is a qkv run (eval,
generate, resume, refusals)."""

import json

import pytest
import torch

from qkv import runs
from qkv.cli import main
from qkv.linearize import AttentionTransfer, LowRankFinetune, kernel_for, swap_attention
from qkv.models import BERT, Llama
from qkv._errors import UserError

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64, "vocab_size": 40, "max_len": 64}


def teacher_model(**extra):
    torch.manual_seed(0)
    return Llama.from_config({**TINY, **extra}).double()


def test_kernel_for_names_each_kernel_and_refuses_mixed_flags():
    assert kernel_for("linear") == ("linear", {"feature_map": "hedgehog"})
    assert kernel_for("linear", "elu") == ("linear", {"feature_map": "elu+1"})
    assert kernel_for("linear", "performer") == ("performer", {})
    assert kernel_for("linear", "hedgehog", 16) == ("linear-window", {"feature_map": "hedgehog", "window": 16})
    assert kernel_for("gla") == ("gla", {})
    with pytest.raises(UserError, match="--feature-map and --window belong to --attention linear"):
        kernel_for("gla", "hedgehog")
    with pytest.raises(UserError, match="--feature-map must be one of"):
        kernel_for("linear", "relu")
    with pytest.raises(UserError, match="--window must be an int >= 1"):
        kernel_for("linear", None, 0)


def test_swap_keeps_every_pretrained_weight_and_names_the_fresh_ones():
    teacher = teacher_model()
    student, fresh = swap_attention(teacher, "linear", {"feature_map": "hedgehog"}, seed=0)
    theirs = teacher.state_dict()
    for name, value in student.state_dict().items():
        if name in fresh:
            assert ".self_attn.kernel.feature_map." in name
        else:
            assert torch.equal(value, theirs[name]), name
    assert len(fresh) == 2 * 4  # (query, key) x (weight, bias) per layer
    assert student.stack.layers[0].self_attn.kernel.registry_name == "linear"
    _, gates = swap_attention(teacher, "gla", seed=0)
    assert gates and all(".self_attn.gates." in n for n in gates)


@pytest.mark.parametrize("attention, match", [("lsh", "shares queries and keys"), ("linformer", "cannot be causal")])
def test_swap_refuses_kernels_that_cannot_take_the_pretrained_qkv(attention, match):
    with pytest.raises(UserError, match=match):
        swap_attention(teacher_model(), attention)


def test_swap_refuses_sources_whose_attention_cannot_be_transferred():
    with pytest.raises(UserError, match="relative position bias|ALiBi"):
        swap_attention(teacher_model(positional="alibi"), "linear", {"feature_map": "hedgehog"})
    with pytest.raises(UserError, match="decoder-only"):
        swap_attention(BERT.from_config({"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "vocab_size": 30}),
                       "linear")
    with pytest.raises(UserError, match="transfers from softmax"):
        swap_attention(teacher_model(attention="linear"), "gla")


def captured_qkv(model, ids):
    """Each layer's kernel inputs ``(q, k, v)`` when ``model`` (the teacher) reads ``ids``."""
    seen = []
    hooks = [block.self_attn.kernel.register_forward_hook(lambda m, args, out: seen.append(args[:3]))
             for block in model.stack.layers]
    model(ids)
    for h in hooks:
        h.remove()
    return seen


def test_transfer_loss_is_the_mean_per_layer_mse_on_the_teachers_hidden_states():
    teacher = teacher_model()
    student, fresh = swap_attention(teacher, "linear", {"feature_map": "hedgehog"}, seed=1)
    with torch.no_grad():  # a map away from the identity, so that the layers differ
        for p in student.parameters():
            if p.requires_grad and p.dim() == 3:
                p.add_(0.2 * torch.randn_like(p))
    objective = AttentionTransfer(student, teacher, fresh).train()
    ids = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(0))
    loss = objective(ids).loss
    expected = []
    for layer, (q, k, v) in enumerate(captured_qkv(teacher, ids)):  # the teacher's own q, k, v at every layer
        kernel = student.stack.layers[layer].self_attn.kernel
        k_rep, v_rep = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # hedgehog: keys per query head
        mine = kernel(q, k_rep, v_rep).output
        target = teacher.stack.layers[layer].self_attn.kernel(q, k, v).output
        expected.append(((mine - target) ** 2).mean())
    torch.testing.assert_close(loss, torch.stack(expected).mean())
    loss.backward()
    for name, p in objective.model.named_parameters():
        assert (p.grad is not None) == (name in fresh), name
    # evaluation: the linearized model alone, its language-model loss
    objective.eval()
    torch.testing.assert_close(objective(ids, labels=ids).loss, student(ids, labels=ids).loss)


def test_transfer_training_lowers_the_loss_of_gated_kernels_too():
    teacher = teacher_model()
    student, fresh = swap_attention(teacher, "gla", seed=0)
    objective = AttentionTransfer(student, teacher, fresh).train()
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam([p for p in objective.parameters() if p.requires_grad], lr=3e-2)
    first = float(objective(ids).loss.detach())
    for _ in range(30):
        opt.zero_grad()
        objective(ids).loss.backward()
        opt.step()
    assert float(objective(ids).loss.detach()) < 0.7 * first


def test_lora_stage_saves_its_adapters_merged(tmp_path):
    model = teacher_model(attention="linear", attention_kwargs={"feature_map": "hedgehog"})
    objective = LowRankFinetune(model, rank=2, alpha=4.0)
    trainable = {n for n, p in objective.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for name, p in objective.named_parameters():
            if "lora_B" in name:
                p.normal_()
    ids = torch.randint(0, 40, (2, 9))
    adapted = objective(ids).logits
    assert not torch.allclose(adapted, model.__class__.from_config(model.config).double()(ids).logits)
    objective.save_pretrained(tmp_path / "m")
    reloaded = Llama.from_pretrained(tmp_path / "m").double()
    torch.testing.assert_close(reloaded(ids).logits, adapted)
    assert all(type(b.self_attn.q_proj) is torch.nn.Linear for b in reloaded.stack.layers)


@pytest.fixture
def source_run(shakespeare_cache, train_argv):
    out = shakespeare_cache / "src"
    sets = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=4", "--set", "n_kv_heads=2",
            "--set", "d_ff=64", "--set", "task.block_size=16"]
    assert main(train_argv("llama", "shakespeare-char", out, *sets)) == 0
    return out


def linearize_argv(source, out, *extra):
    return ["linearize", str(source), "--task", "shakespeare-char", "--out", str(out), "--steps", "2",
            "--batch-size", "2", "--set", "task.block_size=16", "--set", "train.eval_batches=1",
            "--set", "train.eval_max_examples=4", "--set", "train.progress=false", "--set", "train.tensorboard=false",
            "--threads", "1", *extra]


def test_linearize_command_writes_a_run_that_eval_and_generate_read(source_run, shakespeare_cache, capsys):
    out = shakespeare_cache / "lin"
    window = ["--window", "4"] if _has_linear_window() else []
    assert main(linearize_argv(source_run, out, *window, "--finetune-steps", "2", "--lora-rank", "2")) == 0
    record = json.loads((out / "linearize.json").read_text())
    assert record["final"] == "finetune" and set(record["stages"]) == {"transfer", "finetune"}
    for stage in record["stages"].values():
        assert stage["tokens"] == 2 * 2 * 16 and stage["cpu_seconds"] > 0 and stage["trainable_parameters"] > 0
    run = runs.load(out)
    assert run.directory == out / "finetune"
    kernel = run.model.stack.layers[0].self_attn.kernel
    assert kernel.registry_name in ("linear", "linear-window")
    # the transfer stage's feature maps are the ones the final model keeps (the fine-tune freezes them)
    transferred = runs.load(out / "transfer").model
    for (name, mine), theirs in zip(run.model.state_dict().items(), transferred.state_dict().values()):
        if ".kernel." in name:
            assert torch.equal(mine, theirs), name
    capsys.readouterr()
    assert main(["eval", str(out), "--max-examples", "4", "--threads", "1"]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert main(["generate", str(out), "--prompt", "To be", "--max-new-tokens", "5", "--threads", "1"]) == 0


def _has_linear_window():
    from qkv.registry import names

    return "linear-window" in names("attention")


def test_linearize_resume_continues_and_refuses_other_arguments(source_run, shakespeare_cache, capsys):
    out = shakespeare_cache / "lin"
    assert main(linearize_argv(source_run, out)) == 0
    before = (out / "transfer" / "model" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(linearize_argv(source_run, out)) == 2
    assert "holds a linearization already" in capsys.readouterr().err
    assert main(linearize_argv(source_run, out, "--lr", "0.5", "--resume")) == 2
    assert "other lr" in capsys.readouterr().err
    assert main(linearize_argv(source_run, out, "--resume")) == 0  # finished: nothing changes
    assert (out / "transfer" / "model" / "model.safetensors").read_bytes() == before
    assert main(linearize_argv(source_run, shakespeare_cache / "other", "--attention", "lsh")) == 2
    assert "shares queries and keys" in capsys.readouterr().err
    assert not (shakespeare_cache / "other" / "linearize.json").exists()


def test_linearize_killed_then_resumed_equals_one_uninterrupted_run(source_run, shakespeare_cache):
    """kill -9 during the transfer stage (after its second checkpoint), then --resume: the same
    transferred weights as a run that was never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # enough steps that the stage is still training when its second checkpoint appears (a tiny model's step takes ms)
    steps = ["--steps", "300", "--set", "train.save_every=2", "--set", "train.eval_every=1000", "--window", "4"]
    killed, whole = shakespeare_cache / "killed", shakespeare_cache / "whole"
    env = {**os.environ, "PYTHONPATH": str(runs.__file__).rsplit("/qkv/", 1)[0], "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "qkv", *linearize_argv(source_run, killed, *steps)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        checkpoints = killed / "transfer" / "checkpoints"
        while len(list(checkpoints.glob("step-*.safetensors"))) < 2 and time.monotonic() < deadline:
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(30)
    assert not (killed / "transfer" / "model").exists()  # killed before the stage's end
    assert main(linearize_argv(source_run, killed, *steps, "--resume")) == 0
    assert main(linearize_argv(source_run, whole, *steps)) == 0
    mine = runs.load(killed).model.state_dict()
    theirs = runs.load(whole).model.state_dict()
    for name, value in theirs.items():
        assert torch.equal(mine[name], value), name


def test_a_kernel_with_nothing_to_learn_trains_nothing_and_says_so(source_run, shakespeare_cache, capsys):
    """Performer's features are a buffer, not a parameter: the transfer stage trains nothing and its
    record says 0 steps and 0 tokens (not the steps asked), and the saved model is the bare swap."""
    out = shakespeare_cache / "perf"
    assert main(linearize_argv(source_run, out, "--feature-map", "performer")) == 0
    assert "has no parameters of its own" in capsys.readouterr().err
    stage = json.loads((out / "linearize.json").read_text())["stages"]["transfer"]
    assert (stage["steps"], stage["tokens"], stage["trainable_parameters"]) == (0, 0, 0)
    assert runs.load(out).model.stack.layers[0].self_attn.kernel.registry_name == "performer"


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--window", "0"], ["--feature-map", "relu"],
                                 ["--finetune-steps", "-1"], ["--lora-rank", "0"], ["--set", "d_model=8"]])
def test_bad_options_are_refused_before_any_work(bad, shakespeare_cache, capsys):
    out = shakespeare_cache / "never"
    with pytest.raises(SystemExit) if bad[0] != "--set" else _no_raise():
        code = main(["linearize", str(shakespeare_cache / "no-such-source"), "--task", "shakespeare-char",
                     "--out", str(out), *bad])
        assert code == 2 and "only task.* and train.* settings" in capsys.readouterr().err
    assert not out.exists()


def _no_raise():
    import contextlib

    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- damaged directories


@pytest.mark.parametrize("damage", [b"\xff{not json", b"[]", b'{"source": 1', b"[" * 100000])
def test_a_corrupt_record_is_refused_by_resume_and_by_its_readers(damage, source_run, shakespeare_cache, capsys):
    """A damaged ``linearize.json`` (not UTF-8, not an object, cut short, nested too deeply): ``--resume``,
    ``qkv eval`` and ``runs.load`` each refuse it in one line naming the file, and nothing in the
    directory changes."""
    out = shakespeare_cache / "lin"
    assert main(linearize_argv(source_run, out)) == 0
    record = out / "linearize.json"
    record.write_bytes(damage)
    before = _snapshot(out)
    capsys.readouterr()
    assert main(linearize_argv(source_run, out, "--resume")) == 2
    err = capsys.readouterr().err
    assert "linearize.json" in err and "corrupt" in err and "Traceback" not in err
    assert main(["eval", str(out), "--max-examples", "4", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "linearize.json" in err and "corrupt" in err and "Traceback" not in err
    with pytest.raises(UserError, match="corrupt"):
        runs.load(out)
    assert _snapshot(out) == before


def test_a_damaged_stage_is_refused_with_its_path(source_run, shakespeare_cache, capsys):
    """A finished transfer stage whose weights were cut short: resuming into the fine-tune names the
    file rather than failing inside safetensors, and writes no fine-tune stage."""
    out = shakespeare_cache / "lin"
    assert main(linearize_argv(source_run, out)) == 0
    weights = out / "transfer" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    record = json.loads((out / "linearize.json").read_text())
    capsys.readouterr()
    # the same arguments with a fine-tune asked for differ from the record: a new directory is needed
    assert main(linearize_argv(source_run, out, "--finetune-steps", "2", "--resume")) == 2
    assert "other finetune_steps" in capsys.readouterr().err
    assert main(["eval", str(out), "--max-examples", "4", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "Traceback" not in err
    assert json.loads((out / "linearize.json").read_text()) == record
    assert not (out / "finetune").exists()


def _snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_task_of_another_vocabulary_is_refused_naming_the_source(source_run, shakespeare_cache, capsys):
    out = shakespeare_cache / "never"
    argv = ["linearize", str(source_run), "--task", "mqar", "--out", str(out), "--steps", "2", "--threads", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"SOURCE {source_run}" in err and "--init" not in err and "vocabulary" in err
    assert not out.exists()
