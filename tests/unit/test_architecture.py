"""The house's shape: imports point adapters -> policies -> journal, no module cycle appears, no module
imports another's private names, and none reads the private attributes of another module's classes.

The checker reads the source with `ast` (every import, those inside functions too: a lazy import is
still an arrow) and runs nothing of the project. Its own tests run it on tiny synthetic trees, so a
checker that stopped seeing backwards imports or cycles would fail here too.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> the package it is installed as (pyproject's package-dir).
PACKAGES = {"journal": "stepjournal", "policies": "stepjournal.policies", "adapters": "stepjournal.adapters"}
LAYER = {"stepjournal": 0, "stepjournal.policies": 1, "stepjournal.adapters": 2}

# The only imports allowed to run backwards, each with its reason.
EXCEPTIONS = {
    ("stepjournal", "stepjournal.adapters"): (
        "the package face offers `journaled` lazily in __getattr__ (documented in docs/journal.md): "
        "wrapping a function is the first thing most users do"
    ),
    ("stepjournal.__main__", "stepjournal.adapters.cli"): (
        "`python -m stepjournal` is the command line's entry point; it runs the CLI and is imported by nothing"
    ),
}


def module_map(root: Path) -> Dict[str, Path]:
    """Every module of the three packages under `root`, by its installed dotted name."""
    found: Dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        base = root / folder
        for dirpath, _, files in os.walk(base):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                parts = list(path.relative_to(base).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join([package] + parts)] = path
    return found


def imports_of(module: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The project modules `module` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself.
            candidates = [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The dotted module a ``from ... import`` names, its dots resolved against `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_reach_ins(root: Path) -> Set[str]:
    """``importer -> module._name``: each private name (one leading underscore) a module imports from another."""
    modules = module_map(root)
    found: Set[str] = set()
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(node, package)
            if target not in modules or target == module:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{target}.{alias.name}" not in modules:  # a private name, not a submodule
                    found.add(f"{module} -> {target}.{alias.name}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_attribute_reach_ins(root: Path) -> Set[str]:
    """``module: .name (of owner)``: each private attribute or method a module reads on an object other
    than ``self``/``cls`` where only other modules' classes define that name (a name no project class
    defines is a third-party library's, which an adapter may have to reach: verl's, TRL's)."""
    modules = module_map(root)
    trees = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in modules.items()}
    owners: Dict[str, Set[str]] = {}
    for module, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                    owners.setdefault(node.name, set()).add(module)
                elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr)
                      and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    owners.setdefault(node.attr, set()).add(module)
    found: Set[str] = set()
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            defined = owners.get(node.attr, set())
            if defined and module not in defined:
                found.add(f"{module}: .{node.attr} (of {', '.join(sorted(defined))})")
    return found


def _room(module: str) -> str:
    """The room (journal, policies, adapters) a module belongs to: the package of its layer."""
    return max((p for p in LAYER if module == p or module.startswith(p + ".")), key=LAYER.__getitem__)


def _private_path(module: str) -> bool:
    """Whether a module's path below ``stepjournal`` has a private segment (``stepjournal.events._keys``)."""
    return any(_private(part) for part in module.split(".")[1:])


def private_module_reach_ins(root: Path) -> Set[str]:
    """``importer -> module``: each import, by a module outside journal/, of a private module of another
    room (``from stepjournal.events._keys import check_stage`` reaches in, though `check_stage` is public).

    A room's own private modules are its own: the CLI imports ``stepjournal.adapters._tokenizer``, verl's
    adapter its ``v1._hooks``. Inside journal/, the table of docs/architecture.md says who imports what.
    """
    modules = module_map(root)
    found: Set[str] = set()
    for module, path in modules.items():
        if _layer(module) == 0:
            continue
        for target in imports_of(module, path, modules):
            if _room(target) != _room(module) and _private_path(target):
                found.add(f"{module} -> {target}")
    return found


# A test that imports a private module says why on the import statement: ``# private: <why>``.
PRIVATE_MARKER = re.compile(r"#\s*private:\s*\S")


def unexplained_private_imports(folder: Path) -> List[str]:
    """``file:line``: each import of a private stepjournal module (a path segment below ``stepjournal``
    starting with ``_``) under `folder` whose statement carries no ``# private: <why>`` comment."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if not any(name.split(".")[0] == "stepjournal" and _private_path(name) for name in names):
                continue
            statement = lines[node.lineno - 1 : node.end_lineno]
            if not any(PRIVATE_MARKER.search(line) for line in statement):
                found.append(f"{path.relative_to(folder).as_posix()}:{node.lineno}")
    return found


def _layer(module: str) -> int:
    return max(level for package, level in LAYER.items() if module == package or module.startswith(package + "."))


def problems_in(root: Path, exceptions=EXCEPTIONS) -> List[str]:
    """What breaks the house's shape under `root`: backwards imports and import cycles."""
    modules = module_map(root)
    edges = {m: imports_of(m, p, modules) for m, p in modules.items()}
    problems = []
    for module, deps in sorted(edges.items()):
        for dep in sorted(deps):
            if _layer(dep) > _layer(module) and (module, dep) not in exceptions:
                problems.append(f"import runs backwards: {module} -> {dep}")
    # Package faces only re-export; a cycle through one (a module importing its own package's face)
    # is not a cycle between rooms, so faces are left out of the graph.
    faces = {m for m, p in modules.items() if p.name == "__init__.py"}
    graph = {m: sorted(d for d in deps if d not in faces) for m, deps in edges.items() if m not in faces}
    state: Dict[str, int] = {}

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                problems.append("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif not state.get(nxt):
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [])
    return problems


# -- the project -------------------------------------------------------------------------------------
def test_no_import_runs_backwards_and_no_module_cycle_in_the_project():
    assert problems_in(ROOT) == []


def test_no_module_imports_a_private_name_of_another():
    """A module's underscore names are its own; what a sibling needs is a public name of the module's seam."""
    assert sorted(private_reach_ins(ROOT)) == []


def test_outside_the_journal_code_imports_only_public_modules_of_another_room():
    """Policies and adapters use `stepjournal.vocabulary`, `stepjournal.tools`, `stepjournal.errors` ..., never
    a module whose path has a private segment (`stepjournal.events._keys`), whatever the name imported."""
    assert sorted(private_module_reach_ins(ROOT)) == []


def test_the_module_path_checker_finds_a_planted_private_module_import_from_policies_and_adapters(tmp_path):
    root = _tree(tmp_path, {
        "journal/events/_keys.py": "DEFAULT_STAGE = 'generate'\ndef check_stage(s):\n    pass\n",
        "journal/vocabulary.py": "from .events._keys import DEFAULT_STAGE, check_stage\n",
        "policies/_engine.py": "from stepjournal.events._keys import check_stage\nfrom stepjournal.vocabulary import DEFAULT_STAGE\n",
        "adapters/cli/_diff.py": "def f():\n    import stepjournal.events._keys\n",
        "adapters/verl/_hooks.py": "from stepjournal.policies import _engine\nfrom .._raw import x\n",
        "adapters/_raw.py": "",
        "journal/index/_audit.py": "from ..events._keys import DEFAULT_STAGE\n",
    })
    assert sorted(private_module_reach_ins(root)) == [
        "stepjournal.adapters.cli._diff -> stepjournal.events._keys",
        "stepjournal.adapters.verl._hooks -> stepjournal.policies._engine",
        "stepjournal.policies._engine -> stepjournal.events._keys",
    ]


def test_each_test_that_imports_a_private_module_says_why():
    assert unexplained_private_imports(ROOT / "tests") == []


def test_the_marker_checker_finds_an_import_of_a_private_module_that_does_not_say_why(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "from stepjournal.events._keys import seq_key\n"
        "from stepjournal.storage import _store  # private: the store's own limits\n"
        "from stepjournal.tools import json_rows\n"
        "from stepjournal.payloads._codec import (  # private: the codec's parts\n    a,\n)\n"
        "def f():\n    import stepjournal.index._audit  # why not\n"
    )
    assert unexplained_private_imports(tmp_path) == ["test_a.py:1", "test_a.py:8"]


# -- the journal knows no adapter's stage ----------------------------------------------------------------
# Where an adapter's stage name may appear in journal/'s code, each with its reason: (file under journal/, name).
STAGE_NAME_EXCEPTIONS = {
    ("events/_tool_calls.py", "reward"): "a tool response's field (text, reward, metrics, images), not the stage",
    ("events/_tool_calls.py", "metrics"): "a tool response's field (text, reward, metrics, images), not the stage",
    ("tools/_compare.py", "values"): "a kind of difference (the values differ), not the stage",
    ("index/_samples.py", "reward"): (
        "the samples view reads the rewards TRL's and verl's reward stages record; a reader each adapter "
        "registers would move this to the adapters (issue 50, not done yet)"
    ),
    ("index/_samples.py", "old_log_prob"): "the samples view reads the log-probs of that stage (as for reward)",
}


def declared_stage_names(root: Path) -> Set[str]:
    """The names of the stages the adapters declare: the first argument (or ``name=``) of each
    ``Stage(...)`` call with a string under adapters/."""
    names: Set[str] = set()
    for path in sorted((root / "adapters").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Stage"):
                continue
            args = list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "name"]
            names.update(a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def stage_names_in_journal(root: Path, names: Set[str], exceptions=STAGE_NAME_EXCEPTIONS) -> List[str]:
    """``file:line name``: each string in journal/'s code (docstrings aside) that is one of `names`, or
    ``<name>.<part>`` of one, unless listed in `exceptions`; the journal's own default stage is its word."""
    found = []
    journal = root / "journal"
    for path in sorted(journal.rglob("*.py")):
        rel = path.relative_to(journal).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
                continue
            name = next((n for n in sorted(names) if node.value == n or node.value.startswith(n + ".")), None)
            if name is not None and (rel, name) not in exceptions:
                found.append(f"{rel}:{node.lineno} {node.value}")
    return found


def test_the_journal_names_no_stage_an_adapter_declares():
    """The adapters declare their stages (`stepjournal.vocabulary.Stage`); the journal orders and reads them
    from the events, so no adapter's stage name is written in journal/ (but the listed exceptions)."""
    names = declared_stage_names(ROOT) - {"generate"}  # the journal's default stage (`DEFAULT_STAGE`)
    assert {"reward", "old_log_prob", "ref_log_prob", "values", "metrics"} <= names
    assert stage_names_in_journal(ROOT, names) == []


def test_each_stage_name_exception_is_still_a_string_of_its_file():
    """An exception that no longer happens is removed from the list, so the list stays honest."""
    names = {name for _, name in STAGE_NAME_EXCEPTIONS}
    found = stage_names_in_journal(ROOT, names, exceptions={})
    for file, name in STAGE_NAME_EXCEPTIONS:
        assert any(f.startswith(file + ":") and f.split(" ", 1)[1].split(".")[0] == name for f in found), (file, name)


def test_the_stage_name_checker_finds_a_planted_adapter_stage_name_in_the_journal(tmp_path):
    root = _tree(tmp_path, {
        "adapters/verl/_stages.py": "STAGES = (Stage('generate'), Stage('reward'), Stage(name='old_log_prob'),\n"
                                    "          Stage('metrics', StageRole.RECORD_ONLY))\n",
        "journal/tools/_diff_report.py": '"""Stages sort as ``"reward"`` says."""\n'
                                         "STAGE_ORDER = ('generate', 'reward', 'old_log_prob')\n"
                                         "def f(stage):\n    return stage.startswith('reward.')\n",
        "journal/index/_audit.py": "ACTIONS = ('generated', 'replayed')\n",
    })
    names = declared_stage_names(root)
    assert names == {"generate", "reward", "old_log_prob", "metrics"}
    assert stage_names_in_journal(root, names - {"generate"}, exceptions={}) == [
        "tools/_diff_report.py:2 reward", "tools/_diff_report.py:2 old_log_prob", "tools/_diff_report.py:4 reward.",
    ]


def test_no_module_reads_the_private_attributes_of_another_modules_classes():
    """`Journal`'s store, lock and log are reached through its seam (`appender_of`, `raw_events`),
    not through `journal._live()`; the same holds for every class of the project."""
    assert sorted(private_attribute_reach_ins(ROOT)) == []


def test_the_private_attribute_checker_finds_a_planted_reach_in_and_passes_self_and_third_party_names(tmp_path):
    root = _tree(tmp_path, {
        "journal/_a.py": "class A:\n    def __init__(self):\n        self._lock = 1\n    def _live(self):\n"
                         "        return self._lock\n",
        "journal/_b.py": "def f(journal, trainer):\n    trainer._compute_metrics()\n    return journal._live()\n",
        "adapters/_c.py": "def g(view):\n    with view._lock:\n        pass\n",
    })
    assert sorted(private_attribute_reach_ins(root)) == ["stepjournal._b: ._live (of stepjournal._a)",
                                                         "stepjournal.adapters._c: ._lock (of stepjournal._a)"]


# The journal's groups, bottom to top. Each below the facade is a folder of journal/; the facade and the
# face are the files at journal/'s top.
JOURNAL_GROUPS = ("base", "events", "storage", "payloads", "index", "upkeep", "facade", "sharing", "tools", "face")
TOP_GROUPS = ("facade", "face")
ANY_BELOW = "any module of its group or a lower one"


def journal_table(doc: str) -> List[tuple]:
    """(group, [files], allowed) of each row of docs/architecture.md's journal table; a file is its path
    under journal/ without ``.py`` (``storage/_store``), `allowed` a set of module names (``_store``), or
    None for "any module of its group or a lower one"."""
    section = doc.split("### `journal/`", 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| group"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        files = [f[:-3] for f in re.findall(r"`([\w/]+\.py)`", cells[1])]
        allowed = None if cells[-1] == ANY_BELOW else set(re.findall(r"`(\w+)`", cells[-1]))
        rows.append((cells[0], files, allowed))
    return rows


def journal_table_problems(root: Path, doc: str) -> List[str]:
    """Where the journal's imports and the table differ: a module in no row or in two, in another group's
    folder, an import the row does not name, a name the row's files do not import, an import that points
    to a higher group."""
    modules = module_map(root)
    rows = journal_table(doc)
    group_of, row_of = {}, {}
    problems = []
    for index, (group, files, _) in enumerate(rows):
        if group not in JOURNAL_GROUPS:
            problems.append(f"{files}: unknown group {group!r}")
            continue
        for file in files:
            folder, _, name = file.rpartition("/")
            if name in row_of:
                problems.append(f"{name} is in two rows")
            if folder != ("" if group in TOP_GROUPS else group):
                problems.append(f"{file}.py is in the {group} group's row, which lives in "
                                f"journal/{'' if group in TOP_GROUPS else group + '/'}")
            group_of[name], row_of[name] = group, index
    journal = root / "journal"
    files_of = {str(p.relative_to(journal).with_suffix("")): (dotted, p) for dotted, p in modules.items()
                if journal in p.parents}
    # A group folder's __init__.py is its public face (base/_face.py): no row, and it names modules of its own
    # group or a lower one only.
    for file, (dotted, path) in sorted(files_of.items()):
        if not file.endswith("/__init__"):
            continue
        group = file.partition("/")[0]
        for target in sorted(imports_of(dotted, path, modules)):
            below = target.split(".")[1] if target.count(".") > 1 else "facade"
            if below not in JOURNAL_GROUPS or JOURNAL_GROUPS.index(below) > JOURNAL_GROUPS.index(group):
                problems.append(f"{file}.py imports {target}; a group's face names its group's modules or lower ones")
    ours = {file.rpartition("/")[2]: entry for file, entry in files_of.items() if not file.endswith("/__init__")}
    found = {file for file in files_of if not file.endswith("/__init__")}
    listed = {file for _, files, _ in rows for file in files}
    problems += [f"{name}.py is in no row" for name in sorted(found - listed)]
    problems += [f"{name}.py is in the table but not in journal/" for name in sorted(listed - found)]
    imported: Dict[int, Set[str]] = {}
    stem_of = {dotted: stem for stem, (dotted, _) in ours.items()}
    for name, (dotted, path) in sorted(ours.items()):
        if name not in row_of:
            continue
        targets = {stem_of[t] for t in imports_of(dotted, path, modules) if t in stem_of}
        index = row_of[name]
        group, files, allowed = rows[index]
        names = {f.rpartition("/")[2] for f in files}
        imported.setdefault(index, set()).update(targets - names)
        for target in sorted(targets - names):
            if target not in group_of:
                continue
            if JOURNAL_GROUPS.index(group_of[target]) > JOURNAL_GROUPS.index(group):
                problems.append(f"{name} ({group}) imports {target} ({group_of[target]}), a higher group")
            if allowed is not None and target not in allowed:
                problems.append(f"{name} imports {target}, which its row does not name")
    for index, (group, files, allowed) in enumerate(rows):
        for stale in sorted((allowed or set()) - imported.get(index, set())):
            problems.append(f"the row of {', '.join(files)} names {stale}, which none of them imports")
    return problems


def test_architecture_md_names_exactly_the_imports_of_each_journal_module_and_none_points_up():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(journal_table(doc)) >= 35
    assert journal_table_problems(ROOT, doc) == []


def _table(*rows: str) -> str:
    """A docs/architecture.md journal section holding the face's row and `rows` (``group | file | allowed``)."""
    lines = [f"| {group} | {file} | job | {allowed} |" for group, file, allowed in (r.split(" | ") for r in rows)]
    return ("### `journal/`\n\n| group | file | job | may import |\n|---|---|---|---|\n"
            f"| face | `__init__.py` | face | {ANY_BELOW} |\n" + "\n".join(lines) + "\n\n### next\n")


def test_the_table_checker_finds_a_missing_row_an_unnamed_import_a_stale_name_and_an_upward_import(tmp_path):
    root = _tree(tmp_path, {
        "journal/events/_keys.py": "", "journal/events/_events.py": "from ._keys import K\n",
        "journal/index/_audit.py": "from ..events._events import E\nfrom .._journal import J\n",
        "journal/_journal.py": "", "journal/storage/_new.py": "",
    })
    doc = _table(f"facade | `_journal.py` | {ANY_BELOW}", "index | `index/_audit.py` | `_journal`, `_keys`",
                 "events | `events/_events.py` | nothing", "events | `events/_keys.py` | nothing")
    assert sorted(journal_table_problems(root, doc)) == sorted([
        "storage/_new.py is in no row",
        "_audit imports _events, which its row does not name",
        "_audit (index) imports _journal (facade), a higher group",
        "_events imports _keys, which its row does not name",
        "the row of index/_audit names _keys, which none of them imports",
    ])


def test_the_table_checker_finds_a_planted_backwards_group_import_and_a_file_in_another_groups_folder(tmp_path):
    root = _tree(tmp_path, {
        "journal/storage/_store.py": "from ..payloads._file_store import F\n",
        "journal/payloads/_file_store.py": "", "journal/payloads/_keys.py": "",
    })
    doc = _table("storage | `storage/_store.py` | `_file_store`", "payloads | `payloads/_file_store.py` | nothing",
                 "events | `payloads/_keys.py` | nothing")
    assert sorted(journal_table_problems(root, doc)) == sorted([
        "_store (storage) imports _file_store (payloads), a higher group",
        "payloads/_keys.py is in the events group's row, which lives in journal/events/",
    ])


def test_adapters_and_policies_log_through_the_public_leaf():
    """`stepjournal.log` is the face of the core's logging: nothing above the journal imports `stepjournal.base._log`."""
    modules = module_map(ROOT)
    users = [m for m, path in modules.items() if _layer(m) > 0 and "stepjournal.base._log" in imports_of(m, path, modules)]
    assert users == []
    assert any("stepjournal.log" in imports_of(m, p, modules) for m, p in modules.items() if _layer(m) > 0)


def test_each_listed_exception_is_still_an_import_of_the_project():
    """An exception that no longer happens is removed from the list, so the list stays honest."""
    modules = module_map(ROOT)
    for module, dep in EXCEPTIONS:
        assert dep in imports_of(module, modules[module], modules), (module, dep)


# -- the checker itself, on synthetic trees ------------------------------------------------------------
def _tree(tmp_path: Path, files: Dict[str, str]) -> Path:
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").touch()
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_passes_a_tree_whose_imports_point_down(tmp_path):
    root = _tree(
        tmp_path,
        {
            "journal/base/_log.py": "",
            "policies/_engine.py": "from stepjournal.base import _log\n",
            "adapters/verl/_hooks.py": "from stepjournal.policies._engine import x\nfrom ._errors import E\n",
            "adapters/verl/_errors.py": "",
        },
    )
    assert problems_in(root) == []


def test_the_checker_finds_the_journal_importing_policies_even_inside_a_function(tmp_path):
    root = _tree(tmp_path, {"journal/_j.py": "def f():\n    from stepjournal.policies import _p\n", "policies/_p.py": ""})
    assert problems_in(root) == ["import runs backwards: stepjournal._j -> stepjournal.policies._p"]


def test_the_checker_finds_the_journal_importing_an_adapter(tmp_path):
    root = _tree(tmp_path, {"journal/_j.py": "import stepjournal.adapters.trl\n", "adapters/trl.py": ""})
    assert problems_in(root) == ["import runs backwards: stepjournal._j -> stepjournal.adapters.trl"]


def test_the_checker_finds_a_policy_importing_an_adapter_by_relative_import(tmp_path):
    root = _tree(tmp_path, {"policies/_p.py": "from ..adapters import _raw\n", "adapters/_raw.py": ""})
    assert problems_in(root) == ["import runs backwards: stepjournal.policies._p -> stepjournal.adapters._raw"]


def test_the_checker_finds_a_cycle_between_modules(tmp_path):
    root = _tree(
        tmp_path,
        {
            "journal/_a.py": "from ._b import x\n",
            "journal/_b.py": "def f():\n    from . import _c\n",
            "journal/_c.py": "from stepjournal._a import y\n",
        },
    )
    assert problems_in(root) == ["import cycle: stepjournal._a -> stepjournal._b -> stepjournal._c -> stepjournal._a"]


def test_the_private_name_checker_finds_a_planted_reach_in_and_passes_public_names_and_submodules(tmp_path):
    root = _tree(tmp_path, {
        "journal/storage/_store.py": "_ENVS = {}\nMAX_DBS = 8\n",
        "journal/upkeep/_compact.py": "from ._store import MAX_DBS\nfrom . import _store\n",
        "journal/upkeep/_prune.py": "def f():\n    from stepjournal.storage._store import _ENVS, __doc__\n",
        "adapters/cli/_a.py": "from ._b import _x\n", "adapters/cli/_b.py": "_x = 1\n",
    })
    assert sorted(private_reach_ins(root)) == ["stepjournal.adapters.cli._a -> stepjournal.adapters.cli._b._x",
                                               "stepjournal.upkeep._prune -> stepjournal.storage._store._ENVS"]


def test_the_checker_allows_a_backwards_import_only_where_it_is_listed(tmp_path):
    files = {"journal/__init__.py": "def __getattr__(name):\n    from stepjournal.adapters import journaled\n"}
    root = _tree(tmp_path, files)
    assert problems_in(root) == []
    assert problems_in(root, exceptions={}) == ["import runs backwards: stepjournal -> stepjournal.adapters"]


def test_no_module_is_over_450_lines_unless_architecture_md_names_it_cohesive():
    # A mention elsewhere (a table row, "where new things go") is not enough: the file must be named
    # in a paragraph of docs/architecture.md that says it is one cohesive thing.
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cohesive = [part for part in doc.split("\n\n") if "cohesive" in part]
    long = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            rel = path.relative_to(ROOT).as_posix()
            if lines > 450 and not any(f"`{rel}`" in part for part in cohesive):
                long.append(f"{rel}: {lines} lines")
    assert long == []


def test_no_module_reaches_into_the_codec_registrys_private_tables():
    # `CodecRegistry.codec_for` / `codec_named` are the registry's reads; its tables are its own.
    reach_ins = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "_codec_registry.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "._by_type" in line or "._by_name" in line:
                    reach_ins.append(f"{path.relative_to(ROOT).as_posix()}:{number}")
    assert reach_ins == []
