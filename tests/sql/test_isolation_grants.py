"""The isolated runtime role's column grants cover every UPDATE pybatch sends.

With isolation enabled (docs/dba.md, "Isolating job families"), the runtime role updates
`job_execution`, `step_execution` and `step_partition` through column privileges only, so
that it cannot `LOCK TABLE` them. A statement assigning a column missing from those grants
would fail with 42501 for every isolated family, and only then: this test reads every
`UPDATE pybatch.<table> SET ...` of queries/ and of the functions migrations/ create, and
the grants of docs/dba.md, and names what is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "dba.md"
QUERIES = ROOT / "queries"
MIGRATIONS = ROOT / "migrations"

UPDATE = re.compile(
    r"\bUPDATE\s+pybatch\.(\w+)(?:\s+AS\s+\w+)?\s+SET\s+(.*?)(?=\bWHERE\b|\bFROM\b|\bRETURNING\b|;)",
    re.S | re.I,
)
GRANT_COLUMNS = re.compile(
    r"GRANT\s+(?:SELECT,\s*INSERT,\s*)?UPDATE\s*\((.*?)\)\s*ON\s+([\w.,\s]+?)\s+TO", re.S
)


def block(name: str) -> str:
    match = re.search(rf"```sql {name}\n(.*?)```", GUIDE.read_text(), re.S)
    assert match is not None, f"docs/dba.md has no {name} block"
    return match.group(1)


def assigned_columns(assignments: str) -> set[str]:
    """The columns of a SET list (`a = x, b = f(y, z)`): names before `=` at depth 0."""
    columns: set[str] = set()
    depth = 0
    start = 0
    for index, char in enumerate(assignments + ","):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            target = assignments[start:index].split("=", 1)[0].strip()
            if target:
                columns.add(target)
            start = index + 1
    return columns


def updates_in_queries() -> dict[str, dict[str, set[str]]]:
    """table -> column -> the files whose statements (or functions they call) assign it.

    The functions are the bodies of migrations/ (between `$$`): a runtime statement calls
    them, and they run with its rights. A migration's own UPDATEs run as the migrator.
    """
    found: dict[str, dict[str, set[str]]] = {}
    sources = [(path, path.read_text()) for path in sorted(QUERIES.glob("*.sql"))]
    sources += [
        (path, "\n".join(re.findall(r"\$\$(.*?)\$\$", path.read_text(), re.S)))
        for path in sorted(MIGRATIONS.glob("*.sql"))
    ]
    for path, source in sources:
        text = re.sub(r"--[^\n]*", "", source)
        for match in UPDATE.finditer(text):
            for column in assigned_columns(match.group(2)):
                found.setdefault(match.group(1), {}).setdefault(column, set()).add(path.name)
    return found


def granted(*scripts: str) -> dict[str, set[str]]:
    """table -> columns granted for UPDATE by the GRANT UPDATE (...) statements of `scripts`."""
    columns: dict[str, set[str]] = {}
    for script in scripts:
        for match in GRANT_COLUMNS.finditer(script):
            names = {name.strip() for name in match.group(1).split(",")}
            for table in match.group(2).split(","):
                columns.setdefault(table.strip().removeprefix("pybatch."), set()).update(names)
    return columns


def test_the_isolated_runtime_grants_cover_every_update_of_queries() -> None:
    updates = updates_in_queries()
    grants = granted(block("isolation-enable"), block("runtime-grants"), block("retention-grants"))
    missing = {
        f"{table}.{column} ({', '.join(sorted(files))})"
        for table in ("job_execution", "step_execution", "step_partition", "job_instance")
        for column, files in updates.get(table, {}).items()
        if column not in grants.get(table, set())
    }
    assert not missing, "add to the isolation-enable block of docs/dba.md: " + ", ".join(
        sorted(missing)
    )
    # The parser does see the statements it checks (a regex gone blind would pass).
    assert {"lease_expires_at", "stop_requested_at", "status", "failure_message"} <= set(
        updates["job_execution"]
    )
    assert "checkpoint_payload" in updates["step_execution"]
    assert "worker_owner_token" in updates["step_partition"]


def test_the_isolated_runtime_role_keeps_no_table_wide_update() -> None:
    """The enabling script revokes table-level UPDATE before granting columns."""
    script = block("isolation-enable")
    revoke = script.index("REVOKE UPDATE ON pybatch.job_execution, pybatch.step_execution")
    assert revoke < script.index("GRANT UPDATE (")
    assert not re.search(r"GRANT\s+(?:[\w\s,]*\b)?UPDATE\s+ON", script)
