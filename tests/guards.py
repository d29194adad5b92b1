"""A guard for fuzz tests: nothing the code under test does may execute code."""

from __future__ import annotations

import builtins
import contextlib
import os
import subprocess
import sys


@contextlib.contextmanager
def nothing_executes():
    """Make eval / exec / compile, importing a module not yet loaded, os.system / os.popen and starting a
    subprocess fail while the code under test runs (imports of loaded modules, e.g. numpy's lazy internal
    ones, return the cached module and run nothing)."""
    real_import = builtins.__import__

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("something tried to execute code")

    def guarded_import(name: str, *args: object, **kwargs: object) -> object:
        if name not in sys.modules:
            raise AssertionError(f"something tried to import {name!r}")
        return real_import(name, *args, **kwargs)

    targets = [(builtins, name, forbidden) for name in ("eval", "exec", "compile")]
    targets += [(builtins, "__import__", guarded_import), (os, "system", forbidden), (os, "popen", forbidden)]
    targets += [(subprocess, "Popen", forbidden)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    for owner, name, replacement in targets:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
