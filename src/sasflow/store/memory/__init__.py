"""The in-memory store of the simulation and of ``memory://`` URLs (store.py)."""

from sasflow.store.memory.store import MemoryStore

__all__ = ["MemoryStore"]
