"""The network a policy wraps: ``loading`` (built-in sizes, ``load_model``), ``lora`` (peft adapters, the
decoder's effective weights), ``gradient_checkpointing`` (every N decoder layers) and ``tokenizer_check`` (the env's
tokenizer and the model must speak one vocabulary). In the data flow: used once, when an algorithm builds its
``TransformerPolicy``."""
