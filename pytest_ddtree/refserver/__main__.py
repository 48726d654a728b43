"""``python -m pytest_ddtree.refserver``: see :mod:`pytest_ddtree.refserver.cli`."""

from pytest_ddtree.refserver.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
