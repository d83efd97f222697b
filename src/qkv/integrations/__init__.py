"""The old home of qkv's Hugging Face code, now ``qkv.hf``: ``qkv.integrations.huggingface`` is
``qkv.hf.attention``, ``qkv.integrations.pretrained`` is ``qkv.hf.pretrained`` and
``qkv.integrations.export`` is ``qkv.hf.export`` — the same module objects, so that code written
against the old paths keeps working."""
