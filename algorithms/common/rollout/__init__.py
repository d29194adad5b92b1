"""What a rollout draws, collects and hands the update, in that order: ``sampling`` (what a rollout samples: the
object ``collect_rollouts`` calls at its fixed points), ``seeds`` (the job-wide problem stream and sampler noise),
``prompt_pool`` (the problems drawn by learnability instead of the stream), ``env_steps`` (stepping only the envs
whose multi-turn episodes still play; scoring the first turns ahead), ``rows`` (one row per completion, episode
returns, the rollout logs) and ``batch`` (``RolloutBatch``, the tensors of the rows kept, padding, minibatches). In
the data flow: ``RolloutCollector.collect`` fills ``Rows``; the algorithm's ``_build_batch`` turns them into
the ``RolloutBatch`` its update trains on (``rows_to_batch``)."""
