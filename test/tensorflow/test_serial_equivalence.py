"""tnt.Model on 1-4 ranks ends where serial Keras ends.

scenarios.py trains an MLP and a small CNN for 2 epochs, seeded, with a global
batch (25) that no rank count of 2-4 divides and 103 samples (a last batch of
3, so on 4 ranks one rank gets an empty micro-batch), from a batched dataset,
an unbatched dataset with tnt_micro_batch_size, NumPy arrays (with
validation), and a dataset with an unseeded shuffle; subclassed models whose
call() takes only `inputs`, or `inputs` and `training` with their own
train_step/test_step/predict_step and metrics; and train_on_batch /
test_on_batch / predict (then predict_on_batch) run eagerly from
rank-dependent initial weights. It records the final weights, History,
evaluate() (test_on_batch) and predict() on every rank. It also checks the
TF-level collectives on nested structures (tensors back for tensors).

Tolerances (float32): weights rtol 1e-5 / atol 1e-6, logs atol 1e-6, predictions
atol 1e-5. Results cannot be bitwise equal: each rank sums its own part of the
batch before the weighted sum across ranks, so float32 additions are
associated differently (about 1e-7 relative per step), and about 10 steps of
momentum SGD / Adam carry that forward. Every rank must hold bitwise the same
weights and logs.
"""
import collections
import json
import os
import re

import numpy as np
import pytest

from tf_helpers import run_ranks, run_serial, timeline

# The 2-rank run turns fusion off (TNT_FUSION_THRESHOLD_KB=0) and records a
# timeline: the results must not change, and every gradient must be reduced
# on its own (the other runs use the default threshold).
RUNS = [(1, None), (2, 0), (3, None), (4, None)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    run_serial("scenarios.py", "--out", out, "--reference")
    return _load(out)


def _load(out):
    with open(os.path.join(out, "rank0.json")) as f:
        meta = json.load(f)
    ranks = []
    for r in range(meta["size"]):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            result = json.load(f)
        ranks.append((dict(np.load(os.path.join(out, f"rank{r}.npz"))), result["logs"],
                      result["checks"]))
    return ranks


@pytest.mark.parametrize("n,fusion_kb", RUNS,
                         ids=[f"{n}" if kb is None else f"{n}-fusion{kb}" for n, kb in RUNS])
def test_same_as_serial_keras(reference, tmp_path, n, fusion_kb):
    env = {} if fusion_kb is None else {"TNT_FUSION_THRESHOLD_KB": fusion_kb,
                                       "TNT_TIMELINE": os.path.join(tmp_path, "trace.json")}
    run_ranks(n, "scenarios.py", "--out", tmp_path, env=env)
    logs = assert_same_as_serial(reference, _load(tmp_path), n)
    if fusion_kb == 0:
        _assert_each_gradient_reduced_alone(tmp_path, n, len(logs))


def assert_same_as_serial(reference, ranks, n):
    """The ranks' results (_load) against serial Keras's, within the tolerances above, and
    bitwise the same on every rank; returns rank 0's logs. Also used across hosts
    (test/multihost/test_keras_multihost.py)."""
    assert len(ranks) == n
    ref_arrays, ref_logs, _ = reference[0]
    arrays, logs, _ = ranks[0]
    assert set(logs) == {k for k in ref_logs if "@" not in k or k.endswith(f"@{n}")}
    for key, value in arrays.items():
        tol = dict(rtol=1e-5, atol=1e-5) if key.endswith("predict") else dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(value, ref_arrays[key], err_msg=key, **tol)
    for name, scenario in logs.items():
        for part in ("history", "evaluate"):
            assert scenario[part].keys() == ref_logs[name][part].keys(), (name, part)
            for key, values in scenario[part].items():
                np.testing.assert_allclose(values, ref_logs[name][part][key], rtol=0, atol=1e-6,
                                           err_msg=f"{name} {part} {key}")
    for r, (other_arrays, other_logs, _) in enumerate(ranks[1:], start=1):
        assert other_logs == logs, f"rank {r} logs differ from rank 0"
        for key, value in arrays.items():
            assert np.array_equal(other_arrays[key], value), f"rank {r}: {key} differs"
    for r, (_, _, checks) in enumerate(ranks):  # nested structures through the TF-level collectives
        assert checks["tensor_collectives"] == [], f"rank {r}: {checks['tensor_collectives']}"
    return logs


def _assert_each_gradient_reduced_alone(out, n, optimizers):
    """Every scenario's model has 6 trainable variables, and its optimizer is
    tnt.grads.<k> (numbered in creation order): with fusion off, each gradient
    must be its own request (6 per optimizer: the frontend packed nothing) and
    the core must not fuse requests either (no fusion-buffer copies, no
    "fused" allreduce), for anything."""
    for rank in range(n):
        tl = timeline(os.path.join(out, f"trace.rank{rank}.json"))
        grads = [name for name in tl if re.fullmatch(r"tnt\.grads\.\d+\.b\d+\.\d+", name)]
        per_optimizer = collections.Counter(name.split(".")[2] for name in grads)
        assert per_optimizer == {str(k): 6 for k in range(optimizers)}, sorted(grads)
        for name in grads:
            assert len(tl[name]["ALLREDUCE"]) == len(tl[name]["NEGOTIATE"]) > 0, name
        for name, phases in tl.items():
            assert "MEMCPY_IN_FUSION_BUFFER" not in phases, name
            assert all(detail is None for _, _, detail in phases.get("ALLREDUCE", [])), name
