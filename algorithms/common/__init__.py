"""What every language-model algorithm shares; imports nothing from an algorithm folder.

At the top, the pieces an algorithm is made of, in the order an iteration uses them: ``base_class``
(``LMBaseAlgorithm``: construction, policy, reference, run state, save/load), ``lm_algorithm`` (``LMAlgorithm``:
the learn loop and rollout collection), ``policies`` (``TransformerPolicy``), ``cold_start`` (the SFT stage),
``losses`` (the loss terms), ``evaluation`` (held-out success), ``arguments`` / ``hyperparams`` / ``schedules``
(constructor rules, zoo presets, schedules), ``callbacks`` (the curriculum) and ``env_util`` (making and checking
envs). The rooms below hold the rest, each named for what it holds:

- ``rollout/``: what a rollout collects (rows, returns, the batch) and its seeds;
- ``generation/``: sampling completions (the sampler, KV-cache decoders, the packed layout);
- ``model/``: the network (loading, LoRA, gradient checkpointing, the tokenizer check);
- ``runtime/``: how a run uses its devices and processes (precision, distributed, determinism);
- ``replay/``: what is kept across iterations (the trajectory buffer and its file, ring, sum tree, prompt pool);
- ``saving/``: files (the model file, a run's contents, checkpoints, atomic writes).
"""
