"""`python -m pybatch`: the operator command line, the same as the `pybatch` script."""

from pybatch._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
