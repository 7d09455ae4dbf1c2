"""Gradient compression (tnt.Compression.fp16 / bf16): what travels, what the
ranks end with, and the errors for bad values.

compression_ranks.py trains an MLP with tnt.Model(compression=...) and takes
custom-loop steps with DistributedGradientTape / DistributedOptimizer, for
none, fp16 and bf16, on 2 ranks (compiled TensorFlow ops, and the
numpy_function path) and serially (the reference: one rank sends nothing, so
compression changes nothing there).

Tolerances against serial Keras (weights after 24 Adam steps or 4 momentum
SGD steps, of magnitude up to ~0.5; measured maxima in brackets): none, the
serial-equivalence test's rtol 1e-5 / atol 1e-6; fp16 atol 1e-3 [1.3e-4];
bf16 atol 5e-2 [1.9e-2]. Final training loss: fp16 within 1e-4 [5e-7],
bf16 within 1e-3 [6e-5]. On every rank the weights are bitwise the same.
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from tf_helpers import run_ranks, run_serial  # noqa: E402

TOLERANCE = {"none": dict(rtol=1e-5, atol=1e-6), "fp16": dict(rtol=0, atol=1e-3),
             "bf16": dict(rtol=0, atol=5e-2)}
LOSS_TOLERANCE = {"none": 1e-6, "fp16": 1e-4, "bf16": 1e-3}


def _load(out, n):
    return [(dict(np.load(os.path.join(out, f"rank{r}.npz"))),
             json.load(open(os.path.join(out, f"rank{r}.json")))) for r in range(n)]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    run_serial("compression_ranks.py", "--out", out)
    return _load(out, 1)[0]


@pytest.fixture(scope="module", params=["compiled", "numpy"])
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ranks-{request.param}")
    run_ranks(2, "compression_ranks.py", "--out", out, env={"TNT_TF_OPS": request.param, "TNT_TIMEOUT_S": 60})
    return _load(out, 2)


def test_every_rank_holds_the_same_weights(ranks):
    (arrays0, result0), (arrays1, result1) = ranks
    assert arrays0.keys() == arrays1.keys() and len(arrays0) == 36
    for key in arrays0:
        assert np.array_equal(arrays0[key], arrays1[key]), key
    assert result0["history"] == result1["history"]


@pytest.mark.parametrize("label", ["none", "fp16", "bf16"])
def test_close_to_serial_keras(serial, ranks, label):
    ref_arrays, ref = serial
    arrays, result = ranks[0]
    keys = [k for k in ref_arrays if k.split("/")[0].endswith("." + label)]
    assert len(keys) == 12
    for key in keys:
        np.testing.assert_allclose(arrays[key], ref_arrays[key], err_msg=key, **TOLERANCE[label])
    np.testing.assert_allclose(result["history"][label]["loss"][-1], ref["history"][label]["loss"][-1],
                               rtol=0, atol=LOSS_TOLERANCE[label])


def test_compression_halves_the_gradient_bytes_on_the_wire(ranks):
    _, result = ranks[0]
    nbytes, params, steps = result["bytes"], result["params"], result["steps"]
    # fit: the same requests but for the gradients (float32: 4 bytes each, compressed: 2)
    assert nbytes["fit.none"] - nbytes["fit.fp16"] == params * 2 * steps
    assert nbytes["fit.bf16"] == nbytes["fit.fp16"]
    for kind in ("tape", "optimizer"):  # nothing else is reduced in these loops: 4 steps
        assert nbytes[f"{kind}.none"] == params * 4 * 4
        assert nbytes[f"{kind}.fp16"] == nbytes[f"{kind}.bf16"] == params * 2 * 4


def test_only_float32_is_compressed_and_results_keep_their_dtype(ranks):
    direct = ranks[0][1]["direct"]
    assert direct["dtypes"] == ["float32", "float64", "float16", None]
    assert direct["bytes"] == 1000 * 2 + 300 * 8 + 200 * 2  # float64 travels as it is
    # the core's float16 average: each rank's value halved (rounded to float16),
    # the two added in float32 and rounded once
    half = [(np.linspace(-1, 1, 1000, dtype=np.float32) * (r + 1)).astype(np.float16) for r in (0, 1)]
    halved = [(h.astype(np.float64) * 0.5).astype(np.float32).astype(np.float16) for h in half]
    want = (halved[0].astype(np.float32) + halved[1].astype(np.float32)).astype(np.float16)
    assert np.array_equal(np.array(direct["values"][0], np.float32), want.astype(np.float32))
    np.testing.assert_allclose(direct["values"][1], np.linspace(-1, 1, 300) * 1.5, rtol=1e-15)


# ---- bad values, in this process ----

def _optimizer():
    return keras.optimizers.SGD(0.1)


@pytest.mark.parametrize("make", [
    lambda c: tnt.DistributedOptimizer(_optimizer(), compression=c),
    lambda c: tnt.DistributedGradientTape(tf.GradientTape(), compression=c),
    lambda c: tnt.Model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), compression=c),
], ids=["DistributedOptimizer", "DistributedGradientTape", "Model"])
def test_bad_compression_values_are_clear_errors(make):
    with pytest.raises(TypeError, match=r"compression takes tnt.Compression.none, tnt.Compression.fp16 or "
                                        r"tnt.Compression.bf16, not a string \(write "
                                        r"compression=tnt.Compression.fp16\). Received: compression='fp16'"):
        make("fp16")
    with pytest.raises(TypeError, match="not a string. Received: compression='float8'"):
        make("float8")
    with pytest.raises(ValueError, match="Received: compression=42"):
        make(42)
    with pytest.raises(ValueError, match="Received: compression=<class 'object'>"):
        make(object)


def test_the_default_is_exact():
    optimizer = tnt.DistributedOptimizer(_optimizer())
    assert optimizer._tnt_compression is tnt.Compression.none
    assert tnt.Compression.none.compress(tf.ones([2]))[0].dtype == tf.float32
    assert tnt.Compression.fp16.compress(tf.ones([2], tf.float64))[0].dtype == tf.float64
    assert tnt.Compression.bf16.compress(tf.ones([2]))[0].dtype == tf.bfloat16
