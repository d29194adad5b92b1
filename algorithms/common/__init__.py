"""What every language-model algorithm shares; imports nothing from an algorithm folder.

At the top, the pieces an algorithm is made of, in the order an iteration uses them: ``base_class``
(``LMBaseAlgorithm``: construction, policy, reference, run state, save/load, the steps every algorithm's ``learn``
shares and the loop, ``learn``, written once, the public face the saving code and the command line read; an
algorithm adds its ``_build_batch`` and ``train``), the parts it owns:
``rollout_collection`` (``RolloutCollector``: one rollout's collection) and ``overlapped_learning``
(``OverlappedLoop``: the loop of ``max_staleness >= 1``), ``policies``
(``TransformerPolicy``), ``cold_start`` (the SFT stage), ``losses`` (the loss terms), ``sampler_correction`` (the
sampler/trainer mismatch corrected), ``evaluation`` (held-out
success), ``arguments`` / ``hyperparams`` / ``schedules`` (the shared constructor arguments, declared once; zoo
presets; schedules), ``trl_names`` (TRL's names and ours), ``callbacks`` (the curriculum) and ``env_util`` (making
and checking envs, stepping some of them alone). The rooms below hold the rest, each named for what it holds:

- ``rollout/``: what a rollout draws, collects and hands the update (prompt pool, later turns, rows, batch, the
  weight versions of ``max_staleness``);
- ``generation/``: sampling completions (the sampler, KV-cache decoders, the packed layout);
- ``model/``: the network (loading, LoRA, gradient checkpointing, the tokenizer check, the frozen reference, the
  finite-state check);
- ``runtime/``: how a run uses its devices and processes (precision, distributed, sharding, determinism, the
  job-wide seeds);
- ``replay/``: what is kept across iterations (the trajectory buffer, its ring and sum tree);
- ``saving/``: files, behind the algorithm's public face (the model file, a run's contents, plain and sharded
  checkpoints, the replay buffer's file, the one atomic-write helper).
"""
