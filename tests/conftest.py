"""What every test shares: caches go to a temporary folder, not the user's ``~/.cache``; and no library phones home.
huggingface_hub's telemetry thread (started by TRL's trainer in the tests that run it) looks up
a host name while the test forks processes, and the lookup crashed the whole run once (a segmentation fault in
``getaddrinfo``); tests never need the network, so it is switched off before anything imports huggingface_hub."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_MODE", "offline")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: N workers share the cores, one torch thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # (and the processes the tests start)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True, scope="session")
def _cache_folder(tmp_path_factory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield
