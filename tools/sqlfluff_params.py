"""Print the [sqlfluff:templater:placeholder] sample values for every statement parameter.

sqlfluff renders a colon parameter without a sample value as its bare name, which reads
as an unqualified column (RF02) or a self-alias (AL09). Every parameter therefore gets a
literal; tests/sql checks that none is missing. Run after adding a statement:
    python tools/sqlfluff_params.py   (then paste into .sqlfluff)
"""

from __future__ import annotations

from pybatch._statements import load_statements

LIST_PARAMETERS = {"ids": "(1, 2)"}


def main() -> None:
    names = sorted(
        {p for s in load_statements() for p in s.parameters} | {"ids", "limit", "offset"}
    )
    for name in names:
        print(f"{name} = {LIST_PARAMETERS.get(name, '1')}")


if __name__ == "__main__":
    main()
