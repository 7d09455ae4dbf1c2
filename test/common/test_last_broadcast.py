"""A job whose last call is a broadcast ends with exit status 0 on every rank,
every time: rank 0, the root, finishes first and exits while the others are
still receiving, and that must not look to them like a peer lost in the middle
of a collective. Fifty 4-rank jobs in a row (forked from one process that
imported NumPy and Tarantella once, about a second per ten jobs)."""
import json
import os
import subprocess
import sys

from core_helpers import HERE, clean_env, shm_objects

LAUNCHES, RANKS = 50, 4


def test_fifty_jobs_ending_with_a_broadcast_all_exit_0(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(HERE, "rank_last_broadcast.py"), str(LAUNCHES), str(RANKS),
                          str(tmp_path)], env=clean_env(TNT_TIMEOUT_S=30, OMP_NUM_THREADS=1),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(jobs) == LAUNCHES, res.stdout[-3000:] + res.stderr[-3000:]
    failed = [j for j in jobs if any(j["codes"])]
    if failed:
        first = failed[0]
        rank, output = next(iter(first["errors"].items()))
        raise AssertionError(
            f"{len(failed)} of {LAUNCHES} jobs had a rank exit non-zero (exit statuses: "
            f"{[j['codes'] for j in failed]}); first, job {first['launch']}, rank {rank}:\n{output}")
    leftovers = [name for j in jobs for name in shm_objects(j["job"])]
    assert leftovers == [], leftovers
