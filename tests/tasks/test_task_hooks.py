"""The hooks ``qkv train``/``viz``/``generate`` and the trainer call are declared on Task with
defaults that do nothing."""

from qkv.tasks.base import Task


class Bare(Task):
    kind = "lm"


def test_a_bare_task_has_every_hook_as_a_no_op(tmp_path):
    task = Bare()
    assert task.model_hints() == {}
    assert task.attention_view(object()) is None
    assert task.visualize(object(), tmp_path / "v.png") is None
    assert task.write_samples(object(), tmp_path / "s.png", n=2, seed=0, options={}) is None
    assert not list(tmp_path.iterdir())
    assert task.stream is False and task.input_key is None and task.variants == {}
