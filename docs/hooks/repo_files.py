"""MkDocs hook: the repository's benchmark record (``benchmarks/RESULTS.md`` and its plots) published in the site.

The pages link to them as ``../benchmarks/...`` (a path in the repository, so the same links work on GitHub). At
build time the files are added to the site under ``benchmarks/`` (no copy kept in ``docs/``: they cannot drift),
and a page's links into the repository's ``benchmarks/`` folder are pointed at those copies.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
MIRRORED = "benchmarks"  # the repository folder the site carries
SUFFIXES = (".md", ".png")
LINK = re.compile(r"(\]\()([^)\s#]+)")


def on_files(files: Files, config: Any) -> Files:
    """Add ``benchmarks/RESULTS.md`` and ``benchmarks/*.png`` to the site, under ``benchmarks/``."""
    for path in sorted((ROOT / MIRRORED).iterdir()):
        if path.suffix in SUFFIXES and path.is_file():
            files.append(File.generated(config, f"{MIRRORED}/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point a page's links into the repository's ``benchmarks/`` at the site's copies."""
    page_dir = posixpath.dirname(page.file.src_uri)  # e.g. "guides"
    in_repo = posixpath.join("docs", page_dir)  # where the page lives in the repository

    def relink(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("/"):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join(in_repo, target))  # a path from the repository's root
        if not resolved.startswith(f"{MIRRORED}/"):
            return match.group(0)
        return match.group(1) + posixpath.relpath(resolved, page_dir or ".")

    return LINK.sub(relink, markdown)
