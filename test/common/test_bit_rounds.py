"""Negotiation that scales: once every name is cached, a cycle is one
AND-allreduce of readiness bits (a *bit round*), not an exchange of every
rank's message (a *full round*). Counted by core.stats()["bit_rounds"] and
["full_rounds"] (not timed), on shm through tntrun and over the mpi transport
under mpirun (recursive doubling, 3 ranks folding one in and 4 ranks), and
over gpi2 where GPI-2 is installed (recursive doubling over write_notify); the
results of every loop are checked. A new name in the steady state is announced
in a full round, small allreduces keep riding with full rounds (one round per
call), and TNT_BIT_ROUNDS=0 makes every cycle a full round. The divergence
check of a bit round is core/test/test_edges.c's diverged_in_a_bit_round."""
import json
import subprocess

import pytest

from core_helpers import tntrun
from test_gpi2_transport import gpi2_env, needs_gpi2
from test_mpi_transport import cache, mpi_env, mpirun_cmd, needs_mpi  # noqa: F401 (cache is a fixture)


def check_steady_state(reports):
    for o in reports:
        g = o["gradients"]
        assert o["gradients_ok"] and o["late_ok"] and o["late_grads_ok"] and o["small_ok"], o
        # 120 cached 64 KiB allreduces after warm-up: bit rounds only
        assert g["executed"] == o["gradients_steps"] and g["announcements"] == 0, g
        assert g["full_rounds"] == 0 and g["bit_rounds"] == g["cycles"] > 0, g
        # a new name is announced in a full round, then the steady state resumes
        assert o["late"]["announcements"] == 1 and o["late"]["full_rounds"] >= 1, o["late"]
        # small allreduces stay one round each: their payload needs the full message
        assert o["small"]["one_round"] == 30 and o["small"]["full_rounds"] >= 30, o["small"]


def reports_of(out, n):
    return [json.load(open(out / f"rank{r}.json")) for r in range(n)]


def test_steady_state_is_bit_rounds_on_shm(tmp_path):
    res = tntrun(4, "rank_bit_rounds.py", tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_steady_state(reports_of(tmp_path, 4))


def test_bit_rounds_off_makes_every_cycle_full(tmp_path):
    res = tntrun(3, "rank_bit_rounds.py", tmp_path, env={"TNT_BIT_ROUNDS": 0})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for o in reports_of(tmp_path, 3):
        assert o["gradients_ok"] and o["late_ok"] and o["small_ok"], o
        assert o["gradients"]["bit_rounds"] == 0 and o["gradients"]["full_rounds"] == o["gradients"]["cycles"], o
        assert o["small"]["one_round"] == 30, o["small"]


@needs_mpi
@pytest.mark.parametrize("n", [3, 4])
def test_steady_state_is_bit_rounds_over_mpi(n, cache, tmp_path):  # noqa: F811
    res = subprocess.run(mpirun_cmd(n, "rank_bit_rounds.py", tmp_path), env=mpi_env(cache, TNT_TIMEOUT_S=120),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_steady_state(reports_of(tmp_path, n))


@needs_gpi2
def test_steady_state_is_bit_rounds_over_gpi2(cache, tmp_path):  # noqa: F811
    res = tntrun(3, "rank_bit_rounds.py", tmp_path, runner_args=("--transport", "gpi2"), timeout=300,
                 env=gpi2_env(cache, TNT_TIMEOUT_S=120))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_steady_state(reports_of(tmp_path, 3))
