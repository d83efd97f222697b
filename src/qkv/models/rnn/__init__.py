"""RNN-era attention models: sequence-to-sequence (Bahdanau, Luong), Show, Attend and Tell,
pointer networks and the LSTMN."""
