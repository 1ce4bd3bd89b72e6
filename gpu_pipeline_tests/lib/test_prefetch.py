"""Prefetch: items in order from a background thread, bounded ahead, errors handed over, and a
producer stopped (and its generator closed in its own thread) when the consumer stops early."""

import threading
import time

import pytest

from gpu_pipeline.lib.prefetch import Prefetch


def test_items_come_in_order_from_the_named_thread_at_most_depth_ahead():
    made: list[int] = []
    threads: set[str] = set()

    def items():
        for i in range(50):
            threads.add(threading.current_thread().name)
            made.append(i)
            yield i

    with Prefetch(items(), depth=3, name="producer") as ahead:
        taken = []
        for item in ahead:
            time.sleep(0.002)
            # what was made is what was taken, the depth in the queue, and one held by the producer
            assert len(made) <= len(taken) + 1 + 3 + 1
            taken.append(item)
    assert taken == list(range(50))
    assert threads == {"producer"}


def test_the_producers_error_reaches_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise KeyError("slab 3")

    got = []
    with Prefetch(items(), depth=2) as ahead, pytest.raises(KeyError, match="slab 3"):
        for item in ahead:
            got.append(item)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_stops_the_producer_which_closes_its_generator_in_its_own_thread():
    closed_in: list[str] = []
    made: list[int] = []

    def items():
        try:
            for i in range(10_000):
                made.append(i)
                yield i
        finally:
            closed_in.append(threading.current_thread().name)

    ahead = Prefetch(items(), depth=2, name="producer")
    for item in ahead:
        if item == 5:
            break
    ahead.close()
    assert closed_in == ["producer"]
    assert len(made) < 20  # not run to the end
    assert not any(t.name == "producer" for t in threading.enumerate())


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetch(iter([]), depth=0)


def test_close_waits_for_the_producer_even_when_its_wait_is_interrupted(monkeypatch):
    """A signal's exception during close() must not leave the producer running over what the caller
    closes next: the wait goes on, then the exception is raised; the queued items are dropped."""
    release = threading.Event()

    def items():
        yield 1
        yield 2
        release.wait(5)  # a slow step, under way when close() is called
        yield 3

    ahead = Prefetch(items(), depth=1, name="producer")
    assert next(iter(ahead)) == 1
    joins = []
    join = threading.Thread.join

    def interrupted_once(self, timeout=None):
        joins.append(self.name)
        if len(joins) == 1:
            release.set()
            raise KeyboardInterrupt
        return join(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        ahead.close()
    assert joins[:2] == ["producer", "producer"]
    assert not any(t.name == "producer" for t in threading.enumerate())
    assert ahead._buffer.empty()
