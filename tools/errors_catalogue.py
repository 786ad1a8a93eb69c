"""Render docs/errors.md from the table of pybatch/errors.py: `python tools/errors_catalogue.py`."""

from __future__ import annotations

from pathlib import Path

import attrs

from pybatch import errors


def _section(cls: type[errors.PyBatchError]) -> type[errors.PyBatchError]:
    """The family a leaf is written with: the later one, if it has two."""
    return [family for family in errors.FAMILIES if issubclass(cls, family)][-1]


def _row(cls: type[errors.PyBatchError]) -> str:
    fields = ", ".join(
        f"{field.name}: {field.type}"
        + ("" if field.default is attrs.NOTHING else f" = {field.default!r}")
        for field in attrs.fields(cls)
    )
    subject = getattr(cls, "subject", None)  # a text rule's error: its message names the rule
    message = " ".join(cls.message.split()) if subject is None else f"{subject} [rule]"
    bases = ", ".join(f"`{base.__name__}`" for base in cls.__bases__ if base.__name__[0] != "_")
    cells = [f"`{cls.__name__}`", bases, fields, message, cls.__doc__ or ""]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def catalogue() -> str:
    """Docs/errors.md: every error, family by family, rendered from the table."""
    out = [
        "# pybatch errors",
        "",
        "Generated from `pybatch/errors.py` by `python tools/errors_catalogue.py`; do not edit.",
        "Every error is a `pybatch.errors.PyBatchError`, a frozen attrs class built with keyword",
        "fields; its message is built from the fields only. `[rule]` is what the `rule` field",
        "(a `TextRule`) says: is empty, exceeds {max_bytes} bytes, has surrounding whitespace,",
        "contains an invalid character, contains a control character [at index N].",
    ]
    for family in errors.FAMILIES:
        out += ["", f"## {family.__name__}", "", family.__doc__ or "", ""]
        out += ["| Error | Is a | Fields | Message | What it means / how to fix it |"]
        out += ["| --- | --- | --- | --- | --- |"]
        out += [_row(cls) for cls in errors.ERRORS if cls is not family and _section(cls) is family]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
    target.write_text(catalogue())
    print(f"wrote {target}")
