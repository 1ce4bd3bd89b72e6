"""HelperPool: tasks shared between this process and spawned helpers, results in list order."""

import os

import pytest

from gpu_pipeline.lib.helper_pool import HelperPool, default_helpers


def square_and_pid(x: int) -> tuple[int, int]:
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * x, os.getpid()


def test_results_come_in_list_order_from_both_processes():
    with HelperPool(1) as pool:
        tasks = [pool.submit(square_and_pid, x) for x in range(40)]
        tasks[0].future.result(timeout=120)  # the helper is up and took the first task
        out = pool.run_all(tasks)
    assert [v for (v, _), err in out] == [x * x for x in range(40)]
    assert all(err is None for _, err in out)
    pids = [pid for (_, pid), _ in out]
    assert pids[0] != os.getpid() and pids[-1] == os.getpid()  # the helper from the front, this process from the end
    assert pool.ran["helpers"] >= 1 and pool.ran["here"] >= 1 and sum(pool.ran.values()) == 40


def test_an_error_is_handed_back_with_its_task_wherever_it_ran():
    with HelperPool(1) as pool:
        tasks = [pool.submit(square_and_pid, x) for x in (-1, 2, -3)]
        tasks[0].future.exception(timeout=120)
        out = pool.run_all(tasks)
    assert [str(err) if err else None for _, err in out] == ["negative: -1", None, "negative: -3"]
    assert out[1][0][0] == 4


def test_without_helpers_everything_runs_here():
    with HelperPool(0) as pool:
        out = pool.run_all([pool.submit(square_and_pid, x) for x in range(3)])
    assert [v for (v, _), _ in out] == [0, 1, 4]
    assert {pid for (_, pid), _ in out} == {os.getpid()}
    assert pool.ran == {"here": 3, "helpers": 0}


def test_a_dead_helper_costs_time_not_results():
    with HelperPool(1) as pool:
        tasks = [pool.submit(square_and_pid, x) for x in range(6)]
        tasks[0].future.result(timeout=120)
        for process in list(pool._pool._processes.values()):
            process.kill()
        tasks[-1].future.exception(timeout=120)  # the pool has seen it die (no cancel races its clean-up)
        out = pool.run_all(tasks)
    assert [v for (v, _), _ in out] == [x * x for x in range(6)]
    assert all(err is None for _, err in out)


def test_helper_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("X_HELPERS", "0")
    assert default_helpers("X_HELPERS") == 0
    monkeypatch.setenv("X_HELPERS", "3")
    assert default_helpers("X_HELPERS") == 3
    monkeypatch.delenv("X_HELPERS")
    assert default_helpers("X_HELPERS") == (1 if (os.cpu_count() or 1) > 1 else 0)
    for bad in ("-1", "two"):
        monkeypatch.setenv("X_HELPERS", bad)
        with pytest.raises(ValueError, match=f"X_HELPERS='{bad}': expected a number of helper processes"):
            default_helpers("X_HELPERS")
