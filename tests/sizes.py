"""Sizes the tests share: a 1-layer, 32-wide built-in model (fast enough for many short runs on 2 cores)
and a small env (compact template, 256-token window, 24-token completions, the easiest arithmetic)."""

TINY_KWARGS = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
TINY = {"model": "tiny", "model_kwargs": TINY_KWARGS}
ENV_KWARGS = {"template": "compact", "max_new_tokens": 24, "context_length": 256, "difficulty": 0.1}
