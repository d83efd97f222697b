"""Long Range Arena's tasks at small scale (Tay et al. 2020, "Long Range Arena: A Benchmark for
Efficient Transformers", arXiv:2011.04006, §2.2), for ``qkv bench lra``.

Two of LRA's five tasks are generated here as the papers describe them; the other three are
**stand-ins**, because LRA's data (IMDb, the ACL Anthology Network, CIFAR-10) cannot be had from
the package registries this project reads its data from (``shared/data.md``):

=====================  ============================  =============================================
qkv task               LRA task                      what it is
=====================  ============================  =============================================
``listops``            ListOps                       LRA's generator: nested MAX/MIN/MED/SM over
                                                     digits, 500-2,000 tokens, 10 classes
``pathfinder``         Pathfinder (32x32)            Linsley et al. 2018's generator, written from
                                                     the paper: are the two dots connected?
``bbc-bytes``          Text (IMDb bytes)             **stand-in**: BBC News topic (5 classes) from
                                                     the article's first 4,096 bytes
``fashion-mnist-seq``  Image (CIFAR-10 grey pixels)  **stand-in**: Fashion-MNIST as a sequence of
                                                     pixel intensities (10 classes)
``bbc-match``          Retrieval (AAN citations)     **stand-in**: do two BBC articles (bytes)
                                                     share a category? (two towers, 2 classes)
=====================  ============================  =============================================

Every task here is ``kind == "classification"``: batches hold ``input_ids (B, L)`` long tokens,
``labels (B,)`` long and, where inputs have different lengths, ``attention_mask (B, L)`` bool
(True = real token); ``bbc-match`` adds the second passage as ``input_ids_2`` /
``attention_mask_2``. Every batch is padded to the task's full length ``max_len`` (LRA pads to
its maximum length too), so that every model of a task sees the same shapes — and a length-bound
kernel (Linformer's ``seq_len``) fits all of them. A training batch is a pure function of
``(seed, split, step, rank, world_size)`` (docs/contracts.md); the held-out sets are fixed.
Metrics: ``accuracy``, ``loss`` (cross-entropy, nats), ``examples``.
"""

from qkv.tasks.lra.base import LRATask
from qkv.tasks.lra.listops import OPERATORS, ListOps, listops_expression, listops_value
from qkv.tasks.lra.pathfinder import Pathfinder, PathfinderImage, pathfinder_image
from qkv.tasks.lra.bbc_bytes import BBCBytes, BBCMatch
from qkv.tasks.lra.fashion_mnist import FashionMnistSequence

__all__ = [
    "LRATask", "ListOps", "Pathfinder", "BBCBytes", "FashionMnistSequence", "BBCMatch",
    "OPERATORS", "listops_expression", "listops_value", "PathfinderImage", "pathfinder_image",
]
