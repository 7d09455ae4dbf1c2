"""tnt.Model: a Keras model that trains data-parallel and shows serial results."""
import os

import keras
import numpy as np
import tensorflow as tf

from tarantella.common import collectives, config, core
from tarantella.common.logging import get_logger
from tarantella.tensorflow import (batch_normalization, collective_ops, distributed_optimizer,
                                   dropout, global_loss, step_context)
from tarantella.tensorflow.atomic_save import atomic_save
from tarantella.tensorflow.data import array_dataset, distribute_dataset
from tarantella.tensorflow.keras.callbacks.callback_preparation import prepare_callbacks
from tarantella.tensorflow.metrics_aggregation import global_metrics_result
from tarantella.tensorflow.parallel_strategy import ParallelStrategy
from tarantella.tensorflow.save_paths import check_model_path, check_weights_path

class _StepState:
    """Per-step values shared between train_step and the optimizer hook; a
    plain object so that Keras does not track it."""

    def __init__(self):
        self.local_batch = None


def _is_array_like(x):
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(
        isinstance(t, (np.ndarray, tf.Tensor, tf.Variable, list)) or np.isscalar(t)
        for t in leaves if t is not None)


def _first_dim(x):
    return tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]


@keras.saving.register_keras_serializable(package="tarantella", name="Model")
class Model(keras.Model):
    """Wrap a Keras model to train it data-parallel on all ranks.

    The wrapper behaves like the model it wraps (layers, summary, calling it,
    weights) and adds what data parallelism needs: the initial weights are
    broadcast from the master rank; `compile` makes the optimizer average
    gradients across ranks; `fit`, `evaluate` and `predict` give each rank a
    contiguous slice of every global batch; losses and metrics shown in logs,
    History and callbacks are computed over all ranks' samples, so they equal
    what serial training with the same global batch shows.

    Args:
        model: A `keras.Model` (Functional, Sequential or subclassed).
        parallel_strategy: `tnt.ParallelStrategy.DATA` (the default; the only
            strategy implemented).

    Example:

    ```python
    model = tnt.Model(keras_model)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(train_ds.batch(64), epochs=3)   # 64 = the global batch size
    ```
    """

    def __init__(self, model, parallel_strategy=ParallelStrategy.DATA, **kwargs):
        if not isinstance(model, keras.Model):
            raise TypeError(
                "tnt.Model expects a keras.Model instance. Received: "
                f"model={model!r} (of type {type(model).__name__})")
        if isinstance(model, Model):
            raise TypeError("The model is already a tnt.Model. Received: model=tnt.Model")
        if isinstance(parallel_strategy, str):
            parallel_strategy = ParallelStrategy[parallel_strategy.upper()]
        if parallel_strategy != ParallelStrategy.DATA:
            raise NotImplementedError(
                "Only tnt.ParallelStrategy.DATA is implemented. Received: "
                f"parallel_strategy={parallel_strategy}")
        kwargs.setdefault("name", model.name)
        # Keras decides on loss scaling (mixed_float16) from the compiled model's policy
        kwargs.setdefault("dtype", model.dtype_policy)
        super().__init__(**kwargs)
        self.model = model
        self.parallel_strategy = parallel_strategy
        self._tnt_step = _StepState()
        self._tnt_synced = False
        self._tnt_master_only = False
        self._tnt_distributed_predict = False
        if model.built:
            self.built = True

    # ---- behave like the wrapped model ------------------------------------------------------
    def call(self, inputs, training=None, mask=None):
        return self.model(inputs, training=training, mask=mask)

    def build(self, input_shape=None):
        if not self.model.built and input_shape is not None:
            self.model.build(input_shape)
        self.built = True

    def __getattr__(self, name):
        # Only reached when normal lookup fails: forward to the wrapped model
        # (inputs, outputs, input_shape, ... of a Functional model).
        if name.startswith("__") or name in ("model", "_tracker") or "model" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["model"], name)

    @property
    def layers(self):
        return self.model.layers

    @property
    def input(self):
        return self.model.input

    @property
    def output(self):
        return self.model.output

    def get_layer(self, name=None, index=None):
        return self.model.get_layer(name=name, index=index)

    def summary(self, *args, **kwargs):
        """The wrapped model's summary, on the master rank only (on every rank
        with TNT_OUTPUT_ON_ALL_DEVICES=true)."""
        if core.is_master_rank() or config.get("TNT_OUTPUT_ON_ALL_DEVICES"):
            return self.model.summary(*args, **kwargs)
        return None

    # ---- compile ------------------------------------------------------------------------------
    def compile(self, optimizer="rmsprop", loss=None, loss_weights=None, metrics=None,
                weighted_metrics=None, run_eagerly=False, steps_per_execution=1,
                jit_compile="auto", auto_scale_loss=True):
        optimizer = keras.optimizers.get(optimizer)
        distributed_optimizer._check_supported(optimizer)
        super().compile(optimizer=optimizer, loss=loss, loss_weights=loss_weights,
                        metrics=metrics, weighted_metrics=weighted_metrics,
                        run_eagerly=run_eagerly, steps_per_execution=steps_per_execution,
                        jit_compile=jit_compile, auto_scale_loss=auto_scale_loss)
        # Wrap the outermost optimizer (a LossScaleOptimizer under mixed
        # precision): it then checks the *reduced* gradients for finiteness,
        # which are the same on every rank, so ranks never disagree on a skip.
        distributed_optimizer.DistributedOptimizer(self.optimizer)
        distributed_optimizer.set_gradient_weight(self.optimizer, self._local_batch_weight)
        # masked, weighted, summed losses: serial (the wrapped model's too, if it is compiled)
        global_loss.distribute(self._compile_loss)
        global_loss.distribute(getattr(self.model, "_compile_loss", None))
        batch_normalization.prepare(self.model)  # synchronized=True: global statistics
        dropout.prepare(self.model)  # the serial masks of the global batch, sliced
        distributed_optimizer.set_float16_variables(self.optimizer, self._float16_variables)
        if core.get_size() > 1 and self.jit_compile:
            get_logger().info(
                "tnt.Model: the train/test steps are not XLA-compiled (jit_compile=False): they "
                "contain Tarantella's collective ops, which XLA cannot compile.")
            self.jit_compile = False
        self._tnt_synced = False  # broadcast again before the next fit/evaluate/predict

    def _float16_variables(self):
        """The trainable variables that layers computing in float16 read
        through an autocast (their gradients are float16 in serial training)."""
        return [v for layer in self.model._flatten_layers(include_self=True)
                if layer.compute_dtype == "float16"
                for v in layer._trainable_variables if getattr(v, "autocast", True)]

    def compile_from_config(self, config):
        # Required because compile() is overridden: without it, Keras would
        # skip compiling a loaded model and drop the optimizer state.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built and getattr(self, "optimizer", None) is not None:
            self.optimizer.build(self.trainable_variables)

    # ---- the training step: weight gradients by micro-batch size ------------------------------
    def _local_batch_weight(self):
        return self._tnt_step.local_batch

    def train_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        # Keras losses are means over the local batch, so rank r's gradient is
        # weighted by its micro-batch size b_r: Σ b_r g_r / Σ b_r is the serial
        # mean gradient even when micro-batches differ in size or are empty.
        local_batch = _first_dim(x)
        self._tnt_step.local_batch = local_batch
        try:
            if core.get_size() == 1:
                return super().train_step(data)
            # A rank whose slice of the last, partial batch is empty must not
            # run the model (some TF kernels, e.g. oneDNN convolutions, fail on
            # an empty batch); it still takes part in the step's collectives
            # (weight 0) and the metric reduction, in the same order as the rest.
            with step_context.step(local_batch) as step:
                moving = batch_normalization.moving_statistics(
                    batch_normalization.unsynchronized(self.model))

                def train():
                    logs = super(Model, self).train_step(data)
                    # identical weights on every rank (see batch_normalization.py)
                    batch_normalization.average_moving_statistics(moving, local_batch, step)
                    return logs

                def skip():
                    logs = self._empty_train_step(step)
                    batch_normalization.average_moving_statistics(moving, 0, step)
                    return logs

                return tf.cond(local_batch > 0, train, skip)
        finally:
            self._tnt_step.local_batch = None

    def _empty_train_step(self, step):
        # The real branch is traced first: its apply() recorded which
        # gradients are None, and this branch must submit the same tensors;
        # the step's own collectives (global loss normalisers, ...) come first.
        step.replay()
        missing = distributed_optimizer.missing_gradients(self.optimizer)
        variables = self.trainable_variables
        grads = [None if missing and missing[i] else tf.zeros_like(v) for i, v in enumerate(variables)]
        self.optimizer.apply(grads, variables)
        return self.get_metrics_result()

    def test_step(self, data):
        if core.get_size() == 1:
            return super().test_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        with step_context.step(_first_dim(x)) as step:
            return tf.cond(_first_dim(x) > 0, lambda: super(Model, self).test_step(data),
                           lambda: step.replay() or self.get_metrics_result())

    def predict_step(self, data):
        if not self._tnt_distributed_predict:
            return super().predict_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)

        def on_one_zero_sample():  # the right output structure and shapes, with 0 rows
            zeros = tf.nest.map_structure(
                lambda t: tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype), x)
            return tf.nest.map_structure(lambda t: t[:0], super(Model, self).predict_step((zeros,)))

        outputs = tf.cond(_first_dim(x) > 0, lambda: super(Model, self).predict_step(data),
                          on_one_zero_sample)
        # Each rank predicted a contiguous slice of the global batch: gathering
        # the slices in rank order restores the global batch, in order.
        return tf.nest.map_structure(_allgather_tensor, outputs)

    # ---- global metrics -----------------------------------------------------------------------
    def get_metrics_result(self):
        if core.get_size() == 1:
            return super().get_metrics_result()
        return global_metrics_result(self.metrics)

    def _tnt_local_metrics_result(self):
        """This rank's own metric values, as floats (for aggregate_logs=False)."""
        return {k: float(np.asarray(v)) if np.size(v) == 1 else np.asarray(v)
                for k, v in super().get_metrics_result().items()}

    # ---- data distribution --------------------------------------------------------------------
    def _distribute(self, x, y, sample_weight, batch_size, shuffle, micro_batch_size, distribute,
                    what, kwarg_name):
        """(dataset, global_batch, micro_batch) for this rank."""
        if not distribute:
            get_logger().info(
                f"tnt.Model.{what}: tnt_distribute_dataset=False, so the data is used as given: "
                "each rank must feed its own part of every global batch.")
            return None
        if isinstance(x, tf.data.Dataset):
            if y is not None or sample_weight is not None:
                raise ValueError(
                    f"`y` and `sample_weight` must be part of the dataset when `x` is a "
                    f"tf.data.Dataset. Received: y={type(y).__name__}, "
                    f"sample_weight={type(sample_weight).__name__}")
            if batch_size is not None:
                raise ValueError(
                    "Do not pass `batch_size` with a tf.data.Dataset: batch the dataset with the "
                    f"global batch size instead. Received: batch_size={batch_size}")
            d = distribute_dataset(x, micro_batch_size=micro_batch_size, what=kwarg_name)
            return d.dataset, d.global_batch_size, d.micro_batch_size
        if x is None or not _is_array_like(x):
            raise TypeError(
                f"tnt.Model.{what} distributes tf.data.Dataset objects and NumPy arrays / tensors. "
                "For Python generators, keras.utils.PyDataset or other iterables, build a "
                "tf.data.Dataset (e.g. tf.data.Dataset.from_generator) batched with the global "
                f"batch size, or pass tnt_distribute_dataset=False and feed each rank its own "
                f"shard. Received: x of type {type(x).__name__}")
        size = core.get_size()
        if micro_batch_size is not None:
            if batch_size is not None and batch_size != micro_batch_size * size:
                raise ValueError(
                    f"{kwarg_name} * ranks must equal batch_size (the global batch size). "
                    f"Received: {kwarg_name}={micro_batch_size}, batch_size={batch_size} "
                    f"(ranks={size})")
            batch_size = micro_batch_size * size
        batch_size = 32 if batch_size is None else batch_size
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer. Received: batch_size={batch_size!r}")
        data = (x,) if y is None and sample_weight is None else (
            (x, y) if sample_weight is None else (x, y, sample_weight))
        dataset = array_dataset(data, int(batch_size), core.get_rank(), size,
                                shuffle=shuffle if shuffle == "batch" else bool(shuffle))
        return dataset, int(batch_size), -(-int(batch_size) // size)

    def _warn_batch_norm(self, micro_batch_size):
        if batch_normalization.prepare(self.model):
            self.train_function = None  # newly synchronised layers: trace the step again
        batch_normalization.warn_unsynchronized(self.model, micro_batch_size)

    def _sync_weights(self, x):
        """Make every rank start from the master's weights (once after compile
        and after weights are loaded or set). `x` is what Keras will get."""
        if self._tnt_synced or core.get_size() == 1:
            self._tnt_synced = True
            return
        if not self.model.built:
            # A subclassed model creates its weights at its first call: do it
            # now, on this rank's first batch, so they can be broadcast.
            if isinstance(x, tf.data.Dataset):
                inputs = keras.utils.unpack_x_y_sample_weight(next(iter(x)))[0]
            else:
                inputs = tf.nest.map_structure(lambda t: t[:1], x)
            self(inputs)
        collective_ops.broadcast_variables(self.model.weights + dropout.seed_states(self.model),
                                           root_rank=core.get_master_rank())
        self._tnt_synced = True

    def _verbose(self, verbose):
        if core.is_master_rank() or config.get("TNT_OUTPUT_ON_ALL_DEVICES"):
            return verbose
        return 0

    # ---- fit / evaluate / predict -------------------------------------------------------------
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1, tnt_micro_batch_size=None,
            tnt_validation_micro_batch_size=None, tnt_distribute_dataset=True,
            tnt_distribute_validation_dataset=True):
        """`keras.Model.fit`, data-parallel. `x` is a tf.data.Dataset batched
        with the global batch size, an unbatched dataset with
        `tnt_micro_batch_size`, or arrays with `batch_size` the global batch
        size. Returns the History of global logs on every rank."""
        self._assert_compile_called("fit")
        if validation_split and validation_data is None:
            if not _is_array_like(x):
                raise ValueError(
                    "validation_split needs NumPy arrays or tensors; with a dataset pass "
                    f"validation_data. Received: x of type {type(x).__name__}")
            (x, y, sample_weight), validation_data = _split_arrays(
                (x, y, sample_weight), validation_split)
        train = self._distribute(x, y, sample_weight, batch_size, shuffle, tnt_micro_batch_size,
                                 tnt_distribute_dataset, "fit", "tnt_micro_batch_size")
        if train is not None:
            x, global_batch, micro_batch = train[0], train[1], train[2]
            y = sample_weight = batch_size = None
            self._warn_batch_norm(micro_batch)
        if validation_data is not None:
            if isinstance(validation_data, tf.data.Dataset):
                vx, vy, vsw = validation_data, None, None
            else:
                vx, vy, vsw = keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
            val = self._distribute(vx, vy, vsw, validation_batch_size or (
                None if isinstance(vx, tf.data.Dataset) else (
                    global_batch if train is not None else batch_size)),
                False, tnt_validation_micro_batch_size, tnt_distribute_validation_dataset,
                "fit", "tnt_validation_micro_batch_size")
            if val is not None:
                validation_data, validation_batch_size = val[0], None
        self._sync_weights(x)
        with collective_ops.collective_errors():  # a lost peer as PeerLostError
            return super().fit(
                x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=self._verbose(verbose),
                callbacks=prepare_callbacks(callbacks), validation_data=validation_data,
                shuffle=False if train is not None else shuffle, class_weight=class_weight,
                sample_weight=sample_weight, initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                validation_batch_size=validation_batch_size, validation_freq=validation_freq)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False, tnt_micro_batch_size=None,
                 tnt_distribute_dataset=True, **kwargs):
        """`keras.Model.evaluate`, data-parallel; the result is global (the
        same on every rank)."""
        if kwargs.get("_use_cached_eval_dataset"):  # validation inside fit: already distributed
            return super().evaluate(x=x, y=y, batch_size=batch_size, verbose=verbose,
                                    sample_weight=sample_weight, steps=steps, callbacks=callbacks,
                                    return_dict=return_dict, **kwargs)
        self._assert_compile_called("evaluate")
        data = self._distribute(x, y, sample_weight, batch_size, False, tnt_micro_batch_size,
                                tnt_distribute_dataset, "evaluate", "tnt_micro_batch_size")
        if data is not None:
            x, y, sample_weight, batch_size = data[0], None, None, None
        self._sync_weights(x)
        with collective_ops.collective_errors():
            return super().evaluate(x=x, y=y, batch_size=batch_size,
                                    verbose=self._verbose(verbose), sample_weight=sample_weight,
                                    steps=steps, callbacks=prepare_callbacks(callbacks),
                                    return_dict=return_dict, **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
                tnt_micro_batch_size=None, tnt_distribute_dataset=True):
        """`keras.Model.predict`, data-parallel: every rank predicts its slice
        of each global batch and returns the full predictions, in order."""
        data = self._distribute(x, None, None, batch_size, False, tnt_micro_batch_size,
                                tnt_distribute_dataset, "predict", "tnt_micro_batch_size")
        distributed = data is not None and core.get_size() > 1
        if data is not None:
            x, batch_size = data[0], None
        self._sync_weights(x)
        if distributed != self._tnt_distributed_predict:
            self._tnt_distributed_predict = distributed
            self.predict_function = None  # retrace with (or without) the gather
        with collective_ops.collective_errors():
            return super().predict(x, batch_size=batch_size, verbose=self._verbose(verbose),
                                   steps=steps, callbacks=prepare_callbacks(callbacks))

    # ---- weights and saving -------------------------------------------------------------------
    def set_weights(self, weights):
        """Set the weights on every rank to the master rank's `weights` (collective)."""
        super().set_weights(weights)
        collective_ops.broadcast_variables(self.model.weights, root_rank=core.get_master_rank())
        self._tnt_synced = True

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Load weights on every rank, then broadcast the master's (collective)."""
        optimizer = getattr(self, "optimizer", None)
        if self.built and optimizer is not None and not optimizer.built:
            optimizer.build(self.trainable_variables)  # so that its saved state loads too
        super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        collective_ops.broadcast_variables(self.model.weights, root_rank=core.get_master_rank())
        self._tnt_synced = True

    def _save_on_this_rank(self, save_all_devices, what, filepath, write):
        if save_all_devices or core.is_master_rank():
            atomic_save(filepath, write)
        if core.get_size() > 1 and not self._tnt_master_only:
            # The file is complete when save() returns on any rank, so every
            # rank may load it next (assuming a shared filesystem).
            collectives.barrier(name=f"tnt.{what}")

    def save(self, filepath, overwrite=True, zipped=None, tnt_save_all_devices=False, **kwargs):
        """Save the model (`.keras`), atomically, on the master rank only
        (every rank with `tnt_save_all_devices=True`). Call it on every rank."""
        filepath = os.fspath(filepath)
        check_model_path(filepath, zipped)  # on every rank, before any file or collective work
        if not overwrite and os.path.exists(filepath):
            raise FileExistsError(f"{filepath} exists and overwrite=False. Received: overwrite=False")
        self._save_on_this_rank(
            tnt_save_all_devices, "save", filepath,
            lambda path: super(Model, self).save(path, overwrite=True, zipped=zipped, **kwargs))

    def save_weights(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Save the weights (`.weights.h5`), atomically, on the master rank only."""
        filepath = os.fspath(filepath)
        check_weights_path(filepath, kwargs.get("max_shard_size"))
        if not overwrite and os.path.exists(filepath):
            raise FileExistsError(f"{filepath} exists and overwrite=False. Received: overwrite=False")
        self._save_on_this_rank(
            tnt_save_all_devices, "save_weights", filepath,
            lambda path: super(Model, self).save_weights(path, overwrite=True, **kwargs))

    # ---- serialization ------------------------------------------------------------------------
    def get_config(self):
        return {"name": self.name, "trainable": self.trainable,
                "model": keras.saving.serialize_keras_object(self.model)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("model"),
                                                      custom_objects=custom_objects)
        config.pop("parallel_strategy", None)
        return cls(inner, **config)


def _allgather_tensor(tensor):
    @collective_ops.reporting
    def gather(array):
        return collective_ops.allgather_array(array, name="tnt.predict")

    gathered = tf.numpy_function(gather, [tensor], tensor.dtype, stateful=True,
                                 name="TntAllgather")
    gathered.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return gathered


def _split_arrays(arrays, validation_split):
    """Keras' own split: the last `validation_split` of the samples validate."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)
