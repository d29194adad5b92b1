"""What a rollout draws, collects and hands the update, beside :mod:`algorithms.common.rollout_collection` (which
plays the episodes): ``prompt_pool`` (the problems drawn by learnability instead of the stream), ``turns`` (the later
turns of multi-turn episodes), ``staleness`` (the weight versions of ``max_staleness``), ``rows`` (one row per
completion, episode returns, the rollout logs) and ``batch`` (``RolloutBatch``, the tensors of the rows kept,
padding, minibatches). In the data flow: ``RolloutCollector.collect`` fills ``Rows``; the algorithm's
``_build_batch`` turns them into the ``RolloutBatch`` its update trains on (``rows_to_batch``)."""
