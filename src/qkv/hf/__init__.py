"""qkv meets transformers (Hugging Face), in one place:

- ``checkpoints``: Hugging Face BERT and GPT-2 checkpoints in and out of qkv's ``BERT`` and ``GPT``
  (``QKVModel.from_pretrained(dir)``, ``save_pretrained(dir, format="huggingface")``);
- ``llama``: Llama, Mistral, Qwen2 and Qwen3 checkpoints in and out of qkv's ``Llama`` (a family of ``checkpoints``);
- ``attention``: qkv's kernels inside any transformers model, as ``attn_implementation="qkv-<kernel>"``;
- ``pretrained``: a run started from a pretrained checkpoint (``qkv train ... --init DIR``);
- ``tokenizer``: a run's vocabulary as a ``tokenizers`` tokenizer, and the files a pipeline needs
  beside a checkpoint (written by ``save_pretrained(format="huggingface")`` for a run's model);
- ``export``: a finished run as a folder transformers' pipelines load (``qkv export``);
- ``gguf``: llama.cpp's GGUF files read as transformers Llama checkpoints (``qkv data fetch smollm2``);
- ``delta_rule``: qkv's gated delta rule and KDA in transformers' Qwen3-Next and Kimi Linear layers
  (``attention.register()`` patches; ``qwen3_next`` is its Qwen3-Next row under its old names).

It sits on the top floor with the other faces (``runs``, ``cli``): ``export`` reads runs, and
``checkpoints`` builds qkv's models; ``QKVModel.from_pretrained`` finds the checkpoint format in
``models.base.CHECKPOINT_FORMATS``, where importing ``qkv`` registers it — the models floor imports
nothing from here. Importing this package imports no other library (transformers, safetensors and
tokenizers are imported when used). The old paths ``qkv.integrations.huggingface``,
``.pretrained`` and ``.export`` name these same modules.
"""

from . import checkpoints  # noqa: F401  (registers the "huggingface" checkpoint format)
from . import gguf  # noqa: F401  (registers the conversion `qkv data fetch smollm2` ends with)
from . import llama  # noqa: F401  (registers the Llama family: llama, mistral, qwen2, qwen3)
