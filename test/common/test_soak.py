"""Soak: four ranks run a randomized sequence of collectives for about forty
seconds (every dtype, sizes from 0 to a few MB around the core's size switches,
broadcasts from random roots, allgathers of uneven rows, barriers, batches of
requests in flight submitted and waited for in a different order on every rank,
named and unnamed). Every result is checked against NumPy on every rank, and
every step's results must be the same bits on every rank.

The seed is random on every run and printed on failure; set TNT_SOAK_SEED to
replay one (the plan and the inputs replay; the timing does not)."""
import json
import os
import random

from core_helpers import shm_objects, tntrun

RANKS = 4
BUDGET_S = 40        # the ranks stop together at the first check after this
MAX_STEPS = 100_000  # far more than fit in the budget
MIN_CHECKED = 300    # an unloaded 2-core machine checks about 140 a second


def test_soak_random_collectives_match_numpy_and_agree_bitwise(tmp_path):
    seed = int(os.environ.get("TNT_SOAK_SEED", random.randrange(1 << 31)))
    res = tntrun(RANKS, "rank_soak.py", tmp_path, seed, MAX_STEPS, BUDGET_S,
                 runner_args=["--output-on-all-devices"], timeout=BUDGET_S + 240)
    replay = f"(replay with TNT_SOAK_SEED={seed})"
    assert res.returncode == 0, f"{replay}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(RANKS)]
    for rep in reports:
        assert rep["mismatches"] == 0, (replay, rep["rank"], rep["first_mismatches"])
    first = reports[0]
    assert {rep["steps"] for rep in reports} == {first["steps"]}, replay
    assert first["checked"] >= MIN_CHECKED, (replay, first["checked"], first["by_kind"])
    assert set(first["by_kind"]) == {"allreduce", "broadcast", "allgather", "barrier"}, first["by_kind"]
    for rep in reports[1:]:
        differing = [s for s, (a, b) in enumerate(zip(first["digests"], rep["digests"])) if a != b]
        assert not differing, f"{replay}: rank {rep['rank']} holds other bits than rank 0 at steps {differing[:10]}"
    assert shm_objects(first["job"]) == []  # the job's shared memory is gone once tntrun returns
    print(f"soak seed {seed}: {first['steps']} steps, {first['checked']} collectives checked on each of {RANKS} "
          f"ranks {first['by_kind']}, 0 mismatches, bfloat16 {'checked' if first['bfloat16'] else 'skipped'}")
