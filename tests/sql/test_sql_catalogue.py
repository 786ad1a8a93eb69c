"""docs/sql-catalogue.md is generated from queries/ and must not go stale."""

from __future__ import annotations

from pathlib import Path

from pybatch import _sql_catalogue as sql_catalogue

ROOT = Path(__file__).resolve().parents[2]


def test_the_sql_catalogue_document_is_current() -> None:
    document = (ROOT / "docs" / "sql-catalogue.md").read_text()
    assert document == sql_catalogue.render_markdown(), (
        "docs/sql-catalogue.md is stale: regenerate it with "
        "`pybatch sql catalogue > docs/sql-catalogue.md`"
    )


def test_every_statement_is_in_the_catalogue_with_its_tables() -> None:
    entries = {entry.name: entry for entry in sql_catalogue.catalogue()}
    assert entries["insert_job_instance_if_absent"].tables_written == ("job_instance",)
    assert "job_instance" in entries["explore_job_names"].tables_read
    assert all(entry.doc for entry in entries.values())
