"""What a rollout collects and how it becomes tensors: ``rows`` (one row per completion, episode returns, the rollout
logs), ``batch`` (``RolloutBatch``, padding, minibatches) and ``seeds`` (the job-wide problem stream and sampler
noise). In the data flow: ``LMAlgorithm.collect_rollouts`` fills ``Rows``; the algorithm's ``_build_batch`` turns
them into the ``RolloutBatch`` its update trains on."""
