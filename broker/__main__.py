"""``python -m broker``: the same as the ``conveyor`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
