"""``benchmarks/gpu_profile.py``: bad lengths are refused before anything runs (also without a GPU)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_profile.py"


def _main():
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("argv,named", [(["--patterns", "0"], "--patterns"), (["--length", "-5"], "--length"),
                                        (["--bert", "2"], "--bert")])
def test_bad_lengths_are_refused_naming_the_option(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        _main()(["--pairs", *argv])
    assert exit_.value.code == 2
    assert f"{named} takes lengths >= 4" in capsys.readouterr().err


def test_a_bad_pair_name_is_refused(capsys):
    with pytest.raises(SystemExit):
        _main()(["--pairs", "no-such-pair"])
    assert "invalid choice" in capsys.readouterr().err
