"""qkv inside other libraries: ``qkv.integrations.huggingface`` makes qkv's kernels selectable as
transformers' ``attn_implementation``. Importing this package imports no other library."""
