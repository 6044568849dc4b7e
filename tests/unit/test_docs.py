"""The docs that code and tests point to stay true: every requirement id cited is
explained, and the module table lists exactly the modules there are."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "sasflow"
# an id of docs/requirements.md: S (the pattern), M (many instances), E (the worked
# example), U (what users expect), R (under every fault), then its number
CITED_ID = re.compile(r"\b[SMEUR][0-9]{1,2}\b")
EXPLAINED_ID = re.compile(r"^(?:- )?\*\*([SMEUR][0-9]{1,2})\b", re.MULTILINE)


def cited_ids() -> dict[str, str]:
    """Every requirement id the source and the tests cite -> one file citing it."""
    cited: dict[str, str] = {}
    for folder in (ROOT / "src", ROOT / "tests"):
        for path in sorted(folder.rglob("*.py")):
            for found in CITED_ID.findall(path.read_text()):
                cited.setdefault(found, str(path.relative_to(ROOT)))
    return cited


def test_every_requirement_id_the_code_cites_is_explained() -> None:
    explained = EXPLAINED_ID.findall((ROOT / "docs" / "requirements.md").read_text())
    cited = cited_ids()
    assert len(cited) >= 30  # the pattern finds the ids (S8, E9, ...) where they are
    missing = {found: where for found, where in cited.items() if found not in explained}
    assert not missing, f"cited, never explained in docs/requirements.md: {missing}"
    assert len(explained) == len(set(explained)), "an id explained twice"


def table_modules() -> list[str]:
    """The paths in the first column of docs/architecture.md's module table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The modules, by role", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "no module table under 'The modules, by role'"
    return [path for row in rows for path in re.findall(r"`([^`]+)`", row.split("|")[1])]


def package_modules() -> set[str]:
    """Every module under src/sasflow by its path there; a package as its folder."""
    found = {"__init__.py"}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name != "__init__.py":
            found.add(relative.as_posix())
        elif relative.parent != Path("."):
            found.add(f"{relative.parent.as_posix()}/")
    return found


def test_the_module_table_lists_every_module_and_no_other() -> None:
    listed = table_modules()
    assert len(listed) == len(set(listed)), "a module listed twice"
    modules = package_modules()
    assert "scheduler.py" in modules and "store/" in modules  # the walk sees the package
    assert sorted(modules - set(listed)) == [], "missing from docs/architecture.md's table"
    assert sorted(set(listed) - modules) == [], "in docs/architecture.md's table, no such module"
