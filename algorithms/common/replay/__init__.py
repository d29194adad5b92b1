"""What is kept across iterations: ``trajectory_buffer`` (prioritized replay of trajectories, S3/S5) with its
file (``buffer_file``), its parts ``ring_buffer`` (trajectories in one token arena) and ``sum_tree`` (proportional
sampling), and ``prompt_pool`` (recent problems drawn by learnability). In the data flow: filled after an update,
drawn from before the next (the prompt pool: before a rollout)."""
