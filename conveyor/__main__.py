"""``python -m conveyor``: the same as the ``conveyor`` command."""

from .broker.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
