"""Rollout engines behind one seam (:mod:`.base`): prompt ids in, completion ids and their log-probs out,
``update_weights`` after each update. ``"builtin"`` (no engine object: the policy's own KV-cache sampler), ``"hf"``
(:mod:`.hf`: Hugging Face ``generate``), ``"vllm"`` colocated (:mod:`.vllm_colocate`: ``vllm.LLM`` in the training
process) or served (:mod:`.vllm_server`: a vLLM OpenAI server on a host:port, which :mod:`.vllm_launcher` starts);
:mod:`.vllm_folder` writes the model folder vLLM loads. :mod:`.setup` builds the engine an algorithm's arguments
(:mod:`.arguments`) name. vLLM is imported only by the vLLM engines, when one is built."""
