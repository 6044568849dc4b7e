"""``python -m sasflow.cli``: the same as the ``sasflow`` command."""

from sasflow.cli import main

if __name__ == "__main__":
    main()
