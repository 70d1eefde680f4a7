"""The command lines of docs/sharing.md's "Topologies" section, each with the machine it is written for.

Every line of a console block there ends with ``# on <machine>``; a test runs the lines of its own
machines through the shell, as typed.
"""

from __future__ import annotations

import re
from pathlib import Path

SHARING = Path(__file__).resolve().parent.parent / "docs" / "sharing.md"
NODE_MARK = re.compile(r"\s+# on (?P<node>[^#]+?)$")


def topology_section() -> str:
    return SHARING.read_text(encoding="utf-8").split("### Topologies", 1)[1].split("\n## ", 1)[0]


def topology_commands(nodes: set) -> list:
    """(machine, line) of each command line written for one of `nodes`, in the order of the section."""
    lines = []
    for block in re.findall(r"^```console\n(.*?)^```", topology_section(), re.S | re.M):
        for line in block.splitlines():
            match = NODE_MARK.search(line)
            assert match, f"docs/sharing.md Topologies: {line!r} does not say where it runs"
            if match["node"] in nodes:
                lines.append((match["node"], line[: match.start()].strip()))
    return lines


def topology_doc_lines(nodes: set) -> list:
    """The `DocLine` of each command line written for one of `nodes` (what `topology_commands` gives)."""
    from doc_lines import command_lines

    texts = {line for _, line in topology_commands(nodes)}
    return [line for line in command_lines("docs/sharing.md", section="Topologies") if line.text in texts]
