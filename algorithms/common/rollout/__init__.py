"""What a rollout collects and how it becomes tensors: ``rows`` (one row per completion, episode returns, the rollout
logs), ``batch`` (``RolloutBatch``, padding, minibatches), ``seeds`` (the job-wide problem stream and sampler
noise) and ``env_steps`` (stepping only the envs whose multi-turn episodes still play). In the data flow:
``LMAlgorithm.collect_rollouts`` fills ``Rows``; the algorithm's ``_build_batch`` turns them into the
``RolloutBatch`` its update trains on."""
