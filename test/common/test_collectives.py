"""Every collective, every dtype, sizes 0, 1, odd, not divisible by N and 64 MB,
on 1, 2, 3, 4 and 8 real ranks: results against NumPy, bitwise equal on every
rank and on a second run; nested structures (lists, tuples, named tuples,
dicts of arrays, scalars and duck-typed tensors) in one fused call, one
request per dtype, the same structure back, NaN/Inf propagated, an
unsupported leaf a TypeError naming its type, and the original's
TensorAllreducer/TensorBroadcaster/TensorAllgatherer; never TensorFlow."""
import json

import pytest

from core_helpers import collectives_agree, same_results, shm_objects, tntrun


def run_collectives(n, outdir, env=None):
    outdir.mkdir(parents=True, exist_ok=True)
    res = tntrun(n, "rank_collectives.py", outdir, env=env, runner_args=["--output-on-all-devices"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.load(open(outdir / f"rank{r}.json")) for r in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_collective_every_dtype(n, tmp_path):
    reports = run_collectives(n, tmp_path)
    collectives_agree(reports)
    if n > 1:  # the job's shared memory is gone once tntrun returns
        assert shm_objects(reports[0]["job"]) == []
    # 2 ranks on one host swapped whole buffers at 48-128 KiB (and only there)
    assert all((rep["pair_swaps"] > 0) == (n == 2) for rep in reports), [rep["pair_swaps"] for rep in reports]


@pytest.mark.parametrize("n", [2, 3])
def test_results_are_identical_on_a_second_run(n, tmp_path):
    # both runs here: the test needs no other test's state and runs alone. The
    # first writes into peers' memory with plain stores only, the second with
    # streaming stores from 16 KiB on (TNT_SHM_PLACEMENT: the cores taken as
    # near, then as far apart; by default a rank decides from what its copies
    # cost, so a run alone takes either branch by chance), an average's fused
    # last ring step included; on 3 ranks one rank of the second writes
    # plainly, beside two that stream. The second also writes every result with
    # streaming stores (the first only those of at least TNT_STREAM_MIN_KB's
    # default), and its allreduces above 16 KiB take the ring where the first
    # read every rank's chunk in place (TNT_SHM_DIRECT, 3 ranks): neither the
    # algorithm nor where the bytes go may change one bit
    near = run_collectives(n, tmp_path / "a", env={"TNT_SHM_PLACEMENT": "1"})
    # ranks may differ in it (only the kind of store changes): on 3, the middle one writes plainly
    placements = ["2", "1", "2"] if n == 3 else ["2", "2"]
    far = run_collectives(n, tmp_path / "b", env={"RANK_SHM_PLACEMENTS": ",".join(placements),
                                                  "TNT_STREAM_MIN_KB": "0", "TNT_SHM_DIRECT": "0"})
    assert [rep["bytes_streamed_far"] for rep in near] == [0] * n
    # the 64 MB allreduces alone stream more than 64 MB on every rank given far
    assert all((rep["bytes_streamed_far"] > 64 << 20) == (p == "2") and (rep["bytes_streamed_far"] == 0) == (p == "1")
               for rep, p in zip(far, placements)), [rep["bytes_streamed_far"] for rep in far]
    first, second = collectives_agree(near), collectives_agree(far)
    assert first.keys() == second.keys()
    same_results(first, second, "two runs")
