"""The repository stands on its own: every document it cites is one it contains.

Whoever takes pybatch over has only this repository. Code, SQL, tests and docs therefore state
their rules in place or cite docs/contract.md (by heading) and docs/tables.md (by section
number); they never cite reference documents kept elsewhere, nor bare section numbers that
belong to no document here. Migrations 0001-0008 are frozen (the migrator checksums them), so
they are exempt from the text rules; instead their citations must resolve: 0001 names the
schema document by its first name, a short file in docs/ that points at docs/tables.md,
whose sections 2 and 3.6 keep the numbers 0001 cites.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"
SCHEMA = ROOT / "docs/tables.md"
#: The name migration 0001 cites (built from parts, like the outside names below).
FIRST_SCHEMA_NAME = "docs/" + "schema" + ".md"
FROZEN_MIGRATIONS = re.compile(r"^migrations/000[1-8]_[a-z0-9_]+\.sql$")

# Built from parts so that this file does not cite them itself.
_MD = r"\.md\b"
OUTSIDE_DOCUMENTS = re.compile(
    r"\b(?:"
    + "|".join(("behaviour", "style", "stack", "postgres-lessons", "peers"))
    + ")"
    + _MD
    + "|"
    + "shared"
    + "/docs"
)
SCHEMA_REFERENCE = re.compile(r"[\w./-]*\b(?:schema|tables)" + _MD)
#: A parenthesised list or range of dotted section numbers: sections of no document here.
BARE_SECTION = re.compile(r"(?<![\w)\].])\((\d{1,2}\.\d{1,2})(?:(?:, |-|; )\d{1,2}\.\d{1,2})*\)")
#: Numbered rules and lettered scenario groups of documents kept elsewhere.
NUMBERED_RULE = re.compile(r"\brules? \d+(?:\.\d+)?\b|\bcontract group [A-Z]\b")
#: The word section and a number names a section; only docs/tables.md has numbered ones.
SECTION_WORD = re.compile(r"\bsection (\d+(?:\.\d+)?)\b")


def looks_like_sections(group: str) -> bool:
    """Whether every number of "(a.b, c.d)" could be a section: not a measurement like 0.60 or
    3.09 (a leading zero) or 2.53 (no document here or elsewhere has that many subsections)."""
    for number in re.findall(r"\d+\.\d+", group):
        major, minor = number.split(".")
        if major == "0" or (len(minor) > 1 and minor.startswith("0")) or int(minor) > 30:
            return False
    return True


def tracked_files() -> list[str]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in listing.decode().split("\0") if name]


def read_text(name: str) -> str | None:
    data = (ROOT / name).read_bytes() if (ROOT / name).is_file() else b""
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def prose_of(name: str, text: str) -> list[tuple[int, str]]:
    """The (line, text) pairs a citation can hide in: comments and strings in Python, comments
    in SQL, everything elsewhere (Markdown, TOML, INI, shell)."""
    if name.endswith(".py"):
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            return list(enumerate(text.splitlines(), start=1))
        pieces: list[tuple[int, str]] = []
        for token in tokens:
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                for offset, line in enumerate(token.string.splitlines()):
                    pieces.append((token.start[0] + offset, line))
        return pieces
    lines = list(enumerate(text.splitlines(), start=1))
    if name.endswith(".sql"):
        return [(number, line[line.index("--") :]) for number, line in lines if "--" in line]
    return lines


def schema_sections() -> set[str]:
    """The numbers of docs/tables.md's sections: "2", "3.6", ..."""
    found = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", SCHEMA.read_text(), flags=re.M)
    return set(found)


def contract_headings() -> list[str]:
    return re.findall(r"^#{2,3} (.+?)\s*$", CONTRACT.read_text(), flags=re.M)


def resolves_to_docs_schema(name: str, reference: str) -> bool:
    target = SCHEMA.resolve()
    bases = (ROOT, (ROOT / name).parent)
    return any((base / reference).resolve() == target for base in bases)


def outside_citations(name: str, text: str) -> list[str]:
    hits = []
    schema_itself = name == "docs/tables.md"
    for number, line in prose_of(name, text):
        where = f"{name}:{number}: {line.strip()[:120]}"
        if OUTSIDE_DOCUMENTS.search(line) or NUMBERED_RULE.search(line):
            hits.append(where)
            continue
        if any(
            not resolves_to_docs_schema(name, m.group(0)) for m in SCHEMA_REFERENCE.finditer(line)
        ):
            hits.append(where)
            continue
        if any(looks_like_sections(m.group(0)) for m in BARE_SECTION.finditer(line)):
            hits.append(where)
            continue
        for m in SECTION_WORD.finditer(line):
            before = line[: m.start()]
            if not (schema_itself or before.rstrip().endswith("docs/tables.md")):
                hits.append(where)
                break
    return hits


def test_no_tracked_file_cites_a_document_outside_the_repository() -> None:
    hits: list[str] = []
    for name in tracked_files():
        if FROZEN_MIGRATIONS.match(name):
            continue
        text = read_text(name)
        if text is not None:
            hits.extend(outside_citations(name, text))
    assert not hits, (
        "cite docs/contract.md by heading or docs/tables.md by section, or state the "
        "rule in place:\n" + "\n".join(hits)
    )


def test_the_check_catches_each_kind_of_outside_citation() -> None:
    cited = [
        "# see " + "behaviour" + ".md 4.10",
        "# see ../" + "shared" + "/docs/x",
        "# see " + "schema" + ".md 3.6",
        "# the claim is atomic (4." + "10)",
        "# no counters (" + "rule" + " 14)",
        "# as in sec" + "tion 4.8",
    ]
    for line in cited:
        assert outside_citations("pybatch/example.py", line + "\n"), line
    fine = [
        "# see docs/contract.md, Partitions",
        "# see docs/tables.md 3.6 and docs/tables.md section 2",
        "time.sleep(0.05)",
        "PAUSE = (1." + "5, 3.0)",
    ]
    for line in fine:
        assert not outside_citations("pybatch/example.py", line + "\n"), line
    assert not outside_citations("docs/contract.md", "[the schema](tables" + ".md)\n")
    assert outside_citations("docs/contract.md", "[the schema](" + "schema" + ".md)\n")


def test_contract_citations_name_existing_headings() -> None:
    headings = contract_headings()
    bad = []
    for name in tracked_files():
        text = read_text(name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for m in re.finditer(r"docs/contract\.md, (.*)$", line):
                rest = m.group(1).strip()
                while rest:
                    heading = next((h for h in headings if rest.startswith(h)), None)
                    if heading is None:
                        # A citation wrapped onto the next line ends the line mid-heading.
                        if not any(h.startswith(rest) for h in headings):
                            bad.append(f"{name}:{number}: {line.strip()}")
                        break
                    # "H1; H2" cites two headings, but a semicolon may also end the citation.
                    rest = rest[len(heading) :]
                    rest = rest[2:] if rest.startswith("; ") else ""
                    if not any(rest.startswith(h) for h in headings):
                        break
    assert not bad, "no such heading in docs/contract.md:\n" + "\n".join(bad)


def test_schema_citations_name_existing_sections() -> None:
    sections = schema_sections()
    bad = []
    for name in tracked_files():
        text = read_text(name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for m in re.finditer(r"docs/tables\.md (?:section )?(\d+(?:\.\d+)?)", line):
                if m.group(1) not in sections:
                    bad.append(f"{name}:{number}: {line.strip()}")
    assert not bad, "no such section in docs/tables.md:\n" + "\n".join(bad)


def test_frozen_migration_0001_citations_resolve_in_docs_schema_md() -> None:
    migration = (ROOT / "migrations" / "0001_create_schema.sql").read_text()
    schema = SCHEMA.read_text()
    assert FIRST_SCHEMA_NAME + " sec" + "tion 2" in migration
    assert "(" + "schema" + ".md 3.6)" in migration
    pointer = (ROOT / FIRST_SCHEMA_NAME).read_text()
    assert "docs/tables.md" in pointer and "sec" + "tion 2" in pointer and "3.6" in pointer
    sections = schema_sections()
    assert {"2", "3.6"} <= sections
    title = re.search(r"^### 3\.6 (.*)$", schema, flags=re.M)
    assert title is not None and "fault-state" in title.group(1).lower()
    created = re.findall(r"^CREATE TABLE pybatch\.(\w+) \(", migration, flags=re.M)
    assert len(created) == 12
    section_2 = schema[schema.index("\n## 2.") : schema.index("\n## 3.")]
    listed = re.findall(r"^### 2\.\d+ `(\w+)`", section_2, flags=re.M)
    assert listed == created, "docs/tables.md section 2 lists the tables of migration 0001"
