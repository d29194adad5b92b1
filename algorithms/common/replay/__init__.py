"""What is kept across iterations: ``trajectory_buffer`` (prioritized replay of trajectories) with its parts
``ring_buffer`` (trajectories in one token arena) and ``sum_tree`` (proportional sampling); its file is
:mod:`algorithms.common.saving.buffer_file`. In the data flow: filled after an update, drawn from in the next one
(:mod:`algorithms.grpo.replay`). The prompts a rollout draws are :mod:`algorithms.common.rollout.prompt_pool`'s."""
