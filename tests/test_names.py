"""Names, not codes: no requirement code of the original design document (``S`` and a number: "S2", "S17", "S20.1")
in what a user reads. Nobody outside the project has that document; the code says what the thing is instead ("the
competition coefficient", "the diversity guard", "the cold start").

"User-facing", precisely, is what these tests scan:

- **the written docs**: ``README.md``, every page under ``docs/`` but ``docs/contributing/seed-codes.md`` (the one
  page that maps the names back to the codes, for contributors), and ``benchmarks/RESULTS.md`` (the site publishes
  it);
- **the shipped configs**: ``zoo_configs/*.yml``, comments included (they ship in the wheel and users read them);
- **the command line**: ``grpo-gym --help`` and every sub-command's ``--help``;
- **every string literal of the packages** ``grpo_gym/`` and ``algorithms/`` (error and warning messages, help
  texts, TensorBoard tags, the argument tables' docs, f-string parts, docstrings), but the docstrings of private
  functions and classes (a name starting with ``_``, dunders excepted); code comments are not strings, so they are
  not scanned: a comment may keep a code where it helps a contributor;
- **the docstrings of public names as Python builds them** (those generated at import too, such as ``GRPO``'s from
  its argument table): every module of both packages that imports here, its public classes and functions, and the
  classes' public methods.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

from algorithms.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"\bS\d+(?:\.\d+)?\b")
MAPPING_PAGE = ROOT / "docs" / "contributing" / "seed-codes.md"
PACKAGES = ("grpo_gym", "algorithms")


def codes(text: str) -> list[str]:
    """The lines of ``text`` that hold a code, with the code."""
    return [f"{line.strip()[:100]!r}" for line in text.splitlines() if CODE.search(line)]


def written_files() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p != MAPPING_PAGE]
    configs = sorted((ROOT / "zoo_configs").glob("*.yml"))
    return [ROOT / "README.md", *docs, ROOT / "benchmarks" / "RESULTS.md", *configs]


@pytest.mark.parametrize("path", written_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_code_in_the_written_docs_and_configs(path: Path) -> None:
    found = codes(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: say what it is instead of a code: {found}"


def test_the_mapping_page_maps_the_codes() -> None:
    text = MAPPING_PAGE.read_text(encoding="utf-8")
    assert all(f"| S{n} |" in text for n in range(1, 31))


def test_no_code_in_the_command_line_help() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    helps = {"grpo-gym": parser.format_help(), **{name: p.format_help() for name, p in sub.choices.items()}}
    found = {name: codes(text) for name, text in helps.items() if codes(text)}
    assert not found, f"codes in --help: {found}"


def _private(node: ast.AST) -> bool:
    name = getattr(node, "name", "")
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def literal_codes(path: Path) -> list[str]:
    """Codes in the string literals of one module, but in private functions' and classes' docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    private_docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                private_docs.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in private_docs:
            found += [f"line {node.lineno}: {hit}" for hit in codes(node.value)]
    return found


def test_no_code_in_the_packages_strings() -> None:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if hits := literal_codes(path):
                found[path.relative_to(ROOT).as_posix()] = hits
    assert not found, f"codes in messages, help, tags or docstrings: {found}"


def public_docstrings() -> dict[str, str]:
    """``{qualified name: docstring}`` of every public module, class, function and method that imports here."""
    docs: dict[str, str] = {}
    for package in PACKAGES:
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if any(part.startswith("_") for part in info.name.split(".")[1:]):
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # an optional package (vllm, ...) missing: the literal scan covered its text
                continue
            docs[info.name] = module.__doc__ or ""
            for name, obj in vars(module).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                if inspect.isclass(obj) or inspect.isfunction(obj):
                    docs[f"{info.name}.{name}"] = obj.__doc__ or ""
                if inspect.isclass(obj):
                    for method, member in vars(obj).items():
                        if not method.startswith("_") and callable(member):
                            docs[f"{info.name}.{name}.{method}"] = getattr(member, "__doc__", None) or ""
    return docs


def test_no_code_in_the_public_docstrings() -> None:
    docs = public_docstrings()
    assert len(docs) > 500 and "algorithms.grpo.grpo.GRPO" in docs
    found = {name: codes(doc) for name, doc in docs.items() if codes(doc)}
    assert not found, f"codes in docstrings: {found}"
