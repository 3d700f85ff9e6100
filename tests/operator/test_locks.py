"""The reconciler's per-object locks: one holder per object, and no lock kept for an object nobody reconciles."""

from __future__ import annotations

import threading

from neuronfleet.operator.reconcilers import KeyedLocks

A, B = ("service", "ns", "a"), ("service", "ns", "b")


def test_one_holder_per_key_and_nothing_kept_once_free() -> None:
    locks = KeyedLocks()
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with locks.held(A):
            holding.set()
            release.wait(5)
            order.append("first")

    def second() -> None:
        with locks.held(A):
            order.append("second")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert holding.wait(5)
    threads[1].start()
    threads[1].join(0.2)
    assert threads[1].is_alive(), "a second holder got in"
    with locks.held(B):  # another object is not held up
        assert len(locks) == 2
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == ["first", "second"]
    assert len(locks) == 0


def test_a_failing_holder_lets_go() -> None:
    locks = KeyedLocks()
    try:
        with locks.held(A):
            raise RuntimeError("reconcile failed")
    except RuntimeError:
        pass
    assert len(locks) == 0
    with locks.held(A):
        assert len(locks) == 1
