"""Where a twin's replica engines step: in the twin's own process, or spread over worker processes.

Between two events (an arrival, a sync of the autoscaler, a sample) the replicas do not touch one another: each
runs the steps that start before the event on its own clock. So a fleet's engines can step on several cores at
once, and the twin learns their steps afterwards, in the order one process would have run them (start time,
then name). That holds only while no answer can bring a request before the next event: a closed loop (a
conversation's next turn) steps in one process, where the bound is read again after every answer.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from neuronfleet.engine.fleet.arrivals import TwinRequest
from neuronfleet.engine.fleet.replica import ReplicaEngine, StepResult

#: Builds the engine of a replica from its name and when it is ready.
Build = Callable[[str, float], ReplicaEngine]


class Engines(Protocol):
    """The replicas' engines, by name."""

    def add(self, name: str, ready_at: float) -> None:
        """Start an engine, ready from ``ready_at``."""
        ...

    def admit(self, name: str, request: TwinRequest) -> None:
        """Route ``request`` to the engine ``name``."""
        ...

    def drop(self, name: str) -> None:
        """Stop the engine ``name``; steps of it already run but not yet yielded may still come and are ignored."""
        ...

    def advance(self, until: Callable[[], float]) -> Iterator[StepResult]:
        """Run every step that starts before ``until()``; yield them by start time, then name."""
        ...

    def close(self) -> None:
        """Stop whatever runs the engines."""
        ...


class LocalEngines:
    """Every engine in this process, stepped one step at a time in time order; ``until()`` is read again after
    every step, so an answer may bring the bound closer."""

    def __init__(self, build: Build) -> None:
        self._build = build
        self._engines: dict[str, ReplicaEngine] = {}
        #: Each engine's :meth:`ReplicaEngine.next_step_at`, kept as it changes.
        self._next_start: dict[str, float | None] = {}

    def add(self, name: str, ready_at: float) -> None:
        """Start an engine, ready from ``ready_at``."""
        self._engines[name] = self._build(name, ready_at)
        self._next_start[name] = None

    def admit(self, name: str, request: TwinRequest) -> None:
        """Route ``request`` to the engine ``name``."""
        engine = self._engines[name]
        engine.admit(request)
        self._next_start[name] = engine.next_step_at()

    def drop(self, name: str) -> None:
        """Stop the engine ``name``."""
        del self._engines[name], self._next_start[name]

    def advance(self, until: Callable[[], float]) -> Iterator[StepResult]:
        """Step the engine whose next step starts first, while that is before ``until()``."""
        while True:
            starts = [(start, name) for name, start in self._next_start.items() if start is not None]
            if not starts:
                return
            start, name = min(starts)
            if start >= until():
                return
            engine = self._engines[name]
            result = engine.step()
            self._next_start[name] = engine.next_step_at()
            yield result

    def close(self) -> None:
        """Nothing to stop."""


class WorkerEngines:
    """The engines spread over ``workers`` processes (forked, so they share this one's imports), each new engine on
    the worker with the fewest. Orders are sent with the next :meth:`advance`, which reads ``until()`` once."""

    def __init__(self, build: Build, workers: int) -> None:
        context = multiprocessing.get_context("fork")
        self._pipes: list[Connection] = []
        self._processes = []
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_host, args=(theirs, build), daemon=True)
            process.start()
            theirs.close()
            self._pipes.append(ours)
            self._processes.append(process)
        self._orders: list[list[_Order]] = [[] for _ in range(workers)]
        self._home: dict[str, int] = {}
        self._hosted = [0] * workers

    def add(self, name: str, ready_at: float) -> None:
        """Start an engine on the worker hosting the fewest."""
        worker = min(range(len(self._hosted)), key=lambda index: (self._hosted[index], index))
        self._home[name] = worker
        self._hosted[worker] += 1
        self._orders[worker].append(_Add(name, ready_at))

    def admit(self, name: str, request: TwinRequest) -> None:
        """Route ``request`` to the engine ``name``."""
        self._orders[self._home[name]].append(_Admit(name, request))

    def drop(self, name: str) -> None:
        """Stop the engine ``name``."""
        worker = self._home.pop(name)
        self._hosted[worker] -= 1
        self._orders[worker].append(_Drop(name))

    def advance(self, until: Callable[[], float]) -> Iterator[StepResult]:
        """Every worker runs its engines' steps that start before ``until()`` at once; their steps come back
        merged in the order one process would have run them."""
        bound = until()
        for pipe, orders in zip(self._pipes, self._orders, strict=True):
            pipe.send((orders, bound))
        self._orders = [[] for _ in self._pipes]
        results: list[StepResult] = []
        for pipe in self._pipes:
            reply = pipe.recv()
            if isinstance(reply, BaseException):
                raise reply
            results += reply
        results.sort(key=lambda result: (result.start, result.replica))
        yield from results

    def close(self) -> None:
        """Stop the workers."""
        for pipe in self._pipes:
            pipe.send(None)
            pipe.close()
        for process in self._processes:
            process.join()


@dataclass(frozen=True)
class _Add:
    name: str
    ready_at: float


@dataclass(frozen=True)
class _Admit:
    name: str
    request: TwinRequest


@dataclass(frozen=True)
class _Drop:
    name: str


_Order = _Add | _Admit | _Drop


def _host(pipe: Connection, build: Build) -> None:
    """A worker: apply each batch of orders, then run its engines' steps up to the bound; reply with the steps,
    or the error that stopped them."""
    engines = LocalEngines(build)
    while (message := pipe.recv()) is not None:
        orders, bound = message
        try:
            for order in orders:
                match order:
                    case _Add(name, ready_at):
                        engines.add(name, ready_at)
                    case _Admit(name, request):
                        engines.admit(name, request)
                    case _Drop(name):
                        engines.drop(name)
            pipe.send(list(engines.advance(functools.partial(float, bound))))
        except Exception as error:
            pipe.send(error)  # the twin's process raises it
    pipe.close()
