"""Fixtures shared by the transformer model tests."""

import inspect

import pytest

from qkv.registry import lookup


@pytest.fixture
def small_kernel_kwargs():
    """Small knobs for kernels whose constructor requires some (read from its signature; sizes for length 16)."""
    guesses = {"radius": 3, "block": 4, "memory": 4, "stride": 4, "c": 1, "bucket_size": 4, "seq_len": 16, "k": 8,
               "nb_features": 16, "max_span": 8, "mem_len": 8, "image_size": (4, 4), "head_dim": 8}

    def knobs(name):
        params = inspect.signature(lookup("attention", name).__init__).parameters
        return {k: v for k, v in guesses.items() if k in params and params[k].default is inspect.Parameter.empty}

    return knobs
