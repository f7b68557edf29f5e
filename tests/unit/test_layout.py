"""The tree against docs/architecture.md: imports point down the floors, no two folders import
each other (even through others), every package has its row in the folders table, and each
row says which folders of its own floor it imports."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "millm"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Higher floors import lower ones; equal floors may import each other without a circle.
FLOORS = {
    "cli": 0,
    "__main__": 0,
    "server": 0,
    "lab": 1,
    "v1": 2,
    "kernel": 3,
    "interp": 4,
    "formats": 5,
    "engine": 6,
    "store": 6,
    "settings": 7,
    "errors": 8,
    "wording": 8,
}
FLOORED = ("lab/", "v1/", "kernel/")  # folders whose rows name what they import on their floor


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _imports() -> dict[str, set[str]]:
    """Each module of millm and the millm modules it imports (`from pkg import module` counted as
    the module)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("millm.")
            ):
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    is_module = (ROOT / (whole.replace(".", "/") + ".py")).exists()
                    found[source].add(whole if is_module else node.module)
            elif isinstance(node, ast.Import):
                found[source] |= {a.name for a in node.names if a.name.startswith("millm.")}
    return found


def _folder(module: str) -> str:
    """The folder a module sits in, as the table writes it (`lab/labels/`), or its own name for a
    module directly under millm (`errors`)."""
    parts = module.split(".")[1:]
    if (PACKAGE.joinpath(*parts)).is_dir():
        return "/".join(parts) + "/"
    return "/".join(parts[:-1]) + "/" if len(parts) > 1 else parts[0]


def _floor(module: str) -> int:
    return FLOORS[module.split(".")[1]]


def _table() -> dict[str, str]:
    """The folders table's rows: folder -> its last column."""
    text = ARCHITECTURE.read_text()
    section = text.split("## The folders", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2].strip() for m in re.finditer(r"^\| `([\w/]+)` \|.*\|(.*)\|$", section, re.M)}


def test_every_import_points_down_the_floors():
    """No module imports one on a higher floor."""
    upward = [
        (source, target)
        for source, targets in _imports().items()
        for target in targets
        if _floor(target) < _floor(source)
    ]
    assert upward == []


def test_no_circle_between_folders_or_modules():
    """Folders of one floor (and modules of one folder) never import each other in a circle."""
    imports = _imports()
    modules = nx.DiGraph([(s, t) for s, ts in imports.items() for t in ts if s != t])
    folders = nx.DiGraph(
        [
            (_folder(s), _folder(t))
            for s, ts in imports.items()
            for t in ts
            if _folder(s) != _folder(t)
        ]
    )
    assert [sorted(c) for c in nx.simple_cycles(folders)] == []
    assert [sorted(c) for c in nx.simple_cycles(modules)] == []


def test_the_folders_table_names_every_package():
    """docs/architecture.md's table has one row per package of millm, and none for a folder
    that is not there."""
    packages = {
        str(init.parent.relative_to(PACKAGE)) + "/" for init in PACKAGE.rglob("__init__.py")
    } - {"./"}
    assert set(_table()) == packages


def test_each_row_names_the_folders_of_its_floor_it_imports():
    """For lab/, v1/ and kernel/ folders, the table's last column is what the code imports."""
    imports = _imports()
    used: dict[str, set[str]] = defaultdict(set)
    for source, targets in imports.items():
        for target in targets:
            a, b = _folder(source), _folder(target)
            if a != b and a.startswith(FLOORED) and a.split("/")[0] == b.split("/")[0]:
                used[a].add(b)
    for folder, said in _table().items():
        if not folder.startswith(FLOORED) or folder == "kernel/":
            continue
        assert set(re.findall(r"`([\w/]+)`", said)) == used[folder], folder


def test_one_home_per_class_name():
    """No class name is defined twice in millm (a name says which thing it is)."""
    homes: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def test_only_the_composition_root_sees_the_whole_state():
    """ServerState is imported by server/ alone; every other function that takes a `state` names
    the parts it may touch (its folder's parts.py Protocol)."""
    importers = {
        source
        for source, targets in _imports().items()
        for target in targets
        if target == "millm.kernel.state"
    }
    assert {module.split(".")[1] for module in importers} == {"server"}
    untyped = [
        f"{path.relative_to(ROOT)}:{node.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for arg in node.args.args + node.args.kwonlyargs
        if arg.arg == "state" and arg.annotation is None
    ]
    assert untyped == []


def _hands_on_the_state(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a method's one statement hands `self.state` to a function and returns its answer."""
    body = [
        statement
        for statement in method.body
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return False
    call = body[0].value.value if isinstance(body[0].value, ast.Await) else body[0].value
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and any(ast.unparse(arg) == "self.state" for arg in call.args)
    )


def test_no_service_method_only_hands_on_the_state():
    """A service's method does its capability's work (the checks, the job's start); one that only
    handed the state to a function of its folder would be a second name for that function."""
    passing = [
        f"{path.relative_to(ROOT)}:{cls.name}.{method.name}"
        for path in PACKAGE.rglob("*.py")
        for cls in ast.parse(path.read_text()).body
        if isinstance(cls, ast.ClassDef)
        for method in cls.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        and _hands_on_the_state(method)
    ]
    assert passing == []


def test_a_long_module_says_why():
    """A module over 400 lines gives its reason in its docstring ("Over 400 lines because ...")."""
    unexplained = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if len(path.read_text().splitlines()) > 400
        and "Over 400 lines because" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert unexplained == []


def test_no_trailing_comment_splits_a_one_liner():
    """A comment after a closing bracket makes the formatter break a statement that fits on one
    line into three; such a comment goes on its own line above (mypy's `type: ignore` excepted,
    which must stay on its line)."""
    split = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        lines = path.read_text().splitlines()
        for i in range(2, len(lines)):
            closing = re.match(r"^\s*([)\]}]+,?)\s+# (.*)$", lines[i])
            if not closing or "type: ignore" in closing[2]:
                continue
            opening, inner = lines[i - 2].rstrip(), lines[i - 1].strip()
            joined = f"{opening}{inner}{closing[1]}"
            if opening.endswith(("(", "[", "{")) and not inner.endswith(",") and len(joined) <= 100:
                split.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert split == []
