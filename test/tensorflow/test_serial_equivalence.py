"""tnt.Model on 1-4 ranks ends where serial Keras ends.

scenarios.py trains an MLP and a small CNN for 2 epochs, seeded, with a global
batch (25) that no rank count of 2-4 divides and 103 samples (a last batch of
3, so on 4 ranks one rank gets an empty micro-batch), from a batched dataset,
an unbatched dataset with tnt_micro_batch_size, NumPy arrays (with
validation), and a dataset with an unseeded shuffle. It records the final
weights, History, evaluate() and predict() on every rank.

Tolerances (float32): weights rtol 1e-5 / atol 1e-6, logs atol 1e-6, predictions
atol 1e-5. Results cannot be bitwise equal: each rank sums its own part of the
batch before the weighted sum across ranks, so float32 additions are
associated differently (about 1e-7 relative per step), and about 10 steps of
momentum SGD / Adam carry that forward. Every rank must hold bitwise the same
weights and logs.
"""
import json
import os

import numpy as np
import pytest

from tf_helpers import run_ranks, run_serial

RANKS = (1, 2, 3, 4)


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
            logs = json.load(f)["logs"]
        ranks.append((dict(np.load(os.path.join(out, f"rank{r}.npz"))), logs))
    return ranks


@pytest.mark.parametrize("n", RANKS)
def test_same_as_serial_keras(reference, tmp_path, n):
    run_ranks(n, "scenarios.py", "--out", tmp_path)
    ranks = _load(tmp_path)
    assert len(ranks) == n
    ref_arrays, ref_logs = reference[0]
    arrays, logs = ranks[0]
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
    for r, (other_arrays, other_logs) in enumerate(ranks[1:], start=1):
        assert other_logs == logs, f"rank {r} logs differ from rank 0"
        for key, value in arrays.items():
            assert np.array_equal(other_arrays[key], value), f"rank {r}: {key} differs"
