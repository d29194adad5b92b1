"""The network a policy wraps: ``loading`` (built-in sizes, ``load_model``), ``lora`` (peft adapters, the
decoder's effective weights), ``gradient_checkpointing`` (the decoder's layers, checkpointed every N),
``tokenizer_check`` (the env's tokenizer and the model must speak one vocabulary) and ``reference`` (the frozen
reference: a copy, or with LoRA the base model). In the data flow: used when an algorithm builds its
``TransformerPolicy`` and its reference."""
