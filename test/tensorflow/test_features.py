"""Callbacks, save/load, custom loops, warnings: one 2-rank launch of features.py,
compared with a serial plain-Keras run of the same script."""
import json
import os
import re

import numpy as np
import pytest

from tf_helpers import run_ranks, run_serial, timeline


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ref = tmp_path_factory.mktemp("serial")
    run_serial("features.py", "--out", ref, "--reference")
    out = tmp_path_factory.mktemp("ranks")
    # TNT_TIMEOUT_S: a rank that waits for a request the others never submit (a name that
    # differs between ranks) fails in a minute instead of hanging the test
    # timeout: the launch took 434 s on the shared 2-core machine (load 6), past the default 400
    run_ranks(2, "features.py", "--out", out, timeout=900,
              env={"TNT_LOG_LEVEL": "INFO", "TNT_TIMELINE": os.path.join(out, "trace.json"),
                   "TNT_TIMEOUT_S": 60})
    load = lambda d, r: json.load(open(os.path.join(d, f"rank{r}.json")))  # noqa: E731
    return {"ref": load(ref, 0), "ranks": [load(out, 0), load(out, 1)], "out": str(out)}


def _assert_history_as_serial(got, ref):
    """A history ({metric: values per epoch}) equal to serial Keras' within float32 rounding."""
    assert got.keys() == ref.keys()
    for key, values in ref.items():
        np.testing.assert_allclose(got[key], values, rtol=1e-6, atol=1e-6, err_msg=key)


def _assert_fit_as_serial(runs, name):
    """Scenario `name` trained as serial Keras on every rank (its history, a dict of metrics or
    a list of losses, and its weights), the ranks alike."""
    ref = runs["ref"][name]
    for rank in runs["ranks"]:
        got = rank[name]
        if isinstance(ref["history"], dict):
            _assert_history_as_serial(got["history"], ref["history"])
        else:
            np.testing.assert_allclose(got["history"], ref["history"], rtol=0, atol=1e-6)
        for a, b in zip(got["weights"], ref["weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert runs["ranks"][0][name] == runs["ranks"][1][name]


def test_deciding_callbacks_decide_as_in_serial_training(runs):
    ref = runs["ref"]["callbacks"]
    for rank in runs["ranks"]:
        got = rank["callbacks"]
        assert got["epochs_run"] == ref["epochs_run"]  # EarlyStopping
        assert got["history"].keys() == ref["history"].keys()
        for key, values in ref["history"].items():  # includes learning_rate (ReduceLROnPlateau,
            np.testing.assert_allclose(got["history"][key], values, atol=1e-6, err_msg=key)  # scheduler)
        assert got["everywhere"] == runs["ranks"][0]["callbacks"]["everywhere"]
        # tnt.keras.callbacks.Callback(early) returned the same EarlyStopping, still of its
        # type, and it stopped training where serial Keras stopped
        assert got["wrapped_early_stopping"] == {"same_object": True, "is_wrapper": True,
                                                 "is_early_stopping": True,
                                                 "class_name": "EarlyStopping"}
        assert ref["epochs_run"] < 8 and got["stopped_epoch"] == ref["stopped_epoch"] > 0


def test_writing_callbacks_run_on_the_master_only(runs):
    r0, r1 = (r["callbacks"] for r in runs["ranks"])
    assert r0["csv_opened"] and not r1["csv_opened"] and r0["csv_is_wrapped"]
    # a RemoteMonitor sends each epoch's logs once, as in serial training (not once per rank)
    assert runs["ref"]["callbacks"]["monitor_events"] == r0["monitor_events"] == r0["epochs_run"]
    assert r1["monitor_events"] == 0
    files = os.listdir(os.path.join(runs["out"], "files"))
    assert "log.csv" in files and "ckpt.keras" in files
    with open(os.path.join(runs["out"], "stdout1.txt")) as f:
        assert f.read() == ""  # no progress output on rank 1
    with open(os.path.join(runs["out"], "stdout0.txt")) as f:
        assert "Epoch 1/8" in f.read()
    assert r0["master_only_batches"] > 0 and r1["master_only_batches"] == 0
    # a LambdaCallback's functions (set on the object) obey run_on_all_ranks=False too
    assert r0["lambda_master_only_calls"] > 0 and r1["lambda_master_only_calls"] == 0
    for rank, r in enumerate(runs["ranks"]):
        assert r["tensorboard"] == [False, "tb"]
        assert r["tensorboard_env"] == [True, False, f"tb_env/rank_{rank}"]
        # tnt.keras.callbacks.Callback(TensorBoard(d), run_on_all_ranks=True): each rank writes
        # d/rank_<r> (both ranks' event files used to land in d/train, which TensorBoard shows
        # as one run); run_on_all_ranks unset: on the master only, as unwrapped
        assert r["tensorboard_wrapped"] == [f"tb_all/rank_{rank}", "tb_unset", "tb_one"]
    # a TensorBoard callback in fit wrote its event files, on the master only
    tb = os.path.join(runs["out"], "files", "tb_fit")
    assert os.listdir(os.path.join(tb, "train")) and not any(
        name.startswith("rank_") for name in os.listdir(tb))
    # by one process (events.out.tfevents.<time>.<host>.<pid>.<n>.v2): rank 1 wrote an event
    # file of its own there too, from TensorBoard.set_model (the model's summary), which
    # Keras calls on every rank
    writers = {re.search(r"\.(\d+)\.\d+\.v2$", name).group(1)
               for name in os.listdir(os.path.join(tb, "train"))}
    assert len(writers) == 1, os.listdir(os.path.join(tb, "train"))


def test_master_only_callback_failure_ends_every_rank_at_once(tmp_path):
    """The master's callback raises and the master survives (it handled the
    error): rank 1 fails within seconds (not TNT_TIMEOUT_S=60) with a
    PeerLostError that names rank 0 and the callback's error."""
    result = run_ranks(2, "features.py", "--out", tmp_path, "--callback-failure",
                       env={"TNT_TIMEOUT_S": 60}, check=False)
    assert result.returncode != 0
    master = json.load(open(os.path.join(tmp_path, "failure0.json")))
    other = json.load(open(os.path.join(tmp_path, "failure1.json")))
    assert master["error"] == "RuntimeError" and "boom" in master["message"]
    assert other["error"] == "PeerLostError" and other["rank_blamed"] == 0, other
    assert "boom in a master-only callback" in other["message"] and "Boom.on_epoch_end" in \
        other["message"], other["message"]
    assert other["seconds"] < 30, other


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """One 2-rank launch of features.py's check_slow_teardown, then its check_slow_master, at
    TNT_TIMEOUT_S=5 (TensorFlow takes seconds per process to start): the folder of their
    results, for the two tests below."""
    out = tmp_path_factory.mktemp("slow")
    run_ranks(2, "features.py", "--out", out, "--slow-teardown", "--slow-master", env={"TNT_TIMEOUT_S": 5})
    return out


def test_saves_on_the_master_longer_than_the_timeout_are_waited_for(slow_run):
    """A ModelCheckpoint's save on the master (every rank's, and one on the
    master only) takes TNT_TIMEOUT_S + 3 s: the other rank waits for the
    master, busy on its own, instead of failing with a TimeoutError at
    TNT_TIMEOUT_S (the master's save on a slow file system ended the job).
    On the 2-core CI machine one rank came to the barrier after fit 5 to 10 s
    after the other, now and then (at TNT_TIMEOUT_S=5, then 10): TensorFlow
    dropping fit's tf.data iterator, which now counts as the rank's own work
    (the next test); so it runs at 5 s again, in that test's launch."""
    for rank in (0, 1):
        result = json.load(open(os.path.join(slow_run, f"slow{rank}.json")))
        assert result == {"error": None, "files": ["slow_all.keras", "slow_master.keras"],
                          "checkpoint": ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]}, result


def test_keras_work_between_hooks_longer_than_the_timeout_is_waited_for(slow_run):
    """On rank 1 Keras takes TNT_TIMEOUT_S + 1 s between the callback hooks
    (features.py's check_slow_teardown: replacing and dropping tf.data
    iterators, where TensorFlow 2.21 can take up to 60 s), three times: rank 0
    waits each time instead of failing with a TimeoutError at TNT_TIMEOUT_S
    (the flaky end of the test above, rank 1 late to the barrier after fit),
    also for the iterator of a fit that a callback stopped early, which the
    garbage collector drops; and both ranks end with the same logs and
    predictions."""
    results = [json.load(open(os.path.join(slow_run, f"teardown{rank}.json"))) for rank in (0, 1)]
    for result in results:
        assert result["error"] is None, result
    assert results[0]["stalls"] == ["stopped fit returned"]
    # Keras 3.15 replaces the iterator after the last batch of each epoch (training and
    # validation), again as epoch 2 begins, and after evaluate's and predict's last batch; it
    # drops fit's validation and training ones and evaluate's and predict's; the stopped fit's
    # is dropped before it returns, by the garbage collector. Every stall in a section of its own.
    assert results[1]["stalls"] == [["replaced", True]] * 5 + [["dropped", True]] * 2 + [
        ["replaced", True], ["dropped", True]] * 2 + [["dropped", True], "stopped fit returned"], \
        results[1]["stalls"]
    for key in ("history", "evaluated", "predicted", "stopped"):
        assert results[0][key] == results[1][key], key
    assert len(results[0]["stopped"]["loss"]) == 1
    assert len(results[0]["history"]["val_loss"]) == 2


def test_aggregate_logs_false_gives_local_logs(runs):
    r0, r1 = (r["callbacks"] for r in runs["ranks"])
    local0, local1, glob = r0["local_epochs"][0], r1["local_epochs"][0], r0["everywhere"][0]
    assert local0["loss"] != local1["loss"]
    assert local0["val_loss"] != local0["loss"]
    # the global loss is the sample-weighted mean of the ranks' local losses (90 = 45 + 45)
    assert glob["loss"] == pytest.approx((local0["loss"] + local1["loss"]) / 2, rel=1e-5)
    # a LambdaCallback's on_epoch_end (set on the object) gets the local logs too
    assert r0["lambda_local_epochs"] == r0["local_epochs"]
    assert r1["lambda_local_epochs"] == r1["local_epochs"]
    # on_train_end gets the last epoch's metrics, local as well (they were the global ones)
    for r in (r0, r1):
        end, last = r["local_train_end"], r["local_epochs"][-1]
        assert end.keys() >= {"loss", "val_loss"} and end == {k: last[k] for k in end}, (end, last)
        end, last = r["everywhere_train_end"], r["everywhere"][-1]
        assert end == {k: last[k] for k in end}, (end, last)


def test_custom_loops_match_serial(runs):
    for key in ("loop_optimizer", "loop_tape"):
        for rank in runs["ranks"]:
            for got, want in zip(rank[key], runs["ref"][key]):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=key)
        assert runs["ranks"][0][key] == runs["ranks"][1][key]


def test_a_loss_scale_around_a_distributed_optimizer_skips_the_steps_serial_training_skips(runs):
    """A LossScaleOptimizer wrapping tnt.DistributedOptimizer (made in a loop,
    or by Keras' compile under mixed_float16) decides on the reduced gradients:
    a step that overflows on one rank only is skipped on every rank, as in
    serial training. Before, the rank whose gradients overflowed skipped the
    step and its allreduce, and its next step's allreduce summed with the
    other rank's previous one (or waited forever); a tnt.Model reduced the
    gradients twice, and a rank with an empty slice submitted one name twice
    (InvalidUsageError)."""
    for key in ("loss_scale_loop", "loss_scale_compile", "loss_scale_tnt_model"):
        ref = runs["ref"][key]
        assert ref["scales"][0] == 2.0 ** 14, ref  # serial training skipped the first step
        for rank in runs["ranks"]:
            assert rank[key]["scales"] == ref["scales"], key
            for got, want in zip(rank[key]["weights"], ref["weights"]):
                np.testing.assert_allclose(got, want, rtol=0, atol=2e-3, err_msg=key)
        assert runs["ranks"][0][key] == runs["ranks"][1][key]


def test_own_compile_and_two_optimizers_match_serial(runs):
    """A model with its own compile() (two optimizers, the GAN pattern) trains
    as in serial Keras; the rank with an empty slice of the last batch still
    takes part in both optimizers' allreduces."""
    _assert_fit_as_serial(runs, "own_compile")


def test_array_fits_trace_the_empty_slice_branch_only_when_a_slice_can_be_empty(runs):
    """fit() on arrays whose every batch has a sample for each rank traces a
    step without the empty-slice branch (a smaller graph, a faster start); a
    fit whose last batch leaves a rank empty traces the step again with it,
    and training matches serial Keras throughout."""
    for rank in runs["ranks"]:
        assert rank["array_fits"]["empty_slice_branch"] == [False, True, False]
    _assert_fit_as_serial(runs, "array_fits")


def test_a_model_wrapped_twice_trains_as_in_serial_keras_by_either_wrapper(runs):
    _assert_fit_as_serial(runs, "wrapped_twice")


def test_arrays_in_lists_train_as_in_serial_keras(runs):
    """x=[a, b] and y=[y1, y2] as lists of arrays (fit, validation, evaluate,
    predict) train as in serial Keras instead of failing in tf.data."""
    ref = runs["ref"]["list_arrays"]
    for rank in runs["ranks"]:
        got = rank["list_arrays"]
        _assert_history_as_serial(got["history"], ref["history"])
        np.testing.assert_allclose(got["evaluate"], ref["evaluate"], rtol=1e-6, atol=1e-6)
        for a, b in zip(got["weights"] + got["predict"], ref["weights"] + ref["predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["list_arrays"] == runs["ranks"][1]["list_arrays"]


def test_arrays_without_targets_train_as_in_serial_keras_and_numbers_are_refused_clearly(runs):
    """fit(x, sample_weight=w) without y trains as serial Keras; a Python list
    of numbers as y is a ValueError on every rank, as in Keras, that says what
    to pass (not an IndexError)."""
    _assert_fit_as_serial(runs, "arrays_without_targets")
    # Keras' fit refuses it too (its train_on_batch takes the list for a structure of numbers:
    # here, where the loss ignores y, it trains; a slice of such a structure has no meaning)
    assert runs["ref"]["arrays_without_targets"]["list_of_numbers"][0] == "ValueError"
    for call in ("list_of_numbers", "list_of_numbers_on_batch"):  # fit, train_on_batch
        for rank in runs["ranks"]:
            kind, message = rank["arrays_without_targets"][call]
            assert kind == "ValueError" and "y[0] is a number, not an array" in message, message
            assert "pass np.asarray(y)" in message


def test_arrays_without_a_batch_size_spread_over_the_steps_as_in_serial_keras(runs):
    """fit(steps_per_epoch), validation_steps, evaluate(steps) and
    predict(steps) on arrays without a batch size take Keras' batches (the
    samples over the steps), not 32: the same History, results and all 90
    predictions as serial Keras."""
    ref = runs["ref"]["array_steps"]
    for rank in runs["ranks"]:
        got = rank["array_steps"]
        assert len(got["predict"]) == len(ref["predict"]) == 90
        for g, r in zip(got["history"], ref["history"]):
            assert g.keys() == r.keys()
            for key, values in r.items():
                np.testing.assert_allclose(g[key], values, rtol=1e-6, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(got["evaluate"], ref["evaluate"], rtol=1e-6, atol=1e-6)
        for a, b in zip(got["weights"] + got["predict"], ref["weights"] + ref["predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["array_steps"] == runs["ranks"][1]["array_steps"]


def test_validation_generators_and_py_datasets_validate_as_in_serial_keras(runs):
    """A generator or PyDataset as validation_data, each rank feeding its part
    (tnt_distribute_validation_dataset=False), validates as serial Keras does
    on the whole batches; distributed, it is refused with a TypeError that
    names validation_data (not a MismatchError about arrays)."""
    ref = runs["ref"]["validation_iterables"]
    for rank in runs["ranks"]:
        got = rank["validation_iterables"]
        for name in ("generator", "py_dataset"):
            assert got[name].keys() == ref[name].keys() and "val_loss" in ref[name], name
            for key, values in ref[name].items():
                np.testing.assert_allclose(got[name][key], values, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{name} {key}")
        kind, message = got["distributed_generator"]
        assert kind == "TypeError" and "validation_data of type generator" in message, message
        assert "tnt_distribute_validation_dataset=False" in message, message


def test_float64_arrays_reach_the_steps_as_float32_as_in_serial_keras(runs):
    """float64 arrays reach a custom step as floatx, as Keras feeds them:
    `y - y_pred` trains as in serial Keras instead of a TypeError."""
    ref = runs["ref"]["float64_arrays"]
    for rank in runs["ranks"]:
        got = rank["float64_arrays"]
        np.testing.assert_allclose(got["history"], ref["history"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["evaluate"], ref["evaluate"], rtol=1e-6, atol=1e-6)
        for a, b in zip(got["weights"] + got["predict"], ref["weights"] + ref["predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["float64_arrays"] == runs["ranks"][1]["float64_arrays"]


def test_own_shards_with_validation_split_validate_each_shards_end_as_in_serial_keras(runs):
    """tnt_distribute_dataset=False with validation_split: each rank validates
    the end of its own shard (no MismatchError), as serial Keras validates
    both ends."""
    assert "val_loss" in runs["ref"]["own_shards_validation_split"]["history"]
    _assert_fit_as_serial(runs, "own_shards_validation_split")


def test_ragged_inputs_train_evaluate_and_predict_as_in_serial_keras(runs):
    """A dataset of ragged samples, with an empty slice in its last batch:
    fit, evaluate and all 33 predictions, in order, as serial Keras; then the
    ragged tensor as arrays (fit with validation_split, evaluate, predict),
    and ragged arrays that differ between ranks are a MismatchError."""
    ref = runs["ref"]["ragged_inputs"]
    for rank in runs["ranks"]:
        got = rank["ragged_inputs"]
        assert len(got["predict"]) == len(ref["predict"]) == len(got["array_predict"]) == 33
        for part in ("history", "array_history"):
            _assert_history_as_serial(got[part], ref[part])
        for part in ("evaluate", "array_evaluate"):
            np.testing.assert_allclose(got[part], ref[part], rtol=1e-6, atol=1e-6, err_msg=part)
        for a, b in zip(got["weights"] + got["predict"] + got["array_predict"],
                        ref["weights"] + ref["predict"] + ref["array_predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        kind, message = got["differ"]
        assert kind == "MismatchError" and "the ranks passed different arrays to predict" in message
    assert runs["ranks"][0]["ragged_inputs"] == runs["ranks"][1]["ragged_inputs"]


def test_string_arrays_train_as_in_serial_keras(runs):
    """An object array of strings and a tf.string tensor as x train and
    predict as in serial Keras (the ranks' arrays check compares them)."""
    ref = runs["ref"]["string_arrays"]
    for rank in runs["ranks"]:
        got = rank["string_arrays"]
        np.testing.assert_allclose(got["history"], ref["history"], rtol=1e-6, atol=1e-6)
        for a, b in zip(got["weights"] + got["predict"], ref["weights"] + ref["predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["string_arrays"] == runs["ranks"][1]["string_arrays"]


def test_class_weights_of_some_classes_weight_the_others_one_as_in_serial_keras(runs):
    """class_weight={0: 2.0} with labels 0-2 on arrays trains as serial Keras
    (the other classes weigh 1), not an InvalidArgumentError."""
    _assert_fit_as_serial(runs, "class_weight_arrays")


@pytest.mark.parametrize("kind", ["pandas", "scipy", "tf_sparse"])
def test_pandas_and_sparse_arrays_train_evaluate_and_predict_as_in_serial_keras(runs, kind):
    """A DataFrame with a Series of labels, a SciPy sparse matrix and a
    tf.SparseTensor: fit (shuffled, validation_split), evaluate, all 41
    predictions in order (and the tf.SparseTensor's *_on_batch calls) as
    serial Keras, every rank alike (not a TypeError)."""
    ref = runs["ref"]["pandas_and_sparse_arrays"]
    if kind not in ref:
        pytest.skip(f"{kind} is not installed")
    ref = ref[kind]
    for rank in runs["ranks"]:
        got = rank["pandas_and_sparse_arrays"][kind]
        _assert_history_as_serial(got["history"], ref["history"])
        np.testing.assert_allclose(got["evaluate"], ref["evaluate"], rtol=1e-6, atol=1e-6)
        assert len(got["predict"]) == 41 and got.keys() == ref.keys()
        if "on_batch" in ref:  # train_on_batch's and test_on_batch's losses, the predictions
            np.testing.assert_allclose(got["on_batch"][:2], ref["on_batch"][:2], atol=1e-6)
            np.testing.assert_allclose(got["on_batch"][2], ref["on_batch"][2], atol=1e-5)
        for a, b in zip(got["weights"] + got["predict"], ref["weights"] + ref["predict"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["pandas_and_sparse_arrays"][kind] == \
        runs["ranks"][1]["pandas_and_sparse_arrays"][kind]


def test_predict_gathers_bool_integer_string_ragged_and_sparse_outputs_as_serial_keras(runs):
    """A model's bool, int8, uint64 and string outputs, and ragged and sparse
    ones: predict (and predict_on_batch) return serial Keras' values, dtypes
    and types on every rank (not a TypeError)."""
    ref = runs["ref"]["predict_output_dtypes"]
    assert {k: ref[k][0] for k in ("int8", "positive", "uint64", "words")} == {
        "int8": "int8", "positive": "bool", "uint64": "uint64", "words": "object"}
    for call in ("predict", "predict_on_batch"):  # ragged and sparse outputs
        assert ref[call]["ragged"][0] == "RaggedTensor" and ref[call]["sparse"][0] == "SparseTensor"
    assert len(ref["predict"]["ragged"][1]) == ref["predict"]["sparse"][3][0] == 41
    for rank in runs["ranks"]:
        assert rank["predict_output_dtypes"] == ref


def test_array_log_entries_are_shown_as_in_serial_keras(runs):
    """A custom step's array entries (one value per sample, a pair per
    sample, one value per feature) on uneven slices, in graph and run
    eagerly, also with an empty slice: serial Keras' values and shapes (the
    global batch's values in order), not a MismatchError about 'tnt.metrics'.
    An array that is neither per sample nor of one length is an error on
    every rank that names it."""
    ref = runs["ref"]["array_logs"]
    for rank in runs["ranks"]:
        got = rank["array_logs"]
        for mode in ("graph", "eager"):
            for key, value in ref[mode].items():
                values = value if isinstance(value, dict) else {"": value}
                gots = got[mode][key] if isinstance(value, dict) else {"": got[mode][key]}
                assert gots.keys() == values.keys(), (mode, key)
                for entry, v in values.items():
                    assert np.shape(gots[entry]) == np.shape(v), (mode, key, entry)
                    np.testing.assert_allclose(gots[entry], v, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{mode} {key} {entry}")
        kind, message = got["one_more_error"]
        assert kind == "InvalidArgumentError", message
        assert "'one_more'" in message and "[19, 18]" in message and "[18, 17]" in message
        assert "Return a scalar, a keras.metrics.Metric's result" in message
    assert runs["ranks"][0]["array_logs"] == runs["ranks"][1]["array_logs"]


def test_metric_states_are_aggregated_as_their_variables_declare(runs):
    """A custom metric's "only_first_replica" state (a step counter) is the
    master's, its "mean" state the ranks' mean: serial Keras' values, where
    every state was summed (twice the steps on 2 ranks)."""
    ref = runs["ref"]["metric_aggregations"]
    assert ref["history"]["steps_seen"] == [4.0, 4.0]
    for rank in runs["ranks"]:
        got = rank["metric_aggregations"]
        assert got["history"].keys() == ref["history"].keys()
        for key, values in ref["history"].items():
            np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, atol=1e-6, err_msg=key)
        assert got["evaluate"].keys() == ref["evaluate"].keys()
        for key, value in ref["evaluate"].items():
            np.testing.assert_allclose(got["evaluate"][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert runs["ranks"][0]["metric_aggregations"] == runs["ranks"][1]["metric_aggregations"]


def test_a_normalization_adapted_on_the_master_computes_with_the_masters_statistics(runs):
    """A Normalization adapted on other data on rank 1: every rank normalises with the
    master's mean and variance, so fit and predict are serial Keras' (not rank 1 with its own)."""
    _assert_fit_as_serial(runs, "adapted_normalization")
    ref = runs["ref"]["adapted_normalization"]
    for rank in runs["ranks"]:
        np.testing.assert_allclose(rank["adapted_normalization"]["predict"], ref["predict"],
                                   rtol=1e-5, atol=1e-5)


def test_validation_arrays_beside_a_dataset_are_batched_as_in_serial_keras(runs):
    """Validation arrays beside a batched dataset, without a validation batch size: batched
    by 32 as serial Keras batches them (not like the dataset), so a test step's tracker of
    batch losses shows serial Keras' val_tracked."""
    _assert_fit_as_serial(runs, "validation_arrays_beside_a_dataset")


def test_fine_tuning_a_tnt_model_used_as_a_layer_trains_as_in_serial_keras(runs):
    """A frozen base (a tnt.Model used as a layer of the model), then unfrozen
    and recompiled with a lower learning rate: serial Keras after each fit."""
    ref = runs["ref"]["transfer_learning"]
    for rank in runs["ranks"]:
        got = rank["transfer_learning"]
        for phase in ("frozen", "fine_tuned"):
            np.testing.assert_allclose(got[phase]["history"], ref[phase]["history"], rtol=1e-6,
                                       atol=1e-6, err_msg=phase)
            for a, b in zip(got[phase]["weights"], ref[phase]["weights"]):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=phase)
        np.testing.assert_allclose(got["predict"], ref["predict"], rtol=1e-5, atol=1e-5)
    assert runs["ranks"][0]["transfer_learning"] == runs["ranks"][1]["transfer_learning"]


def test_fit_in_a_loop_of_one_epoch_each_reshuffles_every_epoch_as_serial_keras(runs):
    """An unseeded shuffle, seeded by tnt, draws a new order at every fit call
    (before: the first epoch's order, every time), as serial Keras' does. A
    subclassed model, which tnt builds before fit, trains on serial Keras'
    orders too (before: building it read a batch, a pass over the dataset,
    and each epoch took the order of serial Keras' next one)."""
    ref = runs["ref"]["epoch_loop"]
    for rank in runs["ranks"]:
        got = rank["epoch_loop"]
        np.testing.assert_allclose(got["history"], ref["history"], rtol=1e-6, atol=1e-6)
        for a, b in zip(got["weights"], ref["weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        sub, sub_ref = got["subclassed"], ref["subclassed"]
        np.testing.assert_allclose(sub["history"], sub_ref["history"], rtol=1e-6, atol=1e-6)
        for a, b in zip(sub["weights"], sub_ref["weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert runs["ranks"][0]["epoch_loop"] == runs["ranks"][1]["epoch_loop"]


def test_a_py_dataset_trains_evaluates_and_predicts_as_serial_keras(runs):
    """keras.utils.PyDataset (refused before) as fit's x and validation_data,
    evaluate's and predict's x, in worker threads and forked worker processes,
    with class weights and an empty slice: serial Keras' logs, weights and
    predictions, the batches shuffled in the master's order on every rank
    (the ranks' own Python random states differ)."""
    _assert_fit_as_serial(runs, "py_datasets")
    ref = runs["ref"]["py_datasets"]
    for rank in runs["ranks"]:
        got = rank["py_datasets"]
        _assert_history_as_serial(got["processes"]["history"], ref["processes"]["history"])
        assert got["threads"]["epoch_ends"] == got["processes"]["epoch_ends"] == ref["threads"]["epoch_ends"]
        np.testing.assert_allclose(got["evaluate"], ref["evaluate"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["predict"], ref["predict"], rtol=1e-5, atol=1e-6)
        assert np.shape(got["predict"]) == (81, 3)


def test_backup_and_restore_resumes_a_preempted_job_as_serial_keras(runs):
    """Keras' BackupAndRestore (refused before): the job preempted at its third
    epoch resumes at epoch 2 and ends with serial Keras' history and weights,
    the backup's files (double_checkpoint) and their removal as serial Keras
    leaves them; a damaged latest backup falls back to the previous one on
    every rank alike (resuming at epoch 1)."""
    _assert_fit_as_serial(runs, "backup_and_restore")
    ref = runs["ref"]["backup_and_restore"]
    assert ref["epochs"] == [2, 3] and ref["fallback_epochs"] == [1, 2, 3], ref
    assert ref["left"] == ["latest.weights.h5", "latest.weights.h5.bkp", "training_metadata.json",
                           "training_metadata.json.bkp"] and ref["removed"], ref
    for rank in runs["ranks"]:
        got = rank["backup_and_restore"]
        for key in ("epochs", "left", "removed", "fallback_epochs"):
            assert got[key] == ref[key], (key, got[key], ref[key])


def test_a_rank_with_an_empty_slice_keeps_up_with_the_others(runs):
    """A rank whose slice of a batch is empty skips the model but must do what
    the others do: update synchronised BatchNormalization's moving statistics
    (they were left behind, so the ranks ended with different weights and
    predicted their rows with stale statistics), name its gradient requests
    as they do (a BatchNormalization over axis 1 left the real branch's kernel
    gradient without a static shape, so the names differed: a timeout), and,
    run eagerly, make the same requests (the first step knew nothing of a
    summed loss's normaliser, later ones summed the weights once more: a
    timeout; a tracker updated with one value skipped the batch sizes' sum in
    the first step: a timeout), also after a compile or a freeze since the
    earlier steps (it replayed them: the old optimizer applied, its weights
    apart from the others' without a word; the new metrics unbuilt, an error
    on that rank; requests named after the unfrozen variables: a timeout)."""
    ref = runs["ref"]["empty_slices"]
    for rank in runs["ranks"]:
        got = rank["empty_slices"]
        for key in ("batch_norm_weights", "eager_weights", "recompiled_weights"):
            for a, b in zip(got[key], ref[key]):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(got["batch_norm_predict"], ref["batch_norm_predict"],
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["eager_losses"], ref["eager_losses"], rtol=1e-6)
        np.testing.assert_allclose(got["eager_tracked"], ref["eager_tracked"], rtol=1e-6)
        np.testing.assert_allclose(got["recompiled_losses"], ref["recompiled_losses"], rtol=1e-6)
        own, own_ref = got["own_collectives"], ref["own_collectives"]
        for a, b in zip(own["weights"], own_ref["weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg="own_collectives")
        for key in ("loss", "mean_logit"):
            np.testing.assert_allclose(own["history"][key], own_ref["history"][key], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(own["evaluated"][key], own_ref["evaluated"][key], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(own["predicted"], own_ref["predicted"], rtol=1e-4, atol=1e-5)
    assert runs["ranks"][0]["empty_slices"] == runs["ranks"][1]["empty_slices"]


def test_monte_carlo_dropout_in_predict_draws_the_serial_noise(runs):
    """A Dropout called with training=True draws in predict the noise of the global batch, as
    serial Keras (uncompiled; compiled and run eagerly on rank 1; a last batch of 1 sample);
    before, ranks seeded alike drew the same noise for their slices, and rank 1's predictions
    of a repeated input repeated rank 0's. A synchronised BatchNormalization called with
    training=True normalises with the global batch's statistics, to which rank 1's stand-in
    sample of the last batch adds nothing (before: the last row 1.9 off)."""
    ref = runs["ref"]["monte_carlo_dropout"]
    for rank in runs["ranks"]:
        for key in ("uncompiled", "eager_on_1", "batch_statistics"):
            np.testing.assert_allclose(rank["monte_carlo_dropout"][key], ref[key], rtol=1e-5, atol=1e-5,
                                       err_msg=key)
        for a, b in zip(rank["monte_carlo_dropout"]["batch_statistics_weights"], ref["batch_statistics_weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert len(np.unique(np.round(ref["uncompiled"], 5), axis=0)) > 30  # the draws differ
    assert runs["ranks"][0]["monte_carlo_dropout"] == runs["ranks"][1]["monte_carlo_dropout"]


def test_predict_of_an_output_that_is_not_one_row_per_sample_fails_on_every_rank(runs):
    """An output of shape (3,) (a statistic of the batch) came back with every rank's 3 values
    (12 where serial Keras gives 6), without a word; now an error on every rank, traced and eager."""
    for rank in runs["ranks"]:
        for how, case in rank["outputs_not_one_row_per_sample"].items():
            assert case["error"] == "InvalidArgumentError", (how, case)
            assert "tnt.Model.predict: an output of the model (of shape (3,)) does not have one row per sample" \
                in case["message"], (how, case)


def test_a_rank_with_an_empty_slice_gathers_no_row_of_a_scalar(runs):
    """A layer's allgather of a scalar per rank in the last batch, where rank 1's slice is empty:
    the empty rank sent a zero row (evaluate's replay, predict's stand-in), and the mean of the
    gathered means was halved: evaluate's loss 0.0740 where serial Keras gives 0.0715, without a
    word. Now as serial Keras, traced and with rank 1 run eagerly."""
    for rank in runs["ranks"]:
        case = rank["scalar_gather_on_an_empty_slice"]
        for how in ("traced", "eager_on_1"):
            assert abs(case[how]["loss"] - case["serial_loss"]) < 1e-6, (how, case)
            np.testing.assert_allclose(case[how]["predict"], case["serial_predict"], atol=1e-6)


def test_a_broadcast_from_a_rank_with_an_empty_slice_fails_on_every_rank(runs):
    """A tarantella.tensorflow.broadcast rooted at rank 1 where its slice of the last batch is
    empty (in a layer: predict, traced and run eagerly on rank 1; fit with rank 1 eager;
    evaluate, named; in a train_step of its own): every rank raises the InvalidUsageError that
    names the cause, before TNT_TIMEOUT_S (60 s); before the fix, rank 1 alone failed and rank 0
    waited in the broadcast until TNT_TIMEOUT_S. Rooted at rank 0, predict is right."""
    results = [r["broadcast_from_an_empty_slice"] for r in runs["ranks"]]
    for got in results:
        for key in ("layer_predict", "layer_predict_eager_on_1", "layer_fit_eager_on_1",
                    "layer_evaluate_named", "own_train_step"):
            case = got[key]
            assert case["error"] == "InvalidUsageError", (key, case)
            where = "tnt.Model.predict" if "predict" in key else "a tnt.Model step"
            assert f"tnt.broadcast from root 1 in {where}, where rank 1's slice of the batch is empty" \
                in case["message"], (key, case)
            assert case["seconds"] < 60, (key, case)  # TNT_TIMEOUT_S: no rank waited for it
        predicted, dense = (np.array(got["from_rank_0"][k]) for k in ("predicted", "dense"))
        # each global batch of 20 (the last of 1): its rows plus the sum of rank 0's slice
        expected = np.concatenate([dense[a:b] + dense[a:a + mine].sum(0)
                                   for a, b, mine in ((0, 20, 10), (20, 40, 10), (40, 41, 1))])
        np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-5)
    assert results[0]["from_rank_0"] == results[1]["from_rank_0"]


def test_save_and_load(runs):
    for rank in runs["ranks"]:
        s = rank["save_load"]
        assert s["loaded_is_tnt"] and s["loaded_optimizer"] == "SGD"
        assert s["same_weights"] and s["same_iterations"] and s["resumed_max_diff"] == 0.0
        assert s["uncompiled_compiled"] is False and s["uncompiled_file_layers"] == 2
        assert s["weights_roundtrip"] and s["from_config_layers"] == 2
        assert s["from_json_is_tnt"] and s["model_from_config_is_tnt"] and s["clone"] == [True, True]
        assert s["set_weights_value"] == 1.0  # the master's values win
        # keras.saving.save_model / save_weights of the tnt.Model: its plain Keras file, whole
        assert s["keras_save_model"] == ["Sequential", "SGD", True]
        assert s["keras_save_weights"] is True
        assert s["exported_max_diff"] < 1e-6  # model.export, read on every rank
        # tf.saved_model.save on every rank: written by the master, atomically
        assert s["tf_saved_model_files"] == [] and s["tf_saved_model_max_diff"] < 1e-6
    assert runs["ranks"][0]["save_load"]["master_only_load"] == "SGD"
    # saved inside a master-only callback, by tnt.Model.save and by save_model of the plain model
    assert runs["ranks"][0]["save_load"]["master_callback_saved"] == ["master_cb.keras", "master_cb_plain.keras"]
    files = os.listdir(os.path.join(runs["out"], "files"))
    bad = os.path.join(runs["out"], "files", "no_extension")
    for rank in runs["ranks"]:  # the same error on every rank, naming the user's path
        model_error, weights_error = rank["save_load"]["bad_paths"]
        assert f"filepath='{bad}.keras'. Received: filepath='{bad}'" in model_error
        assert f"filepath='{bad}.weights.h5'. Received: filepath='{bad}'" in weights_error
    assert runs["ranks"][0]["save_load"]["bad_paths"] == runs["ranks"][1]["save_load"]["bad_paths"]
    # keywords Keras 3 refuses: the same error on every rank, and nothing written
    model_kw, weights_kw, plain_kw = runs["ranks"][0]["save_load"]["bad_keywords"]
    assert model_kw.startswith("ValueError") and "['options', 'signatures']" in model_kw
    assert weights_kw.startswith("TypeError") and "['save_format']" in weights_kw
    assert plain_kw.startswith("ValueError") and "['save_traces']" in plain_kw
    assert runs["ranks"][0]["save_load"]["bad_keywords"] == \
        runs["ranks"][1]["save_load"]["bad_keywords"]
    assert not {"kw.keras", "kw.weights.h5", "kw_plain.keras"} & set(files)
    assert "no_extension" not in files
    assert {"legacy.h5", "after_h5_plain.keras"} <= set(files)  # after a legacy .h5 save
    assert "by_rank0.keras" in files and "by_rank1.keras" not in files  # master only
    assert {"all_rank0.keras", "all_rank1.keras"} <= set(files)  # tnt_save_all_devices
    assert not [f for f in files if f.startswith(".")]  # no temporary files left
    assert "exported" in files


def test_a_rank_that_loads_a_stale_file_ends_with_the_masters_full_state(runs):
    """Each rank loaded its own file (a stale copy, no shared filesystem):
    load_model and load_weights broadcast the master's optimizer state and
    generator seeds with the weights (the optimizer state differed)."""
    first, second = (rank["stale_file_loads"] for rank in runs["ranks"])
    for how in ("load_model", "load_weights"):
        assert first[how]["weights"] == second[how]["weights"]
        assert first[how]["optimizer"] == second[how]["optimizer"], how
        assert first[how]["seeds"] and first[how]["seeds"] == second[how]["seeds"], how
        assert first[how]["optimizer"][0] == 3  # the master's iterations: 1 epoch of 3 steps


def test_warnings_and_xla(runs):
    master = runs["ranks"][0]["misc"]
    assert master["jit_compile"] is False and master["xla_info"]


def test_a_summary_given_a_print_fn_reaches_it_on_every_rank(runs):
    counts = [r["misc"]["summary_lines"] for r in runs["ranks"]]
    assert counts[0] > 0 and counts == [counts[0]] * len(counts), counts


def test_a_csv_logger_on_every_rank_writes_a_file_of_its_own_or_is_refused(runs):
    for r in runs["ranks"]:
        assert "ranks [0, 1] would write one file together" in r["misc"]["csv_shared"]
        assert r["misc"]["csv_own"] is None
    files = os.listdir(os.path.join(runs["out"], "files"))
    assert "shared.csv" not in files
    for rank in range(2):
        with open(os.path.join(runs["out"], "files", f"own-{rank}.csv")) as f:
            assert len(f.read().splitlines()) == 3  # its header and 2 epochs


def test_broadcast_variables_refuses_lists_that_differ_and_assigns_the_roots_values(runs):
    for r in runs["ranks"]:
        misc = r["misc"]
        # same count, other shapes: refused; before, the root's values were assigned reshaped
        assert misc["broadcast_shapes"] == "MismatchError", misc["broadcast_shapes"]
        assert misc["broadcast_empty"] == "MismatchError", misc["broadcast_empty"]  # not a timeout
        assert misc["broadcast_values"] == [[[1.0] * 3] * 2, 2, True], misc["broadcast_values"]


def test_unsynchronised_batch_norm_warns_and_ranks_end_alike(runs):
    """Plain BatchNormalization with micro-batches of 20 and 19: a warning that
    says its statistics are per rank and how to synchronise them, and both
    ranks end with bitwise the same weights, moving statistics included."""
    master = runs["ranks"][0]["misc"]
    assert master["batch_norm_warning"], "no BatchNormalization warning"
    assert "micro-batch of 20 samples" in master["batch_norm_warning"][0]
    assert "synchronized=True" in master["batch_norm_warning"][0]
    assert runs["ranks"][1]["misc"]["batch_norm_weights"] == master["batch_norm_weights"]
    # frozen (trainable=False): it normalises with its moving statistics, as in serial Keras,
    # so no warning, and they are not averaged over the ranks (which rounded them every step)
    for rank in runs["ranks"]:
        assert rank["misc"]["frozen_batch_norm"] == {"warning": [], "statistics_kept": [True, True]}


def test_gradient_allreduce_overlaps_backprop(runs):
    """Buckets are submitted in backprop order as their gradients appear; the
    first bucket's ALLREDUCE starts before the last bucket is even submitted
    (on some step: a rank that waits for a late peer may submit all at once)."""
    steps = runs["ranks"][0]["overlap"]["steps"]
    for rank in (0, 1):
        tl = timeline(os.path.join(runs["out"], f"trace.rank{rank}.json"), "tnt.overlap.b")
        buckets = sorted({int(n.split(".")[2][1:]) for n in tl})
        assert len(buckets) >= 3, sorted(tl)
        first = [v for n, v in tl.items() if n.startswith(f"tnt.overlap.b{buckets[0]}.")]
        last = [v for n, v in tl.items() if n.startswith(f"tnt.overlap.b{buckets[-1]}.")]
        for phases in first + last:
            assert len(phases["NEGOTIATE"]) == steps and len(phases["ALLREDUCE"]) == steps
        overlapped = 0
        for step in range(steps):
            first_allreduce = min(p["ALLREDUCE"][step][0] for p in first)
            last_submitted = max(p["NEGOTIATE"][step][0] for p in last)
            # buckets are submitted in backprop order (automatic control dependencies)
            assert min(p["NEGOTIATE"][step][0] for p in first) <= last_submitted
            overlapped += first_allreduce < last_submitted
        assert overlapped >= 1, f"rank {rank}: no step overlapped communication with backprop"


def test_default_fusion_packs_small_gradients_into_one_request(runs):
    """At the default TNT_FUSION_THRESHOLD_KB (1 MiB) the small models' 4 or 6
    gradients (under 1 KiB each) are reduced together: one request per model
    (tnt.grads.<digest>.b0.0), one ALLREDUCE per step. test_serial_equivalence
    checks that 0 sends each gradient alone."""
    steps = runs["ranks"][0]["callbacks"]["epochs_run"] * 5  # 90 samples, global batch 20
    for rank in (0, 1):
        tl = timeline(os.path.join(runs["out"], f"trace.rank{rank}.json"), "tnt.grads.")
        # the buckets (not the weights' sum, "<digest>.w"; a digest may start with "b")
        tl = {name: phases for name, phases in tl.items() if re.search(r"\.b\d+\.\d+$", name)}
        assert tl and all(name.endswith(".b0.0") for name in tl), sorted(tl)
        # the callbacks model (and the same model's later fits and custom loop)
        assert max(len(phases["ALLREDUCE"]) for phases in tl.values()) >= steps


def test_unseeded_numpy_shuffle_is_fresh_per_run_and_the_same_on_every_rank(runs):
    """fit(x, y, shuffle=True) with no global seed, twice, 30 samples, global
    batch 7 on 2 ranks: in every epoch the ranks' slices make up a permutation
    of all samples (every rank shuffled alike), the first run's order differs
    from the second's, and each run reshuffles every epoch (serial Keras does)."""
    per_rank = [rank["unseeded_shuffle"] for rank in runs["ranks"]]
    orders = []
    for run in range(2):
        steps = [a + b for a, b in zip(per_rank[0][run], per_rank[1][run])]
        assert len(steps) == 10, steps  # 2 epochs of 5 steps (7, 7, 7, 7, 2)
        epochs = [sum(steps[:5], []), sum(steps[5:], [])]
        for epoch in epochs:
            assert sorted(epoch) == list(range(30)), epoch
        assert epochs[0] != epochs[1]
        orders.append(epochs)
    assert orders[0] != orders[1]


def test_a_change_to_the_model_on_some_ranks_only_fails_every_rank_at_the_epochs_end(runs):
    # tnt.Model.fit checks after every epoch that the ranks' trainable weights and optimizer
    # variables agree (keras/callbacks/replica_check.py)
    r0, r1 = (r["replicas"] for r in runs["ranks"])
    for key in ("learning_rate", "kernel"):
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key  # the same verdict on every rank
        assert r0[key]["message"].startswith("the ranks' replicas differ after epoch 1 of fit: "), r0[key]
        assert "on some ranks only" in r0[key]["message"], r0[key]
        # raised at the first epoch's end, after the user's callbacks (History recorded it)
        assert r0[key]["epochs_run"] == r1[key]["epochs_run"] == 1
    # what differs, with the values where they are numbers (Keras numbers the layers' and
    # optimizers' names: sgd_3, sequential_2)
    assert re.search(r"sgd(_\d+)?/learning_rate \(rank 0: 0\.0099999997\d*, rank 1: 0\.100000001\d*\)",
                     r0["learning_rate"]["message"]), r0["learning_rate"]
    assert re.search(r"sequential(_\d+)?/dense(_\d+)?/kernel \(ranks \[1\] differ from rank 0\)",
                     r0["kernel"]["message"]), r0["kernel"]
    # only the kernel: its momentum follows the summed gradients, which every rank shares
    assert "momentum" not in r0["kernel"]["message"] and "more" not in r0["kernel"]["message"]
    # arrays that differ between ranks: refused when fit starts, before any step
    arrays, length = r0["arrays"], r0["arrays_length"]
    assert arrays["error"] == r1["arrays"]["error"] == "MismatchError", (arrays, r1["arrays"])
    assert arrays["message"].startswith("the ranks passed different arrays to fit: x (ranks [1] differ "
                                        "from rank 0). Each rank takes its slice"), arrays
    # the same rows shuffled on each rank: fit trained each rank on its slice of its own order, without a word
    shuffled = r0["arrays_shuffled"]
    assert shuffled["error"] == r1["arrays_shuffled"]["error"] == "MismatchError", (shuffled, r1["arrays_shuffled"])
    assert shuffled["message"].startswith("the ranks passed different arrays to fit: x (ranks [1] differ from "
                                          "rank 0); y (ranks [1] differ from rank 0)"), shuffled
    assert length["error"] == r1["arrays_length"]["error"] == "MismatchError", (length, r1["arrays_length"])
    assert "in the number, shapes or dtypes of the arrays" in length["message"], length
    # variables named apart by Keras' per-process counters are still the same replicas
    assert r0["master_built_more"] == r1["master_built_more"] == {"error": None}, r0["master_built_more"]
    assert "this rank's: x float32(90, 8), y int32(90,)" in length["message"], length
    assert "this rank's: x float32(80, 8), y int32(80,)" in r1["arrays_length"]["message"]


def test_a_callback_that_stops_on_one_rank_stops_every_rank_after_the_same_step(runs):
    # keras/callbacks/stop_agreement.py: before, the stopping rank left the loop and the others
    # waited for its next step until TNT_TIMEOUT_S (60 s here), then failed
    r0, r1 = (r["stops"] for r in runs["ranks"])
    # 90 samples in batches of 20: 5 steps an epoch
    assert r0["fit_epoch"]["epochs_run"] == r1["fit_epoch"]["epochs_run"] == 1, (r0, r1)
    assert r0["fit_epoch"]["steps"] == r1["fit_epoch"]["steps"] == 5
    assert r0["fit_batch"]["epochs_run"] == r1["fit_batch"]["epochs_run"] == 1
    assert r0["fit_batch"]["steps"] == r1["fit_batch"]["steps"] == 2  # batches 0 and 1
    for key in ("fit_epoch", "fit_batch"):
        assert r0[key]["weights"] == r1[key]["weights"], key  # one model
        assert r0[key]["seconds"] < 30 and r1[key]["seconds"] < 30, key  # not a timeout's end
    # evaluate stopped after its first batch on every rank: the logs of that batch only
    assert r0["evaluate"] == r1["evaluate"] != r0["evaluate_full"], (r0, r1)
    assert r0["predict_rows"] == r1["predict_rows"] == 2 * 20  # batches 0 and 1, of every rank
    for r in (r0, r1):  # the same word on every rank (tntrun shows the master's)
        said = "\n".join(r["warnings"])
        assert "fit stops on every rank after epoch 1: rank(s) [0] set model.stop_training" in said, said
        assert "fit stops on every rank after batch 1: rank(s) [1] set model.stop_training" in said, said
        assert "evaluate stops on every rank after batch 0: rank(s) [0] set model.stop_evaluating" in said
        assert "predict stops on every rank after batch 1: rank(s) [1] set model.stop_predicting" in said


def test_non_trainable_state_that_ranks_update_apart_is_warned_about_once(runs):
    for r in runs["ranks"]:
        state = r["rank_state"]
        assert state["alike"] == [], state["alike"]  # averaged BN statistics, per-rank seeds: no word
        assert len(state["total"]) == 1, state["total"]  # once per fit, not every epoch
        assert state["total"][0].startswith("the ranks' non-trainable state differs after epoch 1 of fit: ")
        assert "total (rank 0: " in state["total"][0] and "tnt.allreduce" in state["total"][0]


def test_inputs_that_would_take_different_numbers_of_steps_fail_every_rank_before_the_first(runs):
    # tnt.Model compares what fixes each rank's number of steps (data/step_counts.py): every
    # step is collective, so these used to wait until TNT_TIMEOUT_S with no word of the cause
    r0, r1 = (r["step_counts"] for r in runs["ranks"])
    expected = {
        "dataset_length": "fit: the batches of x (rank 0: 5, rank 1: 6)",
        "own_shards": "evaluate: the batches of x (rank 0: 3, rank 1: 2)",
        "epochs": "fit: epochs (rank 0: 2, rank 1: 1)",
        "input_type": "fit: the type of x (rank 0: a tf.data.Dataset, rank 1: arrays); batch_size "
                      "(rank 0: None, rank 1: 20)",
        "batch_size": "fit: batch_size (rank 0: 20, rank 1: 40)",
        "class_weight": "fit: class_weight (ranks [1] differ from rank 0)",
        "validation_length": "fit: the batches of validation_data (rank 0: 5, rank 1: 6)",
    }
    for key, what in expected.items():
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key  # the same verdict on every rank
        assert r0[key]["message"].startswith(
            f"the ranks would take different numbers of steps in {what}. Every step is "
            "collective"), (key, r0[key]["message"])
    # not refused: steps_per_epoch sets the steps, and a filter's batches tf.data cannot count
    for key in ("bounded", "filtered"):
        assert r0[key] == r1[key] == {"error": None}, (key, r0[key], r1[key])


def test_unnamed_tf_collectives_pair_up_whichever_trace_each_rank_runs(runs):
    """Unnamed collectives in a tf.function are named when they run, as eager
    calls are (api.md), whichever trace runs them. Before, one count over all
    traces named them: rank 0, which retraced the step for its 13 samples,
    submitted names rank 1 never did, and both waited until TNT_TIMEOUT_S.
    Threads that each trace a function of one name pair with their namesakes
    (as the NumPy collectives' unnamed calls do)."""
    r0, r1 = (rank["unnamed_tf_collectives"] for rank in runs["ranks"])
    assert (r0["traces"], r1["traces"]) == (2, 1)  # the case is real: the ranks traced apart
    x = list(map(float, range(99)))
    for got in (r0, r1):
        assert got["gathered"] == [x[i:i + 25] for i in range(0, 99, 25)]
        assert got["counts"] == [25.0, 25.0, 25.0, 24.0]
        assert got["threads"] == [[20.0 * t + 1.0] * 20 for t in range(3)]


def test_threads_that_each_train_a_model_at_once_match_serial_training(runs):
    """Four threads per rank, each a custom loop of its own model with its own
    optimizer's name. Before, each step's last wait blocked in one of
    TensorFlow's inter-op threads (2 here): rank 0's waits held both for
    requests whose start ops rank 1 could not run, its inter-op threads held
    by waits of other threads, and the other way round, until TNT_TIMEOUT_S
    (3 runs of 3 before). Now one wait of a process blocks at a time, for at
    most a second, and the others hand off to the completion thread."""
    if runs["ranks"][0]["threads_training_named"] is None:
        pytest.skip("the compiled TensorFlow ops are not used here (numpy_function path: keras.md)")
    for rank in runs["ranks"]:
        for got in rank["threads_training_named"]:
            assert not isinstance(got, str) and got < 1e-6, rank["threads_training_named"]


def test_threads_that_each_train_a_model_under_default_names_match_serial_training(runs):
    """The same without names: a DistributedOptimizer's, a DistributedGradientTape's
    and broadcast_variables' default names end in "@<thread name>" in a thread
    other than the main one. Before, every thread used one name: threads'
    broadcasts were refused as in flight twice, and rank 0's thread paired with
    rank 1's other thread, training on a mix of two models' gradients without a
    word (weights 0.1 and 1.2 from the serial replay)."""
    if runs["ranks"][0]["threads_training_unnamed"] is None:
        pytest.skip("the compiled TensorFlow ops are not used here (numpy_function path: keras.md)")
    for rank in runs["ranks"]:
        for got in rank["threads_training_unnamed"]:
            assert not isinstance(got, str) and got < 1e-6, rank["threads_training_unnamed"]


def test_a_call_or_compile_on_some_ranks_only_fails_every_rank_when_the_call_begins(runs):
    # call_agreement.py: the ranks used to wait for each other until TNT_TIMEOUT_S (60 s here),
    # for requests the others never made
    r0, r1 = (r["rank_branches"] for r in runs["ranks"])
    lead = "the ranks are not in the same call on one model: "
    expected = {
        "evaluate_on_master": "the call (rank 0: evaluate, rank 1: fit)",
        "frozen_on_one_rank": "the number of trainable variables (rank 0: 4, rank 1: 2); the "
                              "trainable variables' shapes and dtypes (ranks [1] differ from rank 0)",
        "compiled_on_master": "whether the model broadcasts the master's weights first, as after "
                              "compile, set_weights or load_weights (rank 0: True, rank 1: False); "
                              "what compile was given (loss, metrics, optimizer and its settings) "
                              "(ranks [1] differ from rank 0)",
        "loss_per_rank": "what compile was given (loss, metrics, optimizer and its settings) "
                         "(ranks [1] differ from rank 0)",
        # a model built with other settings on each rank: different computations, summed
        "rate_per_rank": "the layers' settings (each layer's class and config; a lookup layer's "
                         "vocabulary) (ranks [1] differ from rank 0)",
        "vocabulary_per_rank": "the layers' settings (each layer's class and config; a lookup "
                               "layer's vocabulary) (ranks [1] differ from rank 0)",
        # Keras calls the (collective) callbacks every steps_per_execution steps
        "steps_per_execution_per_rank": "compile's steps_per_execution (rank 0: 1, rank 1: 2)",
        # the *_on_batch calls, on their first call of each kind after compile
        "on_batch_loss_per_rank": "what compile was given (loss, metrics, optimizer and its "
                                  "settings) (ranks [1] differ from rank 0)",
        "test_on_batch_on_master": "the call (rank 0: test_on_batch, rank 1: train_on_batch)",
        "on_batch_frozen_on_one_rank": "the number of trainable variables (rank 0: 4, rank 1: 2); "
                                       "the trainable variables' shapes and dtypes (ranks [1] "
                                       "differ from rank 0)",
        # and on every later *_on_batch call: a learning rate set on one rank trained the ranks'
        # weights apart, a compile on the master only waited until TNT_TIMEOUT_S
        "on_batch_rate_on_one_rank": "what compile was given (loss, metrics, optimizer and its "
                                     "settings) (ranks [1] differ from rank 0)",
        "on_batch_compiled_on_master": "whether the model broadcasts the master's weights first, "
                                       "as after compile, set_weights or load_weights (rank 0: "
                                       "True, rank 1: False); what compile was given (loss, "
                                       "metrics, optimizer and its settings) (ranks [1] differ "
                                       "from rank 0)",
        "thread_per_rank": "the thread that makes the call (its name) (ranks [1] differ from "
                           "rank 0)",
    }
    for key, what in expected.items():
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key  # the same verdict on every rank
        assert r0[key]["message"].startswith(lead + what + ". fit, evaluate, predict, the "
                                             "*_on_batch calls, save, save_weights, load_weights, "
                                             "set_weights and tnt.models.load_model are collective"), \
            (key, r0[key]["message"])
    for key in ("frozen_everywhere", "on_batch_alike", "extra_model_on_master", "built_on_master_only",
                "built_alike_named_apart"):
        assert r0[key] == r1[key] == {"error": None}, (key, r0[key], r1[key])
    # a tnt.Model call in another thread while one is in fit: refused at once on every rank
    for r in (r0, r1):
        said = r["threads_at_once"]
        assert said["error"] == "InvalidUsageError", said
        assert said["message"].startswith("fit was called in thread 'MainThread' while thread "
                                          "'held' is in a call of a tnt.Model"), said
    # each rank's own batch: the ranks' slices of different batches trained together silently
    for key, what in (("on_batch_own_data", "train_on_batch"), ("predict_on_batch_own_size",
                                                               "predict_on_batch"),
                      ("on_batch_own_sparse_data", "train_on_batch")):
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key
        assert r0[key]["message"].startswith(
            f"the ranks passed different batches to {what}: the batch's arrays (their shapes, "
            "dtypes and values) (ranks [1] differ from rank 0). Every rank passes the same global "
            "batch"), (key, r0[key]["message"])
    # another model of the same shapes on one rank: its gradients were averaged with the model's
    # (on_batch_other_model: after both models' train_on_batch had agreed)
    for key in ("other_model_on_one_rank", "on_batch_other_model"):
        other = r0[key]
        assert other["error"] == r1[key]["error"] == "MismatchError", (key, other)
        assert other["message"] == r1[key]["message"], key
        assert re.match(re.escape(lead + "which tnt.Model it is (each rank numbers its models in "
                                  "the order of their first fit, evaluate, predict or *_on_batch "
                                  "call) ") + r"\(rank 0: (\d+), rank 1: (\d+)\)\. fit",
                        other["message"]), (key, other["message"])


def test_a_call_compares_itself_its_arguments_and_checkpoints_in_one_round(runs):
    # call_agreement.check carries the step counts' arguments and fit's ModelCheckpoint count:
    # they were three allgathers of their own at the start of every fit (two in evaluate, predict)
    for rank in (0, 1):
        names = set(timeline(os.path.join(runs["out"], f"trace.rank{rank}.json"), "tnt."))
        assert "tnt.call" in names and "tnt.steps.fit.batches" in names, sorted(names)
        assert not [n for n in names if n.endswith(".arguments") or ".checkpoints" in n], sorted(names)


def test_a_checkpoint_on_the_master_only_fails_every_rank_before_the_first_step(runs):
    # its save waits for the other ranks: they used to wait until TNT_TIMEOUT_S
    r0, r1 = (r["master_only_checkpoints"] for r in runs["ranks"])
    assert r0["guarded"]["error"] == r1["guarded"]["error"] == "MismatchError", (r0, r1)
    assert r0["guarded"]["message"] == r1["guarded"]["message"]
    said = r0["guarded"]["message"]
    assert said.startswith("fit was given ModelCheckpoint callbacks on some ranks only "
                           "(rank 0: 1, rank 1: 0)"), said
    assert "is_master_rank()" in said and "run_on_all_ranks=False" in said, said
    said = r0["restoring_stop"]["message"]
    assert r0["restoring_stop"]["error"] == r1["restoring_stop"]["error"] == "MismatchError", said
    assert said == r1["restoring_stop"]["message"]
    assert said.startswith("fit was given EarlyStopping callbacks with restore_best_weights=True on "
                           "some ranks only (rank 0: 1, rank 1: 0)"), said
    said = r0["rate_on_master"]["message"]
    assert r0["rate_on_master"]["error"] == r1["rate_on_master"]["error"] == "MismatchError", said
    assert said == r1["rate_on_master"]["message"]
    assert said.startswith("fit was given callbacks that set the learning rate (LearningRateScheduler, "
                           "ReduceLROnPlateau) on some ranks only (rank 0: 1, rank 1: 0)"), said
    said = r0["backup_on_master"]["message"]
    assert r0["backup_on_master"]["error"] == r1["backup_on_master"]["error"] == "MismatchError", said
    assert said == r1["backup_on_master"]["message"]
    assert said.startswith("fit was given different BackupAndRestore callbacks on the ranks"), said
    said = r0["backup_per_rank"]["message"]
    assert r0["backup_per_rank"]["error"] == r1["backup_per_rank"]["error"] == "MismatchError", said
    assert "backup_dir" in said and "shared file system" in said, said
    said = r0["backup_delete_on_master"]["message"]
    assert r0["backup_delete_on_master"]["error"] == r1["backup_delete_on_master"]["error"] == \
        "MismatchError", said
    assert said == r1["backup_delete_on_master"]["message"]
    assert said.startswith("fit was given different BackupAndRestore callbacks on the ranks: the "
                           "BackupAndRestore callbacks' delete_checkpoint (ranks [1] differ from "
                           "rank 0)"), said
    # a backup the master cannot read: its OSError (Keras' own), the others an error that quotes it
    bad = r0["backup_unreadable"], r1["backup_unreadable"]
    assert bad[0]["error"] == "OSError" and bad[1]["error"] == "TarantellaError", bad
    assert "on the master rank (OSError: " in bad[1]["message"] and "bar_damaged" in bad[1]["message"]
    for r in (r0, r1):
        assert r["backup_on_master_wrapped"]["error"] == "ValueError", r["backup_on_master_wrapped"]
        assert "BackupAndRestore must run on every rank" in r["backup_on_master_wrapped"]["message"]
    # wrapped to run on the master only, or callbacks that never wait (History, an EarlyStopping
    # that does not restore: the ranks stop together): they run
    for key in ("wrapped", "history", "restoring_stop_everywhere", "stop_on_master"):
        assert r0[key] == r1[key] == {"error": None}, (key, r0[key], r1[key])
    assert "master_only_1.keras" in os.listdir(os.path.join(runs["out"], "files"))
    # every rank's ModelCheckpoint, deciding apart when to save: refused before the first step
    # (they waited for each other until TNT_TIMEOUT_S, 60 s here)
    lead = "fit was given ModelCheckpoint callbacks that save at different times on the ranks: "
    for key, said in (("checkpoint_save_freq_per_rank",
                       "the ModelCheckpoints' save_freq (rank 0: 2, rank 1: 3)"),
                      ("checkpoint_mode_per_rank",
                       "the ModelCheckpoints' monitor and mode (ranks [1] differ from rank 0)")):
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"]
        assert r0[key]["message"].startswith(lead + said), r0[key]["message"]
    assert r0["checkpoint_name_per_rank"] == r1["checkpoint_name_per_rank"] == {"error": None}
    files = os.listdir(os.path.join(runs["out"], "files"))
    assert "named_0.keras" in files and "named_1.keras" not in files


def test_a_save_or_load_on_some_ranks_only_fails_every_rank_at_once(runs):
    # the master waited in the save's barrier (or the ranks in the load's broadcast) for ranks
    # that never came, until TNT_TIMEOUT_S (60 s here); every later collective failed too
    r0, r1 = (r["rank_only_saves"] for r in runs["ranks"])
    lead = "the ranks are not in the same call on one model: the call (rank 0: "
    for key, call in (("save_on_master", "save"), ("save_weights_on_master", "save_weights"),
                      ("load_weights_on_master", "load_weights"),
                      ("load_model_on_master", "load_model"),
                      ("set_weights_on_master", "set_weights"),
                      ("tf_saved_model_save_on_master", "tf.saved_model.save")):
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key
        assert r0[key]["message"].startswith(f"{lead}{call}, rank 1: fit)"), r0[key]["message"]
    # the file a save on the master only wrote is there, complete
    assert {"on_master.keras", "on_master_saved"} <= set(os.listdir(os.path.join(runs["out"], "files")))
    # a write that fails on the master, a read that fails on rank 1: that rank raises its own
    # error, the other one an error that names it (it waited in the barrier or the broadcast)
    for key, failing, other, error in (
            ("save_to_a_missing_directory", r0, r1, "FileNotFoundError"),
            ("save_model_to_a_missing_directory", r0, r1, "FileNotFoundError"),
            ("load_weights_missing_on_rank_1", r1, r0, "FileNotFoundError"),
            ("load_model_missing_on_rank_1", r1, r0, "ValueError"),
            ("set_weights_of_other_shapes_on_rank_1", r1, r0, "ValueError")):
        assert failing[key]["error"] == error, (key, failing[key])
        assert other[key]["error"] == "TarantellaError", (key, other[key])
        assert f"failed on rank(s) [{1 if failing is r1 else 0}]" in other[key]["message"], other[key]
    assert r0["fit_after"] == r1["fit_after"] == {"error": None}
    assert "no_such_dir" not in os.listdir(os.path.join(runs["out"], "files"))
    # overwrite=False is decided where the file is written: a rank that came to the save after
    # the master had written the new file raised a FileExistsError alone
    for key in ("save_new_file_without_overwrite_late_rank_1",
                "save_weights_new_file_without_overwrite_late_rank_1",
                "save_model_new_file_without_overwrite_late_rank_1"):
        assert r0[key] == r1[key] == {"error": None}, (key, r0[key], r1[key])
    key = "save_existing_file_without_overwrite"
    assert r0[key]["error"] == r1[key]["error"] == "FileExistsError", (r0[key], r1[key])
    assert "overwrite=False" in r0[key]["message"] and "failed on rank(s) [0]" in r1[key]["message"]


def test_collectives_in_a_master_only_callback_are_refused_at_once(runs):
    # the other ranks never call them: they waited until TNT_TIMEOUT_S
    r0, r1 = (r["master_only_collectives"] for r in runs["ranks"])
    assert r1["tried"] == {} and r0["epochs"] == r1["epochs"] == 2, (r0, r1)
    assert len(r0["tried"]) == 11, r0
    for key, got in r0["tried"].items():
        assert got["error"] == "InvalidUsageError", (key, got)
        assert "called in a callback that runs on the master rank only" in got["message"], (key, got)
    for key, what in (("allreduce_async", "tnt.allreduce_async"), ("tf_allreduce", "tnt.allreduce"),
                      ("evaluate", "tnt.Model.evaluate"), ("set_weights", "tnt.Model.set_weights")):
        assert r0["tried"][key]["message"].startswith(what + " is a collective"), (key, r0["tried"][key])
    assert "reset the master's metric totals only" in r0["tried"]["reset_metrics"]["message"]


def test_a_dropout_whose_first_axis_is_not_the_batch_trains_on_every_rank(runs):
    # its rows were cut from the global batch's noise along the time axis: a shape error on
    # rank 1 only, rank 0 waiting for it
    r0, r1 = (r["noise_off_the_batch_axis"] for r in runs["ranks"])
    assert r0["error"] is None and r1["error"] is None, (r0, r1)
    assert r0["kernel"] == r1["kernel"]


def test_a_stateful_rnn_is_refused_where_ranks_slice_the_batch(runs):
    # its states belong to the samples of a fixed batch: a TensorFlow shape error before
    r0, r1 = (r["stateful_rnn"] for r in runs["ranks"])
    for key in ("fit", "fit_arrays", "evaluate", "predict", "train_on_batch", "predict_on_batch"):
        assert r0[key]["error"] == r1[key]["error"] == "ValueError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key
        what = "fit" if key == "fit_arrays" else key
        assert r0[key]["message"].startswith(
            f"tnt.Model.{what}: layer 'stateful_lstm' is a stateful RNN (stateful=True)"), r0[key]
        assert "tnt_distribute_dataset=False" in r0[key]["message"], key  # the way out
    assert r0["own_data"] == r1["own_data"] == {"error": None}, (r0["own_data"], r1["own_data"])


def test_datasets_that_differ_between_ranks_fail_every_rank_once_their_first_batch_is_used(runs):
    # each rank keeps its slice of its own global batch: a dataset that differs between ranks
    # mixed their samples without a word (data/first_batches.py)
    r0, r1 = (r["same_data"] for r in runs["ranks"])
    expected = {
        "shuffle_seed": "the ranks read different data in the first step of fit: the first batch "
                        "of x in each pass (ranks [1] differ from rank 0)",
        "other_file": "the ranks read different data in evaluate: the first batch of x",
        "validation": "the ranks read different data in epoch 1 of fit: the first batch of "
                      "validation_data in each pass (ranks [1] differ from rank 0)",
        "predict": "the ranks read different data in predict: the first batch of x",
        "augmented_on_one_rank": "the ranks read different data in the first step of fit: the "
                                 "first batch of x in each pass (ranks [1] differ from rank 0)",
        # the original Tarantella seeded shuffle(seed=None) with 42 whatever the global seed;
        # here the global seed gives it one, so a seed per rank shuffles per rank
        "per_rank_global_seed": "the ranks read different data in the first step of fit",
    }
    for key, what in expected.items():
        assert r0[key]["error"] == r1[key]["error"] == "MismatchError", (key, r0[key], r1[key])
        assert r0[key]["message"] == r1[key]["message"], key  # the same verdict on every rank
        assert r0[key]["message"].startswith(what), (key, r0[key]["message"])
        assert "tnt_distribute_dataset=False" in r0[key]["message"], key  # what to do
    # the hint names the global seed, from which a shuffle without seed= takes its seed
    assert "unless a global seed gives it one, `tf.random.set_seed`" in r0["per_rank_global_seed"]["message"]
    # not refused: the same data (an unseeded shuffle is seeded alike), and augmentation
    # drawn at random on each rank (each sample is still used once: not compared)
    for key in ("same", "augmented", "shuffle_in_interleave_seeded", "sample_from_datasets_seeded"):
        assert r0[key] == r1[key] == {"error": None}, (key, r0[key], r1[key])
    # a shuffle without a seed where tnt cannot give it one (inside an interleave's function, in
    # a zip's input): refused on every rank before the first step, saying how to seed it
    for key, what in (
            ("shuffle_in_interleave", "a shuffle() without a seed in the function of "
                                      "_InterleaveDataset"),
            ("shuffle_before_enumerate", "a shuffle() without a seed in an input of a zip (or "
                                         "enumerate)"),
            ("sample_from_datasets", "a sample_from_datasets() without a seed")):
        assert r0[key]["error"] == r1[key]["error"] == "ValueError", (key, r0[key], r1[key])
        assert r0[key]["message"].startswith(
            f"The dataset has {what}, where Tarantella cannot add one"), r0[key]["message"]
        assert "keras.utils.set_random_seed" in r0[key]["message"]


def test_tf_train_checkpoints_saved_on_every_rank_are_whole(runs):
    # every rank saved into one folder, as a serial script does: the job ended in a rank's
    # MergeV2Checkpoints before (the other rank had merged and removed the temporary folder)
    for rank in runs["ranks"]:
        got = rank["tf_checkpoints"]
        assert got["saved"] == ["managed/ckpt-1", "plain/ckpt-2", "managed/ckpt-3", "plain/ckpt-4",
                                "managed/ckpt-5", "plain/ckpt-6"]
        assert got["latest"] == "plain/ckpt-6"
        assert got["managed"] == ["checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index",
                                  "ckpt-5.data-00000-of-00001", "ckpt-5.index"]
        assert got["restored_equal"] is True
