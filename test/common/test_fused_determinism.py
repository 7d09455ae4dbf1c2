"""Results do not depend on how the core happened to fuse requests: the same
gradients under the same names, reduced step after step on 4 ranks with
different submission orders and pauses (so different fusion groups), give the
same bits at every step (DESIGN: "the same inputs on the same number of ranks
give bitwise the same output on every run and on every rank"). Two ranks
cannot show it: a sum of two floats does not depend on their order."""
import json

from core_helpers import tntrun

RANKS, STEPS = 4, 60


def test_same_inputs_give_the_same_bits_whatever_the_fusion():
    res = tntrun(RANKS, "rank_repeat_fused.py", STEPS, runner_args=["--output-on-all-devices"], timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads(line.split("] ", 1)[1]) for line in res.stdout.splitlines() if '"differing"' in line]
    assert len(reports) == RANKS, res.stdout[-3000:]
    for rep in reports:
        assert rep["differing"] == [], (
            f"rank {rep['rank']}: {rep['distinct']} different results for the same inputs in {STEPS} steps; "
            f"steps that differ from step 0: {rep['differing'][:10]}")
