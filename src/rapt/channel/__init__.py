"""The channel model: public text privatized into (clean, private) pairs (``corpus``), and the two
models trained on them: the contextual denoiser and the channel adapter."""
