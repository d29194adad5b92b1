"""The house's layout: no import circle inside ``algorithms/`` or ``grpo_gym/``, ``algorithms/common/`` never
imports an algorithm folder (nor ``algorithms/common/saving/`` the algorithm's classes), ``grpo_gym/`` never imports
``algorithms/``. Read from the modules' own import statements (function-level and ``TYPE_CHECKING`` ones included),
so a circle that a late import keeps alive still fails here.

The doors: nothing outside the algorithm classes reads a model's private attribute (``model._x``: the saving code
and the command line use the public face), and one helper writes files through a temporary name
(``algorithms/common/saving/atomic.py``: no temporary file or rename anywhere else)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "grpo_gym")
#: the folders of ``algorithms/`` that hold an algorithm (or use one): ``common/`` builds on none of them
ALGORITHM_FOLDERS = ("algorithms.grpo", "algorithms.ppo", "algorithms.deploy", "algorithms.cli", "algorithms.zoo")
#: the algorithm's classes, which the saving room never imports (SB3's save_util never imports base_class)
ALGORITHM_CLASSES_MODULES = (
    "algorithms.common.base_class",
    "algorithms.common.rollout_collection",
    "algorithms.common.overlapped_learning",
)
#: the classes whose own methods may read a model's private attributes (``load`` builds one, as SB3's does), and
#: the parts an algorithm owns (its rollout collection and overlapped loop, built with it in its constructor)
ALGORITHM_CLASSES = ("LMBaseAlgorithm", "GRPO", "LMPPO", "RolloutCollector", "OverlappedLoop")
#: the names a model goes by outside its class (``model``, a callback's ``self.model``)
MODEL_NAMES = ("model", "algorithm")
#: the one module that writes through a temporary name and renames
ATOMIC = Path("algorithms/common/saving/atomic.py")
#: calls that move a file into place, and the module that makes temporary files
RENAMES = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its ``__init__``)."""
    names = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file: ``import a.b`` gives ``a.b``; ``from a import b``
    gives ``a.b`` when that is a module, else ``a``; relative imports are resolved against the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
    return {target for target in found if target in modules and target != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "grpo_gym").mkdir()
    (tmp_path / "algorithms" / "common").mkdir(parents=True)
    for name in ("grpo_gym/__init__.py", "algorithms/__init__.py", "algorithms/common/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "grpo_gym" / "a.py").write_text("from grpo_gym import b\n")
    (tmp_path / "grpo_gym" / "b.py").write_text("def late():\n    from . import c\n")
    (tmp_path / "grpo_gym" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpo_gym.a\n"
    )
    (tmp_path / "algorithms" / "common" / "d.py").write_text("import numpy\nfrom grpo_gym.a import thing\n")
    graph = import_graph(tmp_path)
    assert graph["grpo_gym.a"] == {"grpo_gym.b"} and graph["grpo_gym.b"] == {"grpo_gym.c"}
    assert graph["grpo_gym.c"] == {"grpo_gym.a"} and graph["algorithms.common.d"] == {"grpo_gym.a"}
    assert circles(graph) == [["grpo_gym.a", "grpo_gym.b", "grpo_gym.c"]]


def test_no_import_circle_in_the_packages() -> None:
    found = circles(import_graph())
    shown = "; ".join(" <-> ".join(c) for c in found)
    assert not found, f"import circles (cut each; the map: docs/contributing/layout.md): {shown}"


def test_common_imports_no_algorithm_folder() -> None:
    graph = import_graph()
    wrong = {
        name: sorted(t for t in targets if t.startswith(ALGORITHM_FOLDERS))
        for name, targets in graph.items()
        if name.startswith("algorithms.common")
    }
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, f"algorithms/common/ must build on no algorithm: {wrong}"


def test_the_layout_page_lists_every_module() -> None:
    page = (ROOT / "docs" / "contributing" / "layout.md").read_text(encoding="utf-8")
    block = page.split("## The map", 1)[1].split("```", 2)[1]
    folders: list[tuple[int, str]] = []
    entries = set()
    for line in block.splitlines():  # "common/rollout/" then "    rows.py": a folder line, then its modules
        indent, words = len(line) - len(line.lstrip()), line.split()
        if not words:
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if words[0].endswith("/") and indent >= 2:
            folders.append((indent, words[0]))
        elif words[0].endswith(".py"):
            entries.add("".join(folder for _, folder in folders) + words[0])
    missing = []
    for path in module_names().values():
        relative = path.relative_to(ROOT)  # e.g. algorithms/common/rollout/rows.py -> common/rollout/rows.py
        if path.name != "__init__.py" and relative.relative_to(relative.parts[0]).as_posix() not in entries:
            missing.append(relative.as_posix())
    assert not missing, f"the layout map (docs/contributing/layout.md) leaves out {missing}"


def test_pyproject_lists_every_package() -> None:
    """The wheel ships the packages pyproject names: each folder with an ``__init__.py`` is listed, and nothing else
    (a renamed or moved package fails here, in seconds, before the wheel build does)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
    }
    assert listed - {"algorithms.zoo_configs"} == folders


def test_the_saving_room_and_the_env_import_no_algorithm() -> None:
    graph = import_graph()
    wrong = {
        name: sorted(targets)
        for name, targets in graph.items()
        if name.startswith("algorithms.common.saving") and set(targets) & set(ALGORITHM_CLASSES_MODULES)
    }
    wrong.update(
        {name: sorted(targets) for name, targets in graph.items() if name.startswith("grpo_gym")
         and any(target.startswith("algorithms") for target in targets)}
    )  # fmt: skip
    assert not wrong, f"the saving room imports no algorithm class, the env no algorithm: {wrong}"


def _is_model(node: ast.AST) -> bool:
    """``model`` or ``<anything>.model`` (a callback's ``self.model``)."""
    return (isinstance(node, ast.Name) and node.id in MODEL_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in MODEL_NAMES
    )


def private_model_reads(source: str) -> list[str]:
    """``model._x`` outside the bodies of :data:`ALGORITHM_CLASSES`, as ``"<line>: <expression>"``."""
    found: list[str] = []

    def visit(node: ast.AST, inside: bool) -> None:
        if isinstance(node, ast.ClassDef):
            inside = inside or node.name in ALGORITHM_CLASSES
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and _is_model(node.value)
            and not inside
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def atomic_write_copies(source: str) -> list[str]:
    """A second way to write atomically: a rename into place (``os.replace``, ``os.rename``, ``shutil.move``,
    ``Path.rename``), with the temporary files or folders (``tempfile``) of a module that renames, as ``"<line>:
    <expression>"``. A scratch folder or a log file from ``tempfile`` alone is no atomic write."""
    renames, temporaries = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if "tempfile" in names:
                temporaries.append(f"{node.lineno}: import tempfile")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in RENAMES:
                renames.append(f"{node.lineno}: {ast.unparse(node)}")
            elif node.value.id == "tempfile":
                temporaries.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "rename":
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "os"):  # os.rename: above
                renames.append(f"{node.lineno}: {ast.unparse(node.func)}")
    found = renames + temporaries if renames else []
    return sorted(found, key=lambda entry: int(entry.split(":")[0]))


def test_the_door_checks_find_what_they_look_for() -> None:
    source = (
        "import os, tempfile\nfrom pathlib import Path\n"
        "def save(model, folder):\n"
        "    handle, name = tempfile.mkstemp(dir=folder)\n    os.replace(name, folder / 'x')\n"
        "    Path(name).rename('y')\n    return model._iteration, model.iteration\n"
        "class Saver:\n    def on_step(self):\n        return self.model._dist.is_main\n"
        "class GRPO:\n    @classmethod\n    def load(cls):\n        model = cls()\n        model._setup_model()\n"
    )
    assert private_model_reads(source) == ["7: model._iteration", "10: self.model._dist"]
    assert atomic_write_copies(source) == [
        "1: import tempfile", "4: tempfile.mkstemp", "5: os.replace", "6: Path(name).rename"
    ]  # fmt: skip
    assert atomic_write_copies("import tempfile\nfolder = tempfile.mkdtemp()\n") == []  # a scratch folder


def test_nothing_outside_the_algorithm_classes_reads_a_models_private_attribute() -> None:
    """The saving code, the callbacks and the command line read a model through its public face (``iteration``,
    ``distributed``, ``is_sharded``, ``start_run``, ``needs_cold_start``, ``save``...), as SB3's save_util never
    reads ``BaseAlgorithm``'s privates."""
    found = {
        path.relative_to(ROOT).as_posix(): reads
        for path in module_names().values()
        if (reads := private_model_reads(path.read_text(encoding="utf-8")))
    }
    assert not found, f"a model's private attribute read from outside its class (add a public one): {found}"


def test_one_helper_writes_atomically() -> None:
    """Every write through a temporary name is :mod:`algorithms.common.saving.atomic`'s (``atomic_write``,
    ``atomic_directory``: fsync of the file and its folder); a second implementation elsewhere fails here."""
    found = {
        path.relative_to(ROOT).as_posix(): copies
        for path in module_names().values()
        if path.relative_to(ROOT) != ATOMIC and (copies := atomic_write_copies(path.read_text(encoding="utf-8")))
    }
    assert not found, f"write through algorithms.common.saving.atomic (atomic_write / atomic_directory): {found}"
