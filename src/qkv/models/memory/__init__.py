"""Attention over an external memory: end-to-end memory networks, stacked attention, the NTM."""
