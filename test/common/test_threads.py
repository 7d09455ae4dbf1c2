"""The core from many Python threads at once: on 2 ranks, 4 threads per rank
submit their own named collectives and wait for them while a fifth submits its
own and polls them with test() alone; every result is checked exactly, for
about five seconds. Then the same while the fifth thread also calls test() on
the handles that the other threads are waiting for (a Handle shared between
threads, as a concurrent.futures.Future may be). The workers' unnamed calls,
of one shape in every thread, pair by thread across ranks (request_names.py);
two living threads of one name are refused, and so are unnamed
calls in a pool of two threads. Two threads that drop the handles of their
async calls at once never lose the buffers of one still in flight."""
import json

import pytest

from core_helpers import tntrun

RANKS, THREADS, BUDGET_S = 2, 4, 5
MIN_CHECKED = 200  # an unloaded 2-core machine checks about 750 a second


@pytest.mark.parametrize("mode", ["own", "shared"])
def test_threads_submit_wait_and_test_concurrently(mode, tmp_path):
    res = tntrun(RANKS, "rank_threads.py", tmp_path, mode, THREADS, BUDGET_S, timeout=BUDGET_S + 120,
                 env={"TNT_TIMEOUT_S": 30, "PYTHONFAULTHANDLER": 1}, runner_args=["--output-on-all-devices"])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(RANKS)]
    for rep in reports:
        assert rep["errors"] == [], rep["errors"]
        assert rep["checked"] >= MIN_CHECKED, rep
        assert rep["tests_done"] > 0, rep  # the polling thread saw its requests complete through test()
    assert reports[0]["checked"] == reports[1]["checked"], reports
    for rep in reports:
        assert len(rep["twin_refused"]) == 1 and "two threads named 'twin'" in rep["twin_refused"][0], rep
        assert rep["pools"][0] == [1, 1], rep  # 0 + 1: a pool of one thread pairs its calls
        assert len(rep["pools"]) == 6 and "worker thread of a ThreadPoolExecutor" in rep["pools"][1], rep
        assert "worker thread of a multiprocessing ThreadPool" in rep["pools"][2], rep
        # the default names of a DistributedOptimizer (request_names.in_thread): kept as they are in a
        # pool's worker threads, the thread's name added in a thread of its own
        assert rep["pools"][3:] == ["tnt.grads", "tnt.grads@trainer_0", "tnt.grads@trainer"], rep
        # a thread whose name is not UTF-8 (a lone surrogate) names its calls after the name's digest
        assert len(rep["undecodable"]) == 3, rep["undecodable"]
        sums, gathered, grads = rep["undecodable"]
        assert sums == [3.0] * 3 and gathered == [[0, 0], [1, 1]], rep["undecodable"]
        assert grads.startswith("tnt.grads@") and len(grads) == len("tnt.grads@") + 32, rep["undecodable"]
        assert rep["freed_in_flight"] == 0, rep  # dropped handles reaped by two threads at once keep their buffers
