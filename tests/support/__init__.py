"""What the tests share: the machine's servers and private ones, one process harness,
one fault proxy, and the applications that worker processes run (apps/).

This folder is on the test path (pyproject's pytest ``pythonpath``), and so is
apps/: a test imports ``support.…`` and an application module by its own name
(``chaosapp``), as the worker process running it as a script does.
"""

from pathlib import Path

__all__ = ["APPS"]

APPS = Path(__file__).resolve().parent / "apps"
