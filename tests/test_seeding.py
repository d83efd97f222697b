"""qkv._seeding.stable_seed: the same seed in every process (str hashing is salted per process)."""

import os
import subprocess
import sys

from qkv._seeding import stable_seed


def test_stable_seed_is_the_same_in_another_process_and_fits_63_bits():
    parts = ("shakespeare-char", 3, "train", 7)
    here = stable_seed(*parts)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run([sys.executable, "-c", f"from qkv._seeding import stable_seed; print(stable_seed(*{parts!r}))"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert int(there) == here
    assert 0 <= here < 2**63
    assert stable_seed(*parts[:-1], 8) != here
