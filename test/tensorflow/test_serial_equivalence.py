"""tnt.Model on 1-4 ranks ends where serial Keras ends.

scenarios.py trains an MLP and a small CNN for 2 epochs, seeded, with a global
batch (25) that no rank count of 2-4 divides and 103 samples (a last batch of
3, so on 4 ranks one rank gets an empty micro-batch), from a batched dataset,
an unbatched dataset with tnt_micro_batch_size, NumPy arrays (with
validation), and a dataset with an unseeded shuffle (with a metric whose result()
is its variable); subclassed models whose
call() takes only `inputs`, or `inputs` and `training` with their own
train_step/test_step/predict_step and metrics, or the steps of Keras' guide
(the compiled metrics as one nested entry, a batch's loss named "loss"); and train_on_batch /
test_on_batch / predict (then predict_on_batch) run eagerly from
rank-dependent initial weights. It records the final weights, History,
evaluate() (test_on_batch) and predict() on every rank. It also checks the
TF-level collectives on nested structures (tensors back for tensors).

On 2 and 3 ranks (4 for the random layers) it also runs what needs a global
quantity: losses with reduction="sum", "mean_with_sample_weight" with sample
weights and a mask (per-timestep loss of padded sequences), a two-output model
(per-output losses, loss weights, EarlyStopping on val_reg_loss), Dropout,
AlphaDropout, GaussianNoise and GaussianDropout (the serial noise),
SpatialDropout1D by train_on_batch (micro-batches of a static 1), a Mean and a Sum tracker
added after compile, metrics' results logged under other names, synchronised BatchNormalization, fit(x, y, shuffle=True) after
set_random_seed, and mixed_float16 (the loss scale of every step must be
serial Keras'). On 2 and 4 ranks, AdamW with a schedule, weight decay,
global_clipnorm, EMA and gradient accumulation (all on the averaged gradient). On 2 ranks, Ftrl
(refused before).

Tolerances (float32): weights rtol 1e-5 / atol 1e-6, logs atol 1e-6 (rtol
1e-6), predictions atol 1e-5; a scenario may loosen them ("tolerance": BN
amplifies rounding, float16 rounds partial sums; see docs/keras.md). Results cannot be bitwise equal: each rank sums its own part of the
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

from tf_helpers import run_ranks, serial_reference, timeline

# The 2-rank run turns fusion off (TNT_FUSION_THRESHOLD_KB=0) and records a
# timeline: the results must not change, and every gradient must be reduced
# on its own (the other runs use the default threshold). Every run uses the
# compiled TensorFlow ops (TNT_TF_OPS=compiled: no silent fallback), but for
# "3-fallback": a compiler that fails (CXX=false, a fresh cache) must give one
# WARNING that names the build error, and the numpy_function path must then
# train exactly as well, with the 3 ranks' uneven slices of every batch. (It
# was a second 2-rank run: one launch fewer, about 80 s of CI.)
RUNS = [(1, None), (2, 0), (3, "fallback"), (4, None)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _load(serial_reference(tmp_path_factory))


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


@pytest.mark.parametrize("n,fusion_kb", RUNS, ids=[f"{n}" if kb is None else f"{n}-fallback" if kb == "fallback"
                                                    else f"{n}-fusion{kb}" for n, kb in RUNS])
def test_same_as_serial_keras(reference, tmp_path, n, fusion_kb):
    env = {"TNT_TF_OPS": "compiled"} if fusion_kb is None else \
        {"CXX": "false", "XDG_CACHE_HOME": os.path.join(tmp_path, "cache")} if fusion_kb == "fallback" else \
        {"TNT_TF_OPS": "compiled", "TNT_FUSION_THRESHOLD_KB": fusion_kb,
         "TNT_TIMELINE": os.path.join(tmp_path, "trace.json")}
    result = run_ranks(n, "scenarios.py", "--out", tmp_path, env=env)
    if fusion_kb == "fallback":
        warnings = re.findall(r"WARNING.*compiled TensorFlow ops cannot be used.*", result.stdout + result.stderr)
        assert len(warnings) == 1 and "building Tarantella's TensorFlow ops with false failed" in warnings[0], \
            result.stdout[-2000:] + result.stderr[-3000:]
    assert_same_as_serial(reference, _load(tmp_path), n)
    if fusion_kb == 0:
        _assert_each_gradient_reduced_alone(tmp_path, n)


def assert_same_as_serial(reference, ranks, n):
    """The ranks' results (_load) against serial Keras's, within the tolerances above, and
    bitwise the same on every rank; returns rank 0's logs. Also used across hosts
    (test/multihost/test_keras_multihost.py)."""
    assert len(ranks) == n
    ref_arrays, ref_logs, _ = reference[0]
    arrays, logs, _ = ranks[0]
    assert set(logs) == {k for k, v in ref_logs.items() if n in v["sizes"] and (
        "@" not in k or k.endswith(f"@{n}"))}
    for key, value in arrays.items():
        tolerance = ref_logs[key.split("/")[0]].get("tolerance")
        tol = dict(rtol=1e-5, atol=1e-5) if "/predict" in key else dict(rtol=1e-5, atol=1e-6)
        if tolerance:
            tol = dict(rtol=tolerance["rtol"], atol=tolerance["predict" if "/predict" in key
                                                                else "atol"])
        np.testing.assert_allclose(value, ref_arrays[key], err_msg=key, **tol)
    for name, scenario in logs.items():
        atol = ref_logs[name].get("tolerance", {}).get("logs", 1e-6)
        for part in ("history", "evaluate"):
            assert scenario[part].keys() == ref_logs[name][part].keys(), (name, part)
            for key, values in scenario[part].items():
                np.testing.assert_allclose(values, ref_logs[name][part][key], rtol=1e-6, atol=atol,
                                           err_msg=f"{name} {part} {key}")
        # mixed precision: the dynamic loss scale took serial training's decisions, step by step
        assert scenario.get("loss_scale") == ref_logs[name].get("loss_scale"), name
    for r, (other_arrays, other_logs, _) in enumerate(ranks[1:], start=1):
        assert other_logs == logs, f"rank {r} logs differ from rank 0"
        for key, value in arrays.items():
            assert np.array_equal(other_arrays[key], value), f"rank {r}: {key} differs"
    for r, (_, _, checks) in enumerate(ranks):  # nested structures through the TF-level collectives
        assert checks["tensor_collectives"] == [], f"rank {r}: {checks['tensor_collectives']}"
    return logs


def _assert_each_gradient_reduced_alone(out, n):
    """Every scenario's model has 6 trainable variables (the BN CNN 10), and
    its requests are tnt.grads.<digest of the gradients' shapes>: with fusion
    off, each gradient must be its own request (6 or 10 per model: the
    frontend packed nothing; an Embedding's IndexedSlices gradient is one
    gather of its values, .s<k>.values) and the core must not fuse requests either (no
    fusion-buffer copies, no "fused" allreduce), for anything. A small request
    may run in one round (e.g. the weights' sum, whose ranks submit together
    on the compiled ops' path): that is not fusion."""
    for rank in range(n):
        tl = timeline(os.path.join(out, f"trace.rank{rank}.json"))
        grads = [name for name in tl
                 if re.fullmatch(r"tnt\.grads\.[0-9a-f]+\.(b\d+\.\d+|s\d+\.values)", name)]
        per_model = collections.Counter(name.split(".")[2] for name in grads)
        assert per_model and set(per_model.values()) <= {6, 10}, sorted(grads)
        assert 10 in per_model.values(), sorted(grads)
        for name in grads:
            phase = "ALLGATHER" if name.endswith(".values") else "ALLREDUCE"
            assert len(tl[name][phase]) == len(tl[name]["NEGOTIATE"]) > 0, name
        for name, phases in tl.items():
            assert "MEMCPY_IN_FUSION_BUFFER" not in phases, name
            # "one round" (a small request whose data came with the negotiation,
            # as timing allows) is not fusion; "N tensors, M bytes fused" is
            assert all(detail in (None, "one round") for _, _, detail in phases.get("ALLREDUCE", [])), name
