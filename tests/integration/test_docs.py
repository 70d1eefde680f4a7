"""Every ```python block in docs/*.md and README.md runs, so the docs cannot drift from the code.

Each block runs on its own: a fresh namespace and a fresh temporary working directory, so a reader
can copy any block and run it. A block fenced as ```python continuation continues the block before
it instead (its namespace and working directory), for pages that build an example up step by step.
A block fenced as ```console continuation runs its ``$ `` lines through a shell, in the folder of the
block before it (what a reader types next), each printing what the page shows under it. Other
```text, ```console or ```yaml blocks are shown, not run here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_lines import command_lines, matches, prompted_lines, run_line

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
CONTINUATION = "continuation"
SHELL_BLOCK = re.compile(r"^```console continuation\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[bool, str]]:
    """(continues the previous block, code) for each ```python block of a page."""
    blocks = []
    for info, code in BLOCK.findall(path.read_text(encoding="utf-8")):
        words = info.split()
        if any(word != CONTINUATION for word in words):
            raise ValueError(f"{path.name}: unknown fence info {info.strip()!r}; use ```python or ```python {CONTINUATION}")
        if words and not blocks:
            raise ValueError(f"{path.name}: the first python block cannot be a {CONTINUATION}")
        blocks.append((bool(words), code))
    return blocks


def shell_blocks(path: Path) -> list[tuple[int, str]]:
    """(how many python blocks come before it, body) of each ```console continuation block of a page."""
    text = path.read_text(encoding="utf-8")
    found = [(len(BLOCK.findall(text[:match.start()])), match[1]) for match in SHELL_BLOCK.finditer(text)]
    if any(after == 0 for after, _ in found):
        raise ValueError(f"{path.name}: a console continuation block needs a python block before it")
    return found


def run_shell_block(path: Path, body: str, folder: Path) -> None:
    """Each ``$ `` line of `body` through a shell in `folder`: status 0, and the output the page shows."""
    for command, shown in prompted_lines(body):
        done = run_line(command, folder, env={"COLUMNS": None})
        assert done.returncode == 0, (path.name, command, done.stderr)
        if shown:
            got = done.stdout.rstrip("\n").splitlines()
            assert len(got) == len(shown) and all(map(matches, shown, got)), (path.name, command, got)


def run_blocks(path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a page's blocks: each in a fresh namespace and folder unless it is a continuation."""
    namespace: dict = {}
    shells = shell_blocks(path)
    for number, (continues, block) in enumerate(python_blocks(path), 1):
        if not continues:
            namespace = {"__name__": f"docs_{path.stem}"}
            folder = workdir / f"block{number}"
            folder.mkdir()
            monkeypatch.chdir(folder)
        code = compile(block, f"{path.name}[block {number}]", "exec")
        exec(code, namespace)  # the docs are ours; running them is the point of this test
        for _, body in [(after, body) for after, body in shells if after == number]:
            run_shell_block(path, body, folder)


def _shell_doc_lines() -> list:
    texts = {(str(page.relative_to(ROOT)), command)
             for page in DOCS for _, body in shell_blocks(page) for command, _ in prompted_lines(body)}
    return [line for line in command_lines() if (line.page, line.text) in texts]


DOC_LINES = _shell_doc_lines()


def test_docs_folder_has_runnable_examples():
    assert sum(len(python_blocks(p)) for p in DOCS) >= 5


@pytest.mark.parametrize("doc", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_doc_examples_run(doc: Path, tmp_path, monkeypatch):
    run_blocks(doc, tmp_path, monkeypatch)


def write_page(tmp_path: Path, *blocks: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n" + "\n".join(blocks), encoding="utf-8")
    return page


def test_a_block_does_not_see_the_names_or_files_of_the_block_before_it(tmp_path, monkeypatch):
    first = '```python\nfrom pathlib import Path\nx = 1\nPath("made-by-block-1").touch()\n```\n'
    page = write_page(tmp_path, first, '```python\nprint(x)\n```\n')
    (tmp_path / "names").mkdir()
    with pytest.raises(NameError, match="'x'"):
        run_blocks(page, tmp_path / "names", monkeypatch)
    page = write_page(tmp_path, first, '```python\nimport os\nassert not os.path.exists("made-by-block-1")\n```\n')
    (tmp_path / "files").mkdir()
    run_blocks(page, tmp_path / "files", monkeypatch)


def test_a_continuation_block_sees_the_names_and_files_of_the_block_before_it(tmp_path, monkeypatch):
    first = '```python\nfrom pathlib import Path\nx = 1\nPath("made-by-block-1").touch()\n```\n'
    second = '```python continuation\nassert x == 1 and Path("made-by-block-1").exists()\ny = 2\n```\n'
    third = '```python continuation\nassert x + y == 3\n```\n'
    page = write_page(tmp_path, first, second, third)
    (tmp_path / "run").mkdir()
    run_blocks(page, tmp_path / "run", monkeypatch)


@pytest.mark.parametrize(
    "blocks, message",
    [
        (['```python continuation\nx = 1\n```\n'], "first python block cannot be a continuation"),
        (['```python\nx = 1\n```\n', '```python continued\nx\n```\n'], "unknown fence info 'continued'"),
    ],
)
def test_a_misplaced_or_misspelt_mark_is_an_error(tmp_path, blocks, message):
    with pytest.raises(ValueError, match=message):
        python_blocks(write_page(tmp_path, *blocks))


def test_no_docs_page_names_an_issue():
    """Docs say what is true of the code; which issue brought it is history (git log), not documentation."""
    named = [f"{page.name}: {line.strip()}" for page in DOCS for line in page.read_text(encoding="utf-8").splitlines()
             if re.search(r"\bissues? #?\d+", line, re.I)]
    assert not named, named
