"""Suite-wide settings: one intra-op thread per test process. The suite runs under pytest-xdist
with one worker per core; more threads per worker only contend (tiny ops slow down 100x)."""

import torch

torch.set_num_threads(1)
