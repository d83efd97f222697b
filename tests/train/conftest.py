"""Make the toy model/task module importable and give tests a helper to run it as a script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def script_env() -> dict:
    """Environment for a subprocess running ``_toy_train.py``: qkv and the toy module importable,
    one thread, no distributed variables inherited."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env
