"""Keyed locks: one reconcile per object at a time, since triggers from several watches may overlap."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator


class KeyedLocks:
    """One lock per key, kept only while someone holds or waits for it (so the map never grows)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        # key -> (lock, holders and waiters)
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def held(self, key: Hashable) -> Iterator[None]:
        """Hold ``key``'s lock for the block."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)
