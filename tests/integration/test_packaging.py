"""The distribution: one import name, no generic top-level modules, no pickle in runtime code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DIRS = ("journal", "policies", "adapters")


def test_wheel_contains_only_the_stepjournal_package(tmp_path):
    # Built from a clean copy: a stale build/ folder in the checkout would hide a package left out of pyproject.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "benchmarks"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("stepjournal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"stepjournal", "hydra_plugins"}
    # Hydra's plugin namespace gets one module (the verl section's ConfigStore entry) and no `__init__.py`
    # of its own, which would hide every other Hydra plugin installed beside it.
    assert [n for n in names if n.startswith("hydra_plugins/")] == ["hydra_plugins/stepjournal_verl/__init__.py"]
    assert "stepjournal/py.typed" in names
    # Every package folder of the source tree (the adapters' subpackages too) is in the wheel.
    packages = {"journal": "stepjournal", "policies": "stepjournal/policies", "adapters": "stepjournal/adapters"}
    for folder, installed in packages.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            if inside.startswith("verl/hydra_plugins/"):  # installed as Hydra's namespace, checked above
                continue
            assert f"{installed}/{inside}" in names, f"{folder}/{inside} is not in the wheel"
    assert "stepjournal/adapters/verl/_hooks.py" in names
    assert not any(n.startswith(("tests/", "journal/", "policies/", "adapters/", "benchmarks/")) for n in names)

    # Installed into a fresh target, the wheel gives `stepjournal` and never `journal` or `policies`.
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    code = (
        "import importlib, sys\n"
        "import stepjournal, stepjournal.policies, stepjournal.adapters\n"
        f"assert stepjournal.__file__.startswith({str(target)!r}), stepjournal.__file__\n"
        "for generic in ('journal', 'policies', 'adapters'):\n"
        "    try:\n"
        "        importlib.import_module(generic)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(f'{generic} is importable')\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n" + code],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_editable_install_exposes_no_generic_names(tmp_path):
    code = (
        "import importlib\n"
        "import stepjournal\n"
        "for generic in ('journal', 'policies', 'adapters'):\n"
        "    try:\n"
        "        importlib.import_module(generic)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(f'{generic} is importable')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout


def test_runtime_code_never_unpickles_or_evals():
    """Reading a journal must never run its author's code: no pickle, torch.load, eval or exec."""
    pattern = re.compile(
        r"^\s*(import|from)\s+(pickle|dill|cloudpickle|marshal|shelve)\b|torch\.load\(|pickle\.loads?\("
        r"|(^|[^.\w])(eval|exec)\("
    )
    offenders = []
    for folder in RUNTIME_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                # The verl importer reads pickled dumps only behind --trust-pickle; those lines say so.
                if pattern.search(line) and "# pickle-ok" not in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_every_public_name_is_documented_in_docs():
    import stepjournal
    import stepjournal.adapters
    import stepjournal.adapters.trl
    import stepjournal.adapters.verl
    import stepjournal.base
    import stepjournal.errors
    import stepjournal.events
    import stepjournal.index
    import stepjournal.log
    import stepjournal.payloads
    import stepjournal.policies
    import stepjournal.policies.testing
    import stepjournal.sharing
    import stepjournal.testing
    import stepjournal.tools
    import stepjournal.upkeep
    import stepjournal.vocabulary

    docs = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md"))
    missing = [
        f"{module.__name__}.{name}"
        for module in (
            stepjournal,
            stepjournal.base,
            stepjournal.events,
            stepjournal.index,
            stepjournal.payloads,
            stepjournal.sharing,
            stepjournal.upkeep,
            stepjournal.errors,
            stepjournal.log,
            stepjournal.testing,
            stepjournal.vocabulary,
            stepjournal.tools,
            stepjournal.policies,
            stepjournal.policies.testing,
            stepjournal.adapters,
            stepjournal.adapters.verl,
            stepjournal.adapters.trl,
        )
        for name in module.__all__
        if name != "__version__" and not re.search(rf"\b{re.escape(name)}\b", docs)
    ]
    assert missing == []
