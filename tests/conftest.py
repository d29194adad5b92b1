"""What every test shares: the precision probe's cache (``mixed_precision="auto"`` on a CPU with native bf16,
:mod:`algorithms.common.runtime.precision_probe`) goes to a temporary folder, not the user's ``~/.cache``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _precision_cache(tmp_path_factory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield
