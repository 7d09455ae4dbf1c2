"""The cores of the waits' budget are the CPUs the host's ranks may run on
(their affinity masks: taskset, a container's cpuset, Slurm's binding), not
the machine's: ranks confined to fewer cores than the machine has must wait
as ranks that outnumber their cores do (yield the core, never spin), whatever
the machine they run on. Counted by core.stats(), not timed."""
import os

from core_helpers import rank_reports


def test_two_ranks_confined_to_one_core_yield_it_and_never_spin(tmp_path):
    # on a machine of any size: 2 ranks on 1 CPU outnumber their cores. Before,
    # the machine's online CPUs were counted: on 2 cores the waits slept
    # (85 us a call against 8 us), on more they could spin on the one core
    # the awaited rank was queued on
    one = {min(os.sched_getaffinity(0))}
    # tntrun started with its affinity set to that CPU, which every rank inherits
    observed = rank_reports(tmp_path, 2, "rank_waits.py", preexec_fn=lambda: os.sched_setaffinity(0, one))
    assert all(o["cpus"] == sorted(one) and o["sums_ok"] for o in observed), observed
    assert all(o["stats"]["waits_spun"] == 0 for o in observed), [o["stats"] for o in observed]
    assert sum(o["stats"]["waits_yielded"] for o in observed) > 0, [o["stats"] for o in observed]
