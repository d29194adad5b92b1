"""Files: ``model_file`` (the zip: plain JSON and weights, never unpickled by default), ``run_file`` (what a saved
run holds, on plain data: arguments, RNG states, the env record), ``checkpoints`` (the command line's periodic
checkpoints and ``--resume``) and ``atomic`` (a kill leaves the old file or the new one). In the data flow: at
iteration boundaries (``save``, checkpoints) and at ``load``."""
