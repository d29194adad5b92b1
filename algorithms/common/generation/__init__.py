"""Sampling completions and scoring given ones: ``sampler`` (batched sampling with a KV cache, log-probs of given
completions), ``decoders`` (the KV-cache decoders: a Llama-family fast path and any model's own forward) and
``packing`` (the padding-free, prefix-shared layout of the update's forward pass). In the data flow: rollouts
sample here (``TransformerPolicy.generate``); the update's log-probs are computed here (``log_probs``)."""
