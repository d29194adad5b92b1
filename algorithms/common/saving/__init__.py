"""Files, behind the algorithm's public face (as SB3's ``save_util``, this room imports no algorithm class: the
algorithm hands it plain data, and ``tests/test_layout.py`` keeps it so): ``model_file`` (the zip: plain JSON and
weights, never unpickled by default), ``run_file`` (what a saved run holds, on plain data: arguments, RNG states,
the env record; ``read_saved_run``), ``checkpoints`` (the command line's periodic checkpoints, plain or sharded,
and ``--resume``; a checkpoint's ``run.json`` is ``read_run_json``), ``sharded`` (a sharded checkpoint's shards,
``torch.distributed.checkpoint``), ``buffer_file`` (the replay buffer's file) and ``atomic`` (the one helper that
writes through a temporary name, with fsync: a kill leaves the old file or the new one). In the data flow: at
iteration boundaries (``save``, checkpoints) and at ``load``."""
