"""Attention as pooling: Nadaraya-Watson, Deep Sets and attention MIL, HAN, squeeze-excitation,
graph attention."""
