"""How a run uses its devices and processes: ``precision`` (autocast per stage, and what
``mixed_precision="auto"`` picks on each device), ``distributed`` (ranks, gathers, gradient sync), ``sharding``
(FSDP2: sharding a model, whole state dicts), ``parallel`` (what an algorithm owns for ``sharding=None | "fsdp"``:
whole replicas or shards) and ``determinism`` (deterministic CPU kernels in the update). A sharded checkpoint's
files are :mod:`algorithms.common.saving.sharded`'s. In the data flow: set up with the policy; every stage
(sampling, update, cold start) runs under them."""
