"""The fenced code blocks of the README and the docs pages, as the tests read them (tests/test_docs.py runs them;
tests/test_trl_port.py runs the TRL recipe with its own checks)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
#: a block that cannot run here says why on its first line: ``# docs: not run here (needs a GPU)``
MARKER = re.compile(r"^#\s*docs:\s*not run here \((?P<why>[^)]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and its text."""

    page: str  # the file, relative to the repository: "README.md", "docs/guides/tools.md"
    line: int  # the line of its opening fence
    language: str
    text: str

    @property
    def marked(self) -> str | None:
        """Why the block is not run here, when its first line says so."""
        match = MARKER.match(self.text.lstrip())
        return match["why"] if match else None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the site (docs/hooks/ holds code, not pages)."""
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT).as_posix()
    found = FENCE.finditer(text)
    return [Block(name, text.count("\n", 0, m.start()) + 1, m[1].lower(), m[2]) for m in found]


def section(path: Path, heading: str) -> str:
    """The text of the section ``heading`` (e.g. ``"## From TRL's GRPOConfig"``) up to the next one of its level."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end > 0 else None]


def python_blocks(path: Path, heading: str | None = None) -> list[str]:
    """The ``python`` blocks of a file (or of one of its sections), in order."""
    found = blocks(path)
    if heading is not None:
        wanted = section(path, heading)
        found = [b for b in found if b.text in wanted]
    return [b.text for b in found if b.language in PYTHON]
