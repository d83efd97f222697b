"""The Transformer family: one shared stack (``stack.py``) and every preset built on it."""
