"""tnt.Model: a Keras model that trains data-parallel and shows serial results."""
import copy
import inspect
import os

import keras
import numpy as np
import tensorflow as tf
from keras.src.ops.operation import Operation

from tarantella.common import busy, config, core, errors, gone_arguments, master_only
from tarantella.common.startup_log import mark
from tarantella.common.logging import get_logger
from tarantella.tensorflow import (batch_normalization, call_agreement, collective_ops,
                                   distributed_optimizer, global_loss, random_layers,
                                   step_context)
from tarantella.tensorflow import compression as compression_lib
from tarantella.tensorflow import checkpoint_writes, keras_saving, tensor_collectives
from tarantella.tensorflow.atomic_save import atomic_save, explain_missing
from tarantella.tensorflow.data import array_dataset, distribute_dataset
from tarantella.tensorflow.data import first_batches, py_dataset, step_counts
from tarantella.tensorflow.data.batch_slicing import rank_slice, rows
from tarantella.tensorflow.data.array_dataset import (as_keras_arrays, check_same_on_every_rank,
                                                      sample_count)
from tarantella.tensorflow.data.step_counts import input_kind
from tarantella.tensorflow.keras.callbacks import between_hooks
from tarantella.tensorflow.keras.callbacks.callback_preparation import (
    own_csv_files, prepare_callbacks, same_backups, same_checkpoint_settings, same_checkpoints,
    same_csv_loggers, same_rate_setters, same_restoring_stops)
from tarantella.tensorflow.keras.callbacks.dataset_check import DatasetCheck
from tarantella.tensorflow.keras.callbacks.replica_check import ReplicaCheck
from tarantella.tensorflow.keras.callbacks.stop_agreement import StopAgreement
from tarantella.tensorflow.metrics_aggregation import (global_logs, global_metrics_result,
                                                       weight_step_means)
from tarantella.tensorflow.optimizer_loading import built_for_loading
from tarantella.tensorflow.parallel_strategy import ParallelStrategy
from tarantella.tensorflow.parallel_strategy import resolve as resolve_strategy
from tarantella.tensorflow.save_paths import (check_model_path, check_save_keywords,
                                               check_save_weights_keywords, check_weights_path)

class _StepState:
    """What a tnt.Model's steps keep for the empty-slice branch (see
    _unless_empty); a plain object so that Keras does not track it."""

    def __init__(self):
        self.logs = {}  # "train"/"test" -> the structure of the logs the step returns
        self.applies = {}  # "train"/"test" -> the optimizer apply() calls the step made
        self.replays = {}  # "train"/"test" -> the step context's requests (for replay)
        # whether a rank's slice of a training batch can be empty: known False
        # only for arrays whose batches all have a sample for every rank
        self.train_may_be_empty = True


def _is_array_like(x):
    # tf.RaggedTensor and tf.SparseTensor too, as Keras' array adapter takes them (pandas
    # and SciPy arrays are made NumPy arrays and tf.SparseTensors first: as_keras_arrays)
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(
        isinstance(t, (np.ndarray, tf.Tensor, tf.Variable, tf.RaggedTensor, tf.SparseTensor, list))
        or np.isscalar(t)
        for t in leaves if t is not None)


def _counted_batches(x, batch_size, steps, kind, distribute):
    """The batches of `x` that step_counts.check_same_batches compares: not
    counted (None) where an argument sets the steps, or for arrays that every
    rank slices from, which check_same_on_every_rank compares whole."""
    if steps is not None or (kind == step_counts.KINDS[2] and distribute):
        return None
    return step_counts.batches(x, batch_size)


def _accepts(function, argument):
    parameters = inspect.signature(function).parameters
    return argument in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _one_row_per_sample(output, local_batch):
    """`output` of tnt.Model.predict's step, once its first dimension is checked to be the
    slice's samples. predict gathers each output's rows from every rank: an output that is not
    one row per sample (a statistic of the batch, of shape (k,)) came back with k rows of every
    rank where serial Keras gives k a batch, without a word (12 values for 6 on 2 ranks). Such an
    output now fails, on every rank (each has samples in the first batch), before the gather."""
    if not isinstance(output, tf.Tensor) or output.shape.rank == 0:
        return output  # ragged and sparse outputs have rows by construction; Keras refuses scalars
    message = (f"tnt.Model.predict: an output of the model (of shape {output.shape}) does not have one "
               "row per sample: its first dimension must be the "
               "batch's (Keras concatenates the batches' outputs along it, and Tarantella gathers each "
               "rank's rows of the global batch along it). Compute a statistic of the whole batch outside "
               "predict (call the model, or use a metric in evaluate)")
    with tf.control_dependencies([tf.debugging.assert_equal(tf.shape(output)[0], tf.cast(local_batch, tf.int32),
                                                            message=message)]):
        return tf.identity(output)


def _first_dim(x):
    return tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]


def _static_first_dim(x):
    """The batch's first dimension as far as it is known before running (None: unknown)."""
    return tf.TensorShape(next(t for t in tf.nest.flatten(x) if t is not None).shape)[0]


# the original Tarantella's tnt.Model attributes that are gone: what to use instead
_GONE = {
    "dist_optimizer": "use model.optimizer (the compiled optimizer, made distributed)",
    "group": gone_arguments.NO_GROUPS,
    "to_yaml": "Keras 3 removed YAML: use to_json() and tnt.models.model_from_json",
    **dict.fromkeys(("reset_states", "add_metric", "state_updates"), "Keras 3 removed it"),
    "close": "there is nothing to release (it was the original's exit hook): leave the call out",
}

# the original Tarantella's compile() arguments that Keras 3 removed: what to do instead
_GONE_COMPILE = {
    "sample_weight_mode": "Keras 3 removed it: pass sample weights shaped like the targets "
                          "(batch, timesteps) to weight each timestep",
    "experimental_run_tf_function": "Keras 3 removed it (the original set it to False itself): "
                                    "leave it out",
}


@keras.saving.register_keras_serializable(package="tarantella", name="Model")
class Model(keras.Model):
    """Wrap a Keras model to train it data-parallel on all ranks.

    The wrapper behaves like the model it wraps (layers, summary, calling it,
    weights, config, files) and runs the wrapped model's own steps
    (`train_step`, `test_step`, `predict_step`: Keras' defaults or the
    model's), adding what data parallelism needs: the initial weights are
    broadcast from the master rank; `compile` makes the optimizer(s) average
    gradients across ranks; `fit`, `evaluate`, `predict` and the `*_on_batch`
    calls give each rank a contiguous slice of every global batch; losses and
    metrics shown in logs, History and callbacks are computed over all ranks'
    samples, so they equal what serial training with the same global batch
    shows.

    Args:
        model: A `keras.Model` (Functional, Sequential or subclassed).
        parallel_strategy: `tnt.ParallelStrategy.DATA` (the default), or
            `ALL` for a model without pipeline partitions (it trains
            data-parallel too); pipelining is not available yet, so
            `PIPELINING`, or `ALL` with `SplitLayer` layers, is an error.
        num_pipeline_stages: The original Tarantella's argument: 1 (the
            default) is accepted; more stages need pipelining (an error).
        compression: How gradients travel: `tnt.Compression.none` (exact),
            `fp16` or `bf16` (float32 gradients as 16-bit floats: half the
            bytes, rounded; see docs/keras.md, "Gradient compression"). The
            default, None, is exact, or what a `tnt.DistributedOptimizer`
            passed to `compile` was given.

    Example:

    ```python
    model = tnt.Model(keras_model)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(train_ds.batch(64), epochs=3)   # 64 = the global batch size
    ```
    """

    def __init__(self, model, parallel_strategy=ParallelStrategy.DATA, num_pipeline_stages=1,
                 compression=None, **kwargs):
        if not isinstance(model, keras.Model):
            raise TypeError(
                "tnt.Model expects a keras.Model instance. Received: "
                f"model={model!r} (of type {type(model).__name__})")
        if isinstance(model, Model):
            raise TypeError("The model is already a tnt.Model. Received: model=tnt.Model")
        # Keras' ValueError named the argument only ("Unrecognized keyword arguments")
        gone_arguments.refuse("tnt.Model", kwargs, gone_arguments.GROUP, others_allowed=True)
        parallel_strategy = resolve_strategy(parallel_strategy, model, num_pipeline_stages)
        compressor = None if compression is None else compression_lib.resolve(compression)
        kwargs.setdefault("name", model.name)
        # Keras decides on loss scaling (mixed_float16) from the compiled model's policy
        kwargs.setdefault("dtype", model.dtype_policy)
        super().__init__(**kwargs)
        self.model = model
        self.parallel_strategy = parallel_strategy
        self._tnt_compression = compressor
        self._tnt_step = _StepState()
        self._tnt_synced = False
        self._tnt_agreement = call_agreement.State()
        self._tnt_distributed_predict = False
        if model.built:
            self.built = True

    # ---- behave like the wrapped model ------------------------------------------------------
    def call(self, inputs, training=None, mask=None, **kwargs):
        # Keras hands `training` only to a call() that takes it; `mask` must be
        # left out for one that does not (as Keras does when it calls the model).
        if mask is not None and _accepts(self.model.call, "mask"):
            kwargs["mask"] = mask
        return self.model(inputs, training=training, **kwargs)

    def build(self, input_shape=None):
        """`build(input_shape)` of the wrapped model."""
        if not self.model.built:
            self.model.build(input_shape)
        self.built = True

    # Keras treats a default build() as "build by calling the model on symbolic
    # inputs", which builds a subclassed model's layers; an explicit
    # `model.build(shape)` still reaches the wrapped model's own build().
    build._is_default = True

    def __getattr__(self, name):
        # Only reached when normal lookup fails: forward to the wrapped model
        # (inputs, outputs, input_shape, ... of a Functional model).
        if name.startswith("__") or name in ("model", "_tracker") or "model" not in self.__dict__:
            raise AttributeError(name)
        if name in _GONE and not hasattr(self.__dict__["model"], name):
            raise AttributeError(f"tnt.Model.{name} of the original Tarantella is not available: "
                                 f"{_GONE[name]} (docs/migration.md)")
        return getattr(self.__dict__["model"], name)

    # What a user reads of a model is the wrapped model's: these (and
    # weights, variables, losses, metrics, metrics_names, name, trainable,
    # dtype, ..., which Keras collects from the wrapped model anyway) are
    # the same objects as on the wrapped model.
    @property
    def layers(self):
        return self.model.layers

    @property
    def input(self):
        try:
            return self.model.input
        except AttributeError:  # see output
            return super().input

    @property
    def output(self):
        try:
            return self.model.output
        except AttributeError:
            # A Sequential that was never called itself has none; the wrapper, called as a
            # layer of another model, has its own (Keras reads it to build that model).
            return super().output

    @property
    def inputs(self):
        return self.model.inputs

    @property
    def outputs(self):
        return self.model.outputs

    @property
    def input_spec(self):
        model = self.__dict__.get("model")
        return self._input_spec if model is None else model.input_spec

    @input_spec.setter
    def input_spec(self, value):
        self._input_spec = value  # Keras sets it while constructing

    def get_layer(self, name=None, index=None):
        return self.model.get_layer(name=name, index=index)

    def compute_output_shape(self, *args, **kwargs):
        return self.model.compute_output_shape(*args, **kwargs)

    def compute_output_spec(self, *args, **kwargs):
        # Called on symbolic inputs (a tnt.Model used as a layer of another model, e.g. the
        # base of transfer learning loaded with tnt.models.load_model), Keras would hand the
        # overridden compute_output_shape its shapes by keyword ("inputs_shape"), which the
        # wrapped model's compute_output_shape(input_shape) does not take: trace call() on
        # the symbolic inputs instead, as Keras does for a model of its own.
        return Operation.compute_output_spec(self, *args, **kwargs)

    def compute_mask(self, *args, **kwargs):
        return self.model.compute_mask(*args, **kwargs)

    def summary(self, *args, **kwargs):
        """The wrapped model's summary, printed on the master rank only (on every
        rank with TNT_OUTPUT_ON_ALL_DEVICES=true). Given a `print_fn`, it runs on
        every rank: the summary is then the caller's data (lines collected to
        count or parse), which other ranks got none of."""
        print_fn = kwargs.get("print_fn", args[2] if len(args) > 2 else None)
        if print_fn is not None or core.is_master_rank() or config.get("TNT_OUTPUT_ON_ALL_DEVICES"):
            return self.model.summary(*args, **kwargs)
        return None

    # ---- compile ------------------------------------------------------------------------------
    def compile(self, *args, **kwargs):
        """`keras.Model.compile(optimizer="rmsprop", loss=None, loss_weights=None,
        metrics=None, weighted_metrics=None, run_eagerly=False,
        steps_per_execution=1, jit_compile="auto", auto_scale_loss=True)`, or
        the wrapped model's own `compile(...)` if it has one (e.g. a GAN's
        `compile(d_optimizer, g_optimizer, loss_fn)`). Every optimizer the
        model then holds averages its gradients across ranks."""
        # Keras' TypeError named the internal _compile_keras and said nothing more
        gone_arguments.refuse("tnt.Model.compile", kwargs, _GONE_COMPILE, others_allowed=True)
        if type(self.model).compile is not keras.Model.compile:
            self._compile_own(*args, **kwargs)
        else:
            self._compile_keras(*args, **kwargs)
        if core.get_size() > 1 and self.jit_compile:
            get_logger().info(
                "tnt.Model: the train/test steps are not XLA-compiled (jit_compile=False): they "
                "contain Tarantella's collective ops, which XLA cannot compile.")
            self.jit_compile = False
        self._tnt_synced = False  # broadcast again before the next fit/evaluate/predict
        self._tnt_agreement.reset()  # the *_on_batch calls compare the new compile once

    def _compile_keras(self, optimizer="rmsprop", loss=None, loss_weights=None, metrics=None,
                       weighted_metrics=None, run_eagerly=False, steps_per_execution=1,
                       jit_compile="auto", auto_scale_loss=True):
        optimizer = keras.optimizers.get(optimizer)
        distributed_optimizer._check_supported(optimizer)
        arguments = dict(loss=loss, loss_weights=loss_weights, metrics=metrics,
                         weighted_metrics=weighted_metrics, run_eagerly=run_eagerly,
                         steps_per_execution=steps_per_execution, jit_compile=jit_compile,
                         auto_scale_loss=auto_scale_loss)
        super().compile(optimizer=optimizer, **arguments)
        # Wrap the outermost optimizer (a LossScaleOptimizer under mixed
        # precision): it then checks the *reduced* gradients for finiteness,
        # which are the same on every rank, so ranks never disagree on a skip.
        self._distribute_optimizer(self.optimizer)
        # The wrapped model runs the steps (its own train_step, compute_loss,
        # metrics, ... or Keras' defaults), so it is compiled alike, with the
        # same optimizer object; its files then carry the compile state too.
        self.model.compile(optimizer=self.optimizer, **arguments)
        # masked, weighted, summed losses: serial (the wrapper's and the wrapped model's)
        global_loss.distribute(self._compile_loss)
        global_loss.distribute(getattr(self.model, "_compile_loss", None))
        self._prepare_layers()

    def _compile_own(self, *args, **kwargs):
        """The wrapped model's own compile(); then every optimizer it holds
        (attributes, in name order: the same order on every rank) is made
        distributed, and the wrapper is compiled for Keras' fit machinery."""
        self.model.compile(*args, **kwargs)
        for optimizer in _held_optimizers(self.model):
            distributed_optimizer._check_supported(optimizer)
            self._distribute_optimizer(optimizer)
        global_loss.distribute(getattr(self.model, "_compile_loss", None))
        self._prepare_layers()
        super().compile(optimizer=getattr(self.model, "optimizer", None) or "rmsprop",
                        run_eagerly=self.model.run_eagerly,
                        steps_per_execution=self.model.steps_per_execution,
                        jit_compile=self.model.jit_compile, auto_scale_loss=False)

    def _distribute_optimizer(self, optimizer):
        distributed_optimizer.DistributedOptimizer(optimizer)
        if self._tnt_compression is not None:
            distributed_optimizer.set_compression(optimizer, self._tnt_compression)
        distributed_optimizer.set_gradient_weight(optimizer, self._local_batch_weight)
        distributed_optimizer.set_float16_variables(optimizer, self._float16_variables)

    def _prepare_layers(self):
        batch_normalization.prepare(self.model)  # synchronized=True: global statistics
        random_layers.prepare(self.model)  # the serial noise of the global batch, sliced
        weight_step_means(self.model.metrics)  # tracker.update_state(loss): the serial mean

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

    def _assert_compile_called(self, method_name=None):
        if not self.compiled and getattr(self.model, "compiled", False):
            # Keras' own message ("You must call `compile()`") puzzles a user whose
            # model was compiled, by them or by keras.models.load_model.
            raise ValueError(
                f"Call compile() on the tnt.Model before {method_name or 'using it'}(): the model "
                "it wraps was compiled, but a tnt.Model makes its optimizer average the gradients "
                "across ranks in its own compile(). Compile after wrapping, or load a saved model "
                "with tnt.models.load_model(path), which returns a compiled tnt.Model with the "
                "optimizer's state.")
        super()._assert_compile_called(method_name)

    # ---- the steps: the wrapped model's own, on this rank's slice -----------------------------
    # Each step is the wrapped model's train_step / test_step / predict_step
    # (a user's own, or Keras' default), run on this rank's micro-batch; the
    # optimizer's apply() averages the gradients across ranks, and the logs
    # the step returns are made global afterwards (see _global_logs).
    @staticmethod
    def _local_batch_weight():
        """This rank's micro-batch size in the tnt.Model step being run, by whichever tnt.Model
        runs it: the wrapped model's optimizer is that of its latest compile, which may be
        another tnt.Model's over the same model (wrapped twice, the older wrapper's fit). Read
        from the compiling wrapper's own step, it was None there: equal weights, not the serial
        mean gradient where the slices differ in size, without a word."""
        context = step_context.current()
        return None if context is None else context.local_batch

    def train_step(self, data):
        mark("fit: tracing the train step")  # Python runs here only while TensorFlow traces
        if core.get_size() == 1:
            return self.model.train_step(data)  # exactly Keras
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        # Keras losses are means over the local batch, so rank r's gradient is
        # weighted by its micro-batch size b_r: Σ b_r g_r / Σ b_r is the serial
        # mean gradient even when micro-batches differ in size or are empty.
        local_batch = _first_dim(x)
        weight_step_means(self.model.metrics)  # also trackers made after compile
        with step_context.step(local_batch) as step:
            moving = batch_normalization.moving_statistics(
                batch_normalization.unsynchronized(self.model))

            def train(batch):
                logs = self.model.train_step(batch)
                # identical weights on every rank (see batch_normalization.py)
                batch_normalization.average_moving_statistics(moving, local_batch, step)
                return logs

            def after_skip():
                batch_normalization.average_moving_statistics(moving, 0, step)

            if self._tnt_step.train_may_be_empty:
                logs = self._unless_empty("train", local_batch, train, data, step, after_skip)
            else:  # no empty-slice branch: a smaller graph to trace (bench/startup.py)
                logs = train(data)
        return self._global_logs(logs, local_batch)

    def _unless_empty(self, kind, local_batch, run_step, data, step, after_skip=None):
        """`run_step(data)`'s logs; a rank whose slice of the last, partial batch is
        empty does not run the model (some TF kernels, e.g. oneDNN
        convolutions, fail on an empty batch) but still takes part in every
        collective of the step, in the same order: the step context's requests
        (global loss normalisers, synchronised BatchNorm statistics) with zero
        contributions, every optimizer apply() with zero gradients of weight 0,
        then `after_skip()`; it returns zeros of the logs' structure."""
        state = self._tnt_step

        def run(batch=data):
            with distributed_optimizer.record_applies() as applies:
                logs = tf.nest.map_structure(tf.convert_to_tensor, run_step(batch))
            # an entry of one value per sample has 0 rows on an empty slice, not this batch's
            batch_dim = _static_first_dim(batch)
            state.logs[kind] = tf.nest.map_structure(
                lambda t: tf.TensorSpec(
                    [None] + t.shape[1:] if t.shape.rank and t.shape[0] in (None, batch_dim)
                    else t.shape, t.dtype), logs)
            state.applies[kind] = applies
            state.replays[kind] = step.requests()
            return logs

        def skip():
            # tf.cond traces the real branch first (see below for a step run
            # eagerly): what it did is in `state`
            # the applies go in where the real branch made them among its TF-level collectives
            # (a metric's result() that sums over ranks comes after them)
            step.replay(state.replays[kind], [
                lambda optimizer=optimizer, variables=variables, grads=grads: optimizer.apply(
                    [None if g is None else distributed_optimizer.zero_gradient(*g) for g in grads], variables)
                for optimizer, variables, grads in state.applies[kind]])
            if after_skip is not None:
                after_skip()
            return tf.nest.map_structure(
                lambda sp: tf.zeros([d or 0 for d in sp.shape], sp.dtype), state.logs[kind])

        if tf.executing_eagerly() and not bool(local_batch > 0):
            # Run eagerly, tf.cond runs one branch only: a rank whose slice is
            # empty cannot know what the real branch issues (a global loss
            # normaliser, synchronised BatchNorm statistics, Dropout's offset,
            # the optimizer's apply and its variables), and the other ranks
            # would wait for it. Traced, tf.cond traces the real branch first:
            # such a step runs as a function, every time. What an earlier step
            # issued is no guide: a compile since then (another optimizer, new
            # metrics) or a layer frozen since (run eagerly, Keras trains what
            # is trainable now) changes it; the rank applied the old optimizer
            # to the global gradient (its weights apart from the others',
            # without a word), failed on the new metrics, or waited for
            # requests named after the old variables until TNT_TIMEOUT_S.
            # The batch's first dimension is traced as unknown, as in a step
            # Keras traces: a static 0 changes what the real branch issues (a
            # tracker's update_state(loss) saw a loss of shape (0,), no scalar,
            # and skipped the batch sizes' allreduce the other ranks made).
            return tf.function(lambda: tf.cond(
                local_batch > 0, lambda: run(tf.nest.map_structure(_unknown_batch, data)), skip),
                autograph=False)()
        return tf.cond(local_batch > 0, run, skip)

    def _global_logs(self, logs, local_batch):
        """The step's logs, global (metrics_aggregation.global_logs): an entry
        that is a metric's result is that metric's global result (from the
        summed metric states, exact); any other entry is the mean over ranks
        weighted by the micro-batch size; an array of one value per sample is
        the global batch's values."""
        return global_logs(logs, self.metrics, local_batch)

    def test_step(self, data):
        if core.get_size() == 1:
            return self.model.test_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        local_batch = _first_dim(x)
        weight_step_means(self.model.metrics)  # also trackers made after compile
        with step_context.step(local_batch) as step:
            logs = self._unless_empty("test", local_batch, self.model.test_step, data, step)
        return self._global_logs(logs, local_batch)

    def predict_step(self, data):
        if not self._tnt_distributed_predict:
            return self.model.predict_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        local_batch = _first_dim(x)

        # Each branch in a step context of its own (a tensor of one branch cannot serve the
        # other): a random layer called with training=True (Monte Carlo dropout) draws the
        # noise of the global batch and keeps this rank's rows, as in a train step. Drawn for
        # the micro-batch, ranks seeded alike drew the same noise for their slices: rank 1's
        # predictions of a repeated input repeated rank 0's (20 distinct of 40 where serial
        # Keras gives 40), without a word. The stand-in's context has no samples.
        def predicted():
            with step_context.step(local_batch):
                return tf.nest.map_structure(lambda t: _one_row_per_sample(t, local_batch),
                                             self.model.predict_step(data))

        def on_one_zero_sample():  # the right output structure and shapes, with 0 rows
            zeros = tf.nest.map_structure(_one_zero_sample, x)
            # a layer's own collectives: not the stand-in's values
            with tensor_collectives.contributing_nothing(), step_context.step(0):
                stand_in = self.model.predict_step((zeros,))
            return tf.nest.map_structure(lambda t: rows(t, 0, 0), stand_in)

        # a layer's own broadcast from a rank with an empty slice fails on every rank
        with tensor_collectives.predicting(local_batch):
            outputs = tf.cond(local_batch > 0, predicted, on_one_zero_sample)
        # Each rank predicted a contiguous slice of the global batch: gathering
        # the slices in rank order restores the global batch, in order.
        return tf.nest.map_structure(_allgather_tensor, outputs)

    # ---- global metrics -----------------------------------------------------------------------
    @property
    def metrics(self):
        """The wrapped model's metrics (it runs the steps)."""
        return self.model.metrics

    def get_metrics_result(self):
        master_only.refuse("tnt.Model.get_metrics_result")
        if core.get_size() == 1:
            return self.model.get_metrics_result()
        return global_metrics_result(self.metrics)

    def reset_metrics(self):
        """keras.Model.reset_metrics; refused in a callback that runs on the
        master only, where it would reset the master's totals only: the
        global results sum every rank's totals, so the next logs would mix
        the master's fresh ones with the other ranks' stale ones (a batch's
        loss 1.43 where serial Keras showed 2.01), without a word. Keras
        resets the metrics itself on every rank at the start of fit,
        evaluate, each epoch and each *_on_batch call."""
        if master_only.active() and core.get_size() > 1:
            raise errors.InvalidUsageError(
                "tnt.Model.reset_metrics was called in a callback that runs on the master rank "
                "only (run_on_all_ranks=False): it would reset the master's metric totals only, "
                "and the global metrics sum every rank's totals, so they would mix the master's "
                "new totals with the other ranks' old ones. Run the callback on every rank "
                "(run_on_all_ranks=True)")
        super().reset_metrics()

    def _tnt_local_metrics_result(self):
        """This rank's own metric values, as floats (for aggregate_logs=False)."""
        return {k: float(np.asarray(v)) if np.size(v) == 1 else np.asarray(v)
                for k, v in self.model.get_metrics_result().items()}

    # ---- data distribution --------------------------------------------------------------------
    def _train_may_be_empty(self, possible):
        """Say whether a rank's slice of a coming training batch can be empty;
        the train step is traced again when that changes."""
        if self._tnt_step.train_may_be_empty != possible:
            self._tnt_step.train_may_be_empty = possible
            self.train_function = None

    def _distribute(self, x, y, sample_weight, batch_size, shuffle, micro_batch_size, distribute,
                    what, kwarg_name, label="x", steps=None):
        """(dataset, global_batch, micro_batch, whether a rank's slice of a
        batch can be empty, the dataset's first_batches.FirstBatches or None)
        for this rank; None where `distribute` is False. `label` names the
        input in errors; `steps` is the call's number of steps (arrays without
        a batch size are spread over them, as in Keras)."""
        validation = label == "validation_data"
        batch_name = "validation_batch_size" if validation else "batch_size"
        if not distribute:
            switch = "tnt_distribute_validation_dataset" if validation else "tnt_distribute_dataset"
            if micro_batch_size is not None:
                # the data is used as given: the size was ignored without a word (an unbatched
                # dataset then failed in Keras on shapes of unknown rank, far from the cause)
                raise ValueError(
                    f"tnt.Model.{what}: {kwarg_name} has no effect with {switch}=False, where "
                    "each rank's data is used as given: batch each rank's part with its "
                    f"micro-batch size yourself (`dataset.batch({micro_batch_size})`) and leave "
                    f"out {kwarg_name}. Received: {kwarg_name}={micro_batch_size!r}, "
                    f"{switch}=False")
            get_logger().info(
                f"tnt.Model.{what}: {switch}=False, so the data is used as given: "
                "each rank must feed its own part of every global batch.")
            return None
        self._refuse_stateful_rnn(what)
        x, y, sample_weight = as_keras_arrays((x, y, sample_weight))
        if isinstance(x, tf.data.Dataset):
            if y is not None or sample_weight is not None:
                raise ValueError(
                    f"`y` and `sample_weight` must be part of the dataset when `x` is a "
                    f"tf.data.Dataset. Received: y={type(y).__name__}, "
                    f"sample_weight={type(sample_weight).__name__}")
            if batch_size is not None:
                raise ValueError(
                    f"Do not pass `{batch_name}` with a tf.data.Dataset: batch the dataset with "
                    f"the global batch size instead. Received: {batch_name}={batch_size}")
            d = distribute_dataset(x, micro_batch_size=micro_batch_size, what=kwarg_name,
                                   label=label)
            return d.dataset, d.global_batch_size, d.micro_batch_size, True, d.first_batches
        if py_dataset.is_py_dataset(x):
            if micro_batch_size is not None:
                raise ValueError(
                    f"tnt.Model.{what}: a keras.utils.PyDataset yields global batches, which each "
                    f"rank slices: leave out {kwarg_name}. Received: {kwarg_name}="
                    f"{micro_batch_size!r}, {label} of type {type(x).__name__}")
            return py_dataset.rank_slices(x, shuffle), None, None, True, None
        if x is None or not _is_array_like(x):
            switch = "tnt_distribute_validation_dataset" if validation else "tnt_distribute_dataset"
            raise TypeError(
                f"tnt.Model.{what} distributes tf.data.Dataset objects, keras.utils.PyDataset "
                "objects and NumPy arrays / tensors. For Python generators or other iterables, build a "
                "tf.data.Dataset (e.g. tf.data.Dataset.from_generator) batched with the global "
                f"batch size, or pass {switch}=False and feed each rank its own "
                f"shard. Received: {label} of type {type(x).__name__}")
        size = core.get_size()
        if micro_batch_size is not None:
            if batch_size is not None and batch_size != micro_batch_size * size:
                raise ValueError(
                    f"{kwarg_name} * ranks must equal {batch_name} (the global batch size). "
                    f"Received: {kwarg_name}={micro_batch_size}, {batch_name}={batch_size} "
                    f"(ranks={size})")
            batch_size = micro_batch_size * size
        if batch_size is not None and (not isinstance(batch_size, (int, np.integer))
                                       or batch_size <= 0):
            raise ValueError(f"{batch_name} must be a positive integer. Received: "
                             f"{batch_name}={batch_size!r}")
        data = (x,) if y is None and sample_weight is None else (
            (x, y) if sample_weight is None else (x, y, sample_weight))
        samples = sample_count(data)  # (a number for an array: refused before any collective)
        if size > 1:
            check_same_on_every_rank(data, what)
        if batch_size is None:
            batch_size = _default_batch_size(samples, steps)
        dataset = array_dataset(data, int(batch_size), core.get_rank(), size,
                                shuffle=shuffle if shuffle == "batch" else bool(shuffle))
        last = samples % int(batch_size)  # the last batch's samples (0: a full batch)
        may_be_empty = batch_size < size or 0 < last < size
        return dataset, int(batch_size), -(-int(batch_size) // size), may_be_empty, None

    def _refuse_stateful_rnn(self, what):
        """A stateful RNN keeps one state per sample of a fixed batch (its
        `batch_shape`), and a rank computes on its slice of each global batch:
        the shapes clashed in a TensorFlow error about incompatible shapes, or,
        with slices of one sample, broadcast to every state without a word.
        Every rank raises here alike, before any collective of the call."""
        if core.get_size() == 1:
            return
        for layer in self.model._flatten_layers(include_self=False):
            if isinstance(layer, (keras.layers.RNN, keras.layers.Bidirectional)) and layer.stateful:
                raise ValueError(
                    f"tnt.Model.{what}: layer {layer.name!r} is a stateful RNN (stateful=True): it "
                    "keeps a state for each sample of a fixed batch, but each rank computes on its "
                    "slice of the global batch, whose samples would not meet their states. Use "
                    "stateful=False, or give each rank its own part of the data with "
                    "tnt_distribute_dataset=False and a batch_shape of that part's size. Received: "
                    f"{layer.name}.stateful=True on {core.get_size()} ranks")

    def _warn_batch_norm(self, micro_batch_size):
        if batch_normalization.prepare(self.model):
            self.train_function = None  # newly synchronised layers: trace the step again
        batch_normalization.warn_unsynchronized(self.model, micro_batch_size)

    def _sync_weights(self, x, stores=()):
        """Make every rank start from the master's weights (once after compile
        and after weights are loaded or set). `x` is what Keras will get;
        `stores` its datasets' first_batches (a pass read here is this rank's
        alone where the model is built on other ranks)."""
        if self._tnt_synced or core.get_size() == 1:
            self._tnt_synced = True
            return
        if not self.model.built:
            # A subclassed model creates its weights at its first call: do it
            # now, on this rank's first batch, so they can be broadcast.
            if isinstance(x, tf.data.Dataset):
                # a sample of zeros of the dataset's shapes where they are known: reading a
                # batch started a pass over the dataset, whose shuffles then drew the next
                # order for every epoch (a subclassed model trained each epoch on the order
                # serial Keras, seeded alike, took an epoch later)
                inputs = _zero_sample_of(keras.utils.unpack_x_y_sample_weight(x.element_spec)[0])
                if inputs is None:
                    with first_batches.unrecorded(stores):
                        inputs = keras.utils.unpack_x_y_sample_weight(next(iter(x)))[0]
            elif py_dataset.is_py_dataset(x):  # this rank's RankSlices
                inputs = keras.utils.unpack_x_y_sample_weight(x[0])[0]
            else:
                inputs = tf.nest.map_structure(lambda t: t[:1], x)
            self(inputs)
        collective_ops.broadcast_variables(
            self.model.weights + random_layers.seed_states(self.model),
            root_rank=core.get_master_rank())
        _finalize_states(self.model)
        self._tnt_synced = True

    def _consistency_checks(self, stores):
        """After the user's callbacks: the ranks stop together
        (keras/callbacks/stop_agreement.py), the check that they read the same
        batches (keras/callbacks/dataset_check.py, from the datasets'
        `first_batches`), and every epoch ends with a check that the ranks
        still hold one model (keras/callbacks/replica_check.py)."""
        if core.get_size() == 1:
            return []
        return [StopAgreement(), DatasetCheck(stores), ReplicaCheck()]

    def _stop_together(self, distributed=True):
        """evaluate's and predict's share of _consistency_checks."""
        return [StopAgreement()] if distributed and core.get_size() > 1 else []

    def _verbose(self, verbose):
        if core.is_master_rank() or config.get("TNT_OUTPUT_ON_ALL_DEVICES"):
            return verbose
        return 0

    # ---- fit / evaluate / predict -------------------------------------------------------------
    @call_agreement.one_thread_at_a_time("fit")
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
        master_only.refuse("tnt.Model.fit")
        self._assert_compile_called("fit")
        mark("fit: begin")
        if validation_split and validation_data is None:
            x, y, sample_weight = as_keras_arrays((x, y, sample_weight))
            if not _is_array_like(x):
                raise ValueError(
                    "validation_split needs NumPy arrays or tensors; with a dataset pass "
                    f"validation_data. Received: x of type {type(x).__name__}")
            (x, y, sample_weight), validation_data = _split_arrays(
                (x, y, sample_weight), validation_split)
            # the end of x validates, distributed as x is: a rank that feeds its own shard
            # (tnt_distribute_dataset=False) validates the end of it; distributed like arrays
            # every rank shares, it was a MismatchError about the shards
            tnt_distribute_validation_dataset = tnt_distribute_dataset
        kinds = {"x": input_kind(x), "validation_data": input_kind(validation_data)}
        arguments = step_counts.same_arguments("fit", {
            "the type of x": kinds["x"], "tnt_distribute_dataset": tnt_distribute_dataset,
            "epochs": epochs, "initial_epoch": initial_epoch, "steps_per_epoch": steps_per_epoch,
            "the type of validation_data": kinds["validation_data"],
            "tnt_distribute_validation_dataset": tnt_distribute_validation_dataset,
            "validation_steps": validation_steps, "validation_freq": validation_freq,
            "batch_size": batch_size, "tnt_micro_batch_size": tnt_micro_batch_size,
            "validation_batch_size": validation_batch_size,
            "tnt_validation_micro_batch_size": tnt_validation_micro_batch_size,
            "shuffle": shuffle, "class_weight": class_weight})
        # one round: the call, its arguments, the callbacks that make collective calls
        call_agreement.check("fit", self, self._tnt_agreement, not self._tnt_synced, arguments,
                             same_checkpoints(callbacks), same_checkpoint_settings(callbacks),
                             same_restoring_stops(callbacks),
                             same_rate_setters(callbacks), same_csv_loggers(callbacks),
                             same_backups(callbacks))
        own_csv_files(callbacks)  # a round of its own only where a CSVLogger runs on every rank
        if class_weight is not None and tnt_distribute_dataset and kinds["x"] == step_counts.KINDS[2]:
            sample_weight = _class_weights_as_keras_arrays(y, sample_weight, class_weight)
            class_weight = None
        train = self._distribute(x, y, sample_weight, batch_size, shuffle, tnt_micro_batch_size,
                                 tnt_distribute_dataset, "fit", "tnt_micro_batch_size",
                                 steps=steps_per_epoch)
        self._train_may_be_empty(train is None or train[3])
        seen = [train[4] if train is not None else None]  # first_batches of x, validation_data
        # what batches validation arrays where validation_batch_size does not (Keras:
        # fit's batch_size; without one, the samples spread over validation_steps, else 32):
        # x's global batch where the user set it for arrays (batch_size, tnt_micro_batch_size).
        # A dataset's own batches are no fit batch_size: serial Keras batches validation
        # arrays beside a dataset by 32. They were batched like the dataset: a step's value
        # averaged per batch (a guide's loss_tracker.update_state(loss)) showed val_loss 8.75
        # where serial Keras shows 4.46 (33 samples: batches of 20 and 13, not 32 and 1)
        x_batch = batch_size
        if train is not None:
            set_by_user = not isinstance(x, tf.data.Dataset) and (
                batch_size is not None or tnt_micro_batch_size is not None)
            x_batch = train[1] if set_by_user else None
            x, micro_batch = train[0], train[2]
            y = sample_weight = batch_size = None
            self._warn_batch_norm(micro_batch)
        if validation_data is not None:
            # a tuple or list (x, y[, sample_weight]), or anything else as a whole (a dataset,
            # a generator, a PyDataset): tuple() of a generator consumed it, its batches taken
            # for x, y and sample_weight (an error about arrays, or an empty generator left)
            vx, vy, vsw = keras.utils.unpack_x_y_sample_weight(validation_data)
            # arrays are batched like x unless validation_batch_size or
            # tnt_validation_micro_batch_size says otherwise (the latter was refused as not
            # matching x's batch, a default the user never gave)
            val = self._distribute(vx, vy, vsw, validation_batch_size or (
                None if isinstance(vx, tf.data.Dataset) or tnt_validation_micro_batch_size else
                x_batch), False, tnt_validation_micro_batch_size,
                tnt_distribute_validation_dataset, "fit", "tnt_validation_micro_batch_size",
                label="validation_data", steps=validation_steps)
            if val is not None:
                validation_data, validation_batch_size = val[0], None
                seen.append(val[4])
        uncounted = step_counts.check_same_batches("fit", {
            "the batches of x": _counted_batches(x, batch_size, steps_per_epoch, kinds["x"],
                                                 tnt_distribute_dataset),
            "the batches of validation_data": _counted_batches(
                validation_data, validation_batch_size or batch_size, validation_steps,
                kinds["validation_data"], tnt_distribute_validation_dataset)})
        mark("fit: datasets distributed")
        self._sync_weights(x, seen)
        mark("fit: weights in sync")
        # a lost peer as PeerLostError
        with collective_ops.collective_errors(step_counts.timeout_hint(uncounted)), between_hooks.between(
                prepare_callbacks(callbacks) + py_dataset.epoch_callbacks(x)
                + self._consistency_checks(seen), self,
                ("stop_training", "stop_evaluating")) as all_callbacks:  # validation stopped too
            return super().fit(
                x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=self._verbose(verbose),
                callbacks=all_callbacks,
                validation_data=validation_data,
                shuffle=False if train is not None else shuffle, class_weight=class_weight,
                sample_weight=sample_weight, initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                validation_batch_size=validation_batch_size, validation_freq=validation_freq)

    @call_agreement.one_thread_at_a_time("evaluate")
    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False, tnt_micro_batch_size=None,
                 tnt_distribute_dataset=True, **kwargs):
        """`keras.Model.evaluate`, data-parallel; the result is global (the
        same on every rank)."""
        master_only.refuse("tnt.Model.evaluate")
        if kwargs.get("_use_cached_eval_dataset"):  # validation inside fit: already distributed
            return super().evaluate(x=x, y=y, batch_size=batch_size, verbose=verbose,
                                    sample_weight=sample_weight, steps=steps, callbacks=callbacks,
                                    return_dict=return_dict, **kwargs)
        self._assert_compile_called("evaluate")
        kind = input_kind(x)
        arguments = step_counts.same_arguments("evaluate", {
            "the type of x": kind, "tnt_distribute_dataset": tnt_distribute_dataset, "steps": steps,
            "batch_size": batch_size, "tnt_micro_batch_size": tnt_micro_batch_size})
        call_agreement.check("evaluate", self, self._tnt_agreement, not self._tnt_synced, arguments)
        data = self._distribute(x, y, sample_weight, batch_size, False, tnt_micro_batch_size,
                                tnt_distribute_dataset, "evaluate", "tnt_micro_batch_size",
                                steps=steps)
        if data is not None:
            x, y, sample_weight, batch_size = data[0], None, None, None
        uncounted = step_counts.check_same_batches("evaluate", {"the batches of x": _counted_batches(
            x, batch_size, steps, kind, tnt_distribute_dataset)})
        self._sync_weights(x, [data and data[4]])
        with collective_ops.collective_errors(step_counts.timeout_hint(uncounted)), between_hooks.between(
                prepare_callbacks(callbacks) + self._stop_together(), self,
                ("stop_evaluating",)) as all_callbacks:
            logs = super().evaluate(x=x, y=y, batch_size=batch_size,
                                    verbose=self._verbose(verbose), sample_weight=sample_weight,
                                    steps=steps, callbacks=all_callbacks,
                                    return_dict=return_dict, **kwargs)
        first_batches.check("the ranks read different data in evaluate", [data and data[4]])
        return logs

    @call_agreement.one_thread_at_a_time("predict")
    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
                tnt_micro_batch_size=None, tnt_distribute_dataset=True):
        """`keras.Model.predict`, data-parallel: every rank predicts its slice
        of each global batch and returns the full predictions, in order."""
        master_only.refuse("tnt.Model.predict")
        # Undistributed, each rank predicts its own data alone: nothing to agree on but that.
        kind = input_kind(x) if tnt_distribute_dataset else step_counts.KINDS[0]
        arguments = step_counts.same_arguments("predict", {
            "the type of x": kind, "tnt_distribute_dataset": tnt_distribute_dataset,
            "steps": steps if tnt_distribute_dataset else None,
            "batch_size": batch_size if tnt_distribute_dataset else None,
            "tnt_micro_batch_size": tnt_micro_batch_size})  # refused undistributed (_distribute)
        call_agreement.check("predict", self, self._tnt_agreement, not self._tnt_synced, arguments)
        data = self._distribute(x, None, None, batch_size, False, tnt_micro_batch_size,
                                tnt_distribute_dataset, "predict", "tnt_micro_batch_size",
                                steps=steps)
        distributed = data is not None and core.get_size() > 1
        if data is not None:
            x, batch_size = data[0], None
        uncounted = step_counts.check_same_batches("predict", {"the batches of x": _counted_batches(
            x, batch_size, steps, kind, tnt_distribute_dataset)}) if tnt_distribute_dataset else []
        self._sync_weights(x, [data and data[4]])
        self._set_distributed_predict(distributed)
        with collective_ops.collective_errors(step_counts.timeout_hint(uncounted)), between_hooks.between(
                prepare_callbacks(callbacks) + self._stop_together(distributed), self, ("stop_predicting",),
                distributed) as all_callbacks:
            outputs = super().predict(x, batch_size=batch_size, verbose=self._verbose(verbose),
                                      steps=steps, callbacks=all_callbacks)
        first_batches.check("the ranks read different data in predict", [data and data[4]])
        return outputs

    # ---- one global batch at a time -----------------------------------------------------------
    @call_agreement.one_thread_at_a_time("train_on_batch")
    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        """`keras.Model.train_on_batch` on a global batch: every rank passes the
        same batch and trains on its slice; the logs are global."""
        master_only.refuse("tnt.Model.train_on_batch")
        self._assert_compile_called("train_on_batch")
        self._train_may_be_empty(True)  # any batch, even one smaller than the ranks
        self._refuse_stateful_rnn("train_on_batch")
        call_agreement.check_on_batch("train_on_batch", self, self._tnt_agreement,
                                      not self._tnt_synced, (x, y, sample_weight, class_weight))
        self._sync_weights(x)
        x, y, sample_weight = _rank_slice((x, y, sample_weight))
        # a peer lost or a timeout as Tarantella's errors, as in fit
        with collective_ops.collective_errors(call_agreement.PER_BATCH_HINT):
            return super().train_on_batch(x, y, sample_weight=sample_weight,
                                          class_weight=class_weight, return_dict=return_dict)

    @call_agreement.one_thread_at_a_time("test_on_batch")
    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        """`keras.Model.test_on_batch` on a global batch (see train_on_batch)."""
        master_only.refuse("tnt.Model.test_on_batch")
        self._assert_compile_called("test_on_batch")
        self._refuse_stateful_rnn("test_on_batch")
        call_agreement.check_on_batch("test_on_batch", self, self._tnt_agreement,
                                      not self._tnt_synced, (x, y, sample_weight))
        self._sync_weights(x)
        x, y, sample_weight = _rank_slice((x, y, sample_weight))
        with collective_ops.collective_errors(call_agreement.PER_BATCH_HINT):
            return super().test_on_batch(x, y, sample_weight=sample_weight, return_dict=return_dict)

    @call_agreement.one_thread_at_a_time("predict_on_batch")
    def predict_on_batch(self, x):
        """`keras.Model.predict_on_batch` on a global batch: every rank predicts
        its slice and returns the predictions of the whole batch."""
        master_only.refuse("tnt.Model.predict_on_batch")
        self._refuse_stateful_rnn("predict_on_batch")
        call_agreement.check_on_batch("predict_on_batch", self, self._tnt_agreement,
                                      not self._tnt_synced, x)
        self._sync_weights(x)
        self._set_distributed_predict(core.get_size() > 1)
        with collective_ops.collective_errors(call_agreement.PER_BATCH_HINT):
            return super().predict_on_batch(_rank_slice((x,))[0])

    def _set_distributed_predict(self, distributed):
        if distributed:
            # a model never compiled (prepared at compile): its random layers draw the global
            # batch's noise, its synchronized=True BatchNormalization the global statistics, where
            # a layer is called with training=True (see predict_step); Keras' own drew per rank,
            # and a BatchNormalization's moving statistics came apart between the ranks
            random_layers.prepare(self.model)
            if batch_normalization.prepare(self.model):
                self.predict_function = None  # newly synchronised layers: trace again
        if distributed != self._tnt_distributed_predict:
            self._tnt_distributed_predict = distributed
            self.predict_function = None  # retrace with (or without) the gather

    # ---- weights and saving -------------------------------------------------------------------
    @call_agreement.one_thread_at_a_time("set_weights")
    def set_weights(self, weights):
        """Set the weights on every rank to the master rank's `weights` (collective)."""
        master_only.refuse("tnt.Model.set_weights")
        error = None
        try:
            super().set_weights(weights)
        except Exception as exc:  # noqa: BLE001 - raised on every rank by the agreement
            error = exc
        # called on some ranks only, or failing on one (weights of other shapes): every rank
        # fails here, instead of waiting in the broadcast until TNT_TIMEOUT_S
        call_agreement.check("set_weights", self, self._tnt_agreement, not self._tnt_synced,
                             error=error)
        collective_ops.broadcast_variables(self.model.weights, root_rank=core.get_master_rank())
        _finalize_states(self.model)
        self._tnt_synced = True

    @call_agreement.one_thread_at_a_time("load_weights")
    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Load weights on every rank, then broadcast the master's, with its
        optimizer state (collective)."""
        master_only.refuse("tnt.Model.load_weights")
        error = None
        try:
            with busy.section(), built_for_loading(getattr(self, "optimizer", None),
                                                   self.trainable_variables if self.built else None):
                self.model.load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        except Exception as exc:  # noqa: BLE001 - raised on every rank by the agreement
            error = explain_missing(exc, filepath)  # a sharded save's, interrupted
        # a rank that could not read the file fails every rank here, before the broadcast
        call_agreement.check("load_weights", self, self._tnt_agreement, not self._tnt_synced,
                             error=error)
        self._broadcast_loaded_state()

    def _broadcast_loaded_state(self):
        """After a load, in which every rank read its own copy of the file:
        every rank takes the master's weights, random generators' states and
        built optimizers' variables. A rank that read a stale file (no shared
        filesystem) kept its own optimizer state where only the weights were
        broadcast, caught at the end of the next epoch by the replica check
        at best; and a loaded model's generators had per-rank seeds, so its
        Dropout drew other noise than serial training (_sync_weights, which
        broadcasts them, is skipped after a load)."""
        optimizers = _held_optimizers(self.model, [getattr(self, "optimizer", None)])
        collective_ops.broadcast_variables(
            self.model.weights + random_layers.seed_states(self.model)
            + [v for o in optimizers if o.built for v in o.variables],
            root_rank=core.get_master_rank())
        _finalize_states(self.model)
        self._tnt_synced = True

    @call_agreement.one_thread_at_a_time("save")
    def save(self, filepath, overwrite=True, zipped=None, tnt_save_all_devices=False, **kwargs):
        """Save the wrapped model (`.keras`, compiled with its optimizer state:
        a plain Keras file), atomically, on the master rank only (every rank
        with `tnt_save_all_devices=True`). Call it on every rank."""
        filepath = os.fspath(filepath)
        check_model_path(filepath, zipped)  # on every rank, before any file or collective work
        check_save_keywords(kwargs)
        save_together("save", self, not self._tnt_synced, filepath,
                      lambda path: self.model.save(path, overwrite=True, zipped=zipped, **kwargs),
                      tnt_save_all_devices, overwrite=overwrite)

    @call_agreement.one_thread_at_a_time("save_weights")
    def save_weights(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Save the wrapped model's weights (`.weights.h5`, the file plain Keras
        writes), atomically, on the master rank only."""
        filepath = os.fspath(filepath)
        check_weights_path(filepath, kwargs.get("max_shard_size"))
        check_save_weights_keywords(kwargs)
        save_together("save_weights", self, not self._tnt_synced, filepath,
                      lambda path: self.model.save_weights(path, overwrite=True, **kwargs),
                      tnt_save_all_devices, overwrite=overwrite,
                      siblings=kwargs.get("max_shard_size") is not None)  # the shards, named after it

    @call_agreement.one_thread_at_a_time("export")
    def export(self, filepath, format="tf_saved_model", verbose=None,  # noqa: A002 - Keras' name
               input_signature=None, **kwargs):
        """The wrapped model's `export` (a TensorFlow SavedModel directory by
        default), atomically, on the master rank only. Call it on every rank.
        Keras' own refused the wrapper, which fit never calls itself ("The model
        provided has never called"), and would have had every rank write the
        same directory at once."""
        filepath = os.fspath(filepath)
        save_together("export", self, not self._tnt_synced, filepath,
                      lambda path: self.model.export(path, format=format, verbose=verbose,
                                                     input_signature=input_signature, **kwargs),
                      False)

    # ---- serialization: the wrapped model's ---------------------------------------------------
    def get_config(self):
        """The wrapped model's config (`tnt.Model.from_config` takes it back)."""
        return self.model.get_config()

    def to_json(self, **kwargs):
        """The wrapped model's JSON (`tnt.models.model_from_json` takes it back)."""
        return self.model.to_json(**kwargs)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A tnt.Model over the model `config` describes: a Functional or
        Sequential model's `get_config()`, or any serialized model
        (`keras.saving.serialize_keras_object(model)`)."""
        model = model_from_config(config, custom_objects)
        return model if isinstance(model, Model) else cls(model)


@keras.saving.register_keras_serializable(package="tarantella", name="Sequential")
class Sequential(Model):
    """A tnt.Model over a `keras.Sequential`: `tnt.Sequential(layers)` is
    `tnt.Model(keras.Sequential(layers))`, with `add` and `pop`.

    Args:
        layers: A list of layers (as for `keras.Sequential`), or a
            `keras.Sequential` to wrap.
        trainable, name: As for `keras.Sequential`.
    """

    def __init__(self, layers=None, trainable=True, name=None, **kwargs):
        if isinstance(layers, keras.Sequential):
            model = layers
        else:
            model = keras.Sequential(layers, trainable=trainable, name=name)
        super().__init__(model, **kwargs)

    def add(self, layer, rebuild=True):
        self.model.add(layer, rebuild=rebuild)

    def pop(self, rebuild=True):
        return self.model.pop(rebuild=rebuild)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A tnt.Sequential from a Sequential model's `get_config()`."""
        model = model_from_config(config, custom_objects)
        if isinstance(model, Model):
            model = model.model
        if not isinstance(model, keras.Sequential):
            raise ValueError("tnt.Sequential.from_config takes a Sequential model's config. "
                             f"Received: the config of a {type(model).__name__}")
        return cls(model)


def save_together(what, model, broadcasts_first, filepath, write, save_all_devices,
                  siblings=False, overwrite=True):
    """A save (`what`, one of step_counts.CALLS) of `model`, called on every
    rank: `write(path)` writes `filepath` atomically on the master (every rank
    with `save_all_devices`), then the ranks meet (master_writes_together).

    `overwrite=False`: an existing `filepath` is a FileExistsError, found by
    the rank that writes, and so on every rank (call_agreement.check). Each
    rank looked for the file itself before: a rank that came to the save
    after the master had written it (a rank slower by the time of the write)
    found the new file and raised alone, while the master waited for it in
    the save's barrier; so did a rank whose relative path named another
    file (another working directory)."""

    def checked_write():
        if not overwrite and os.path.exists(filepath):
            raise FileExistsError(f"{filepath} exists and overwrite=False. Received: overwrite=False")
        return atomic_save(filepath, write, siblings=siblings)

    master_writes_together(what, model, broadcasts_first, checked_write, save_all_devices)


def master_writes_together(what, model, broadcasts_first, write, on_all_ranks=False):
    """`write()` (the files of a save `what`, one of step_counts.CALLS, of
    `model`) on the master (every rank with `on_all_ranks`), called on every
    rank; then the ranks meet in the call agreement, so that every rank may
    read the files once it returns, a save called on the master only fails at
    the other ranks' next call instead of waiting for them, and a write that
    failed raises on every rank. Inside a callback that runs on the master
    only, the other ranks are not saving: no collective."""
    error = None
    if on_all_ranks or core.is_master_rank():
        try:
            with busy.section():  # the others wait for the write, however long it takes
                write()
        except Exception as exc:  # noqa: BLE001 - raised on every rank by the agreement
            error = exc
    if core.get_size() > 1 and not master_only.active():
        call_agreement.check(what, model, getattr(model, "_tnt_agreement", None), broadcasts_first,
                             error=error)
    elif error is not None:
        raise error


def _finalize_states(keras_model):
    """After the master's weights were assigned to `keras_model`'s variables:
    `finalize_state()` of each built layer that has one and owns variables,
    as Keras calls it after loading a layer's variables. A
    Normalization layer computes with constants that finalize_state takes
    from its `adapt_mean` / `adapt_variance` variables (at adapt, build or
    load); assigned the master's values, it kept computing with this rank's
    own: adapted on each rank's own data, or on the master only, the ranks
    normalised their inputs differently (the others with mean 0 and variance
    1 where only the master adapted), trained apart from serial Keras and
    predicted their slices with another model than the master's, though
    their weights were alike, without a word."""
    for layer in keras_model._flatten_layers(include_self=True):
        own = list(getattr(layer, "_trainable_variables", [])) + \
            list(getattr(layer, "_non_trainable_variables", []))
        if layer.built and own and callable(getattr(layer, "finalize_state", None)):
            layer.finalize_state()


def _held_optimizers(keras_model, first=()):
    """The optimizers in `first` (None skipped), then those `keras_model` holds
    as attributes (a GAN's d_optimizer, g_optimizer), in name order (the same
    on every rank); each once."""
    optimizers = []
    candidates = list(first) + [vars(keras_model)[name] for name in sorted(vars(keras_model))]
    for value in candidates:
        is_new = all(value is not o for o in optimizers)
        if isinstance(value, keras.optimizers.Optimizer) and is_new:
            optimizers.append(value)
    return optimizers


def model_from_config(config, custom_objects=None):
    """The Keras model `config` describes (see Model.from_config)."""
    if not isinstance(config, dict):
        raise TypeError(
            f"A model config is a dict. Received: config of type {type(config).__name__}")
    config = copy.deepcopy(config)  # Keras' from_config consumes what it is given
    if "class_name" in config:
        return keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)
    if "input_layers" in config and "output_layers" in config:
        return keras.Model.from_config(config, custom_objects=custom_objects)
    if isinstance(config.get("layers"), list):
        return keras.Sequential.from_config(config, custom_objects=custom_objects)
    raise ValueError(
        "This config does not say which model class to build (a subclassed model's get_config() "
        "names only its arguments): build it yourself, e.g. "
        "tnt.Model(MyModel.from_config(config)), or pass the serialized model, "
        "keras.saving.serialize_keras_object(model). Received: a config with keys "
        f"{sorted(config)}")


# the dtypes the core gathers (context.c); predict's outputs of others travel as one of them
_GATHERED = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


def _allgather_tensor(tensor):
    """The rank-ordered concatenation of every rank's rows (predict's outputs),
    of any dtype a model outputs: predict of a model with a bool output (a
    comparison), an int8 or string one (StringLookup(invert=True)) failed on
    every rank ("DataType bool not in list of allowed values") where serial
    Keras returns it. They travel losslessly as a gathered dtype. A ragged or
    sparse output (serial Keras returns one) travels as its components: it
    failed on every rank ("TntCollectiveStart ... NOT CONVERTIBLE TO TENSOR")."""
    if isinstance(tensor, tf.RaggedTensor):  # its values and each ragged dimension's row lengths
        return tf.RaggedTensor.from_nested_row_lengths(
            _allgather_tensor(tensor.flat_values),
            [_allgather_tensor(lengths) for lengths in tensor.nested_row_lengths()])
    if isinstance(tensor, tf.SparseTensor):  # its entries, rows numbered after the lower ranks'
        counts = _allgather_tensor(tensor.dense_shape[:1])  # each rank's rows
        first = tf.reduce_sum(counts[:core.get_rank()])
        indices = tf.concat([tensor.indices[:, :1] + first, tensor.indices[:, 1:]], 1)
        return tf.SparseTensor(_allgather_tensor(indices), _allgather_tensor(tensor.values),
                               tf.concat([[tf.reduce_sum(counts)], tensor.dense_shape[1:]], 0))
    dtype = tensor.dtype
    if dtype in _GATHERED:
        return collective_ops.allgather_tensors([tensor], ["tnt.predict"])[0]
    if dtype == tf.string:
        return _allgather_strings(tensor)
    if dtype.is_complex:  # its real and imaginary parts, side by side
        parts = _allgather_tensor(tf.stack([tf.math.real(tensor), tf.math.imag(tensor)], -1))
        return tf.complex(parts[..., 0], parts[..., 1])
    if dtype == tf.uint64:
        return tf.bitcast(_allgather_tensor(tf.bitcast(tensor, tf.int64)), tf.uint64)
    if dtype.is_integer or dtype == tf.bool:  # (u)int8/16, uint32, bool: each value in an int64
        return tf.cast(_allgather_tensor(tf.cast(tensor, tf.int64)), dtype)
    raise TypeError(f"tnt.Model.predict cannot gather the ranks' outputs of dtype {dtype.name}: "
                    "cast them in the model to a number type, or predict each rank's own data "
                    "with tnt_distribute_dataset=False")


def _allgather_strings(tensor):
    """_allgather_tensor of strings: their bytes (as int32 codes) and lengths."""
    shape = tf.shape(tensor)
    chars = tf.strings.bytes_split(tf.reshape(tensor, [-1]))  # one 1-byte string per byte
    codes = tf.cast(tf.reshape(tf.io.decode_raw(chars.flat_values, tf.uint8), [-1]), tf.int32)
    codes, lengths = (_allgather_tensor(t) for t in (codes, chars.row_lengths()))
    table = tf.constant([bytes([i]) for i in range(256)])
    joined = tf.strings.reduce_join(
        tf.RaggedTensor.from_row_lengths(tf.gather(table, codes), lengths), axis=1)
    return tf.reshape(joined, tf.concat([[-1], shape[1:]], 0))


def _zero_sample_of(spec):
    """A batch of one sample of zeros for the batches of `spec` (a nest of
    tf.TensorSpec whose shapes are known but for the batch), else None."""
    specs = tf.nest.flatten(spec)
    if not specs or not all(type(s) is tf.TensorSpec and s.shape.rank
                            and s.shape[1:].is_fully_defined() for s in specs):
        return None
    return tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape[1:].as_list(), s.dtype), spec)


def _one_zero_sample(t):
    """A batch of one sample of zeros shaped like the samples of batch `t`
    (a dense, ragged or sparse tensor, possibly of 0 rows). A ragged batch's
    zero sample has one value in each ragged dimension: tf.shape of a ragged
    tensor has no dense form, and predict on ragged inputs failed ("All
    relevant dimensions must be uniform") where serial Keras predicts."""
    if isinstance(t, tf.RaggedTensor):
        sample = tf.zeros(tf.concat([[1], tf.shape(t.flat_values)[1:]], 0), t.dtype)
        for _ in range(t.ragged_rank):
            sample = tf.RaggedTensor.from_row_lengths(
                sample, tf.ones([1], t.row_splits.dtype), validate=False)
        return sample
    if isinstance(t, tf.SparseTensor):
        shape = tf.concat([[1], t.dense_shape[1:]], 0)
        return tf.SparseTensor(tf.zeros([0, tf.size(shape)], tf.int64), tf.zeros([0], t.dtype), shape)
    return tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype)


def _unknown_batch(t):
    """A tensor or array `t` as a tensor whose first dimension is statically
    unknown (its value unchanged); anything else as it is."""
    if isinstance(t, (tf.Tensor, np.ndarray)) and len(t.shape):
        t = tf.convert_to_tensor(t)
        return tf.compat.v1.placeholder_with_default(t, [None] + t.shape[1:].as_list())
    return t


def _rank_slice(batch):
    """This rank's slice of a global batch at hand ((x,), (x, y) or (x, y,
    sample_weight) of the *_on_batch calls)."""
    if core.get_size() > 1 and any(t is not None for t in tf.nest.flatten(batch)):
        # a Python list of numbers (Keras refuses it too) is a ValueError that says so, not an
        # IndexError or "'int' object is not subscriptable"
        sample_count(batch)
    return rank_slice(batch, core.get_rank(), core.get_size())


def _default_batch_size(num_samples, steps):
    """Keras' batch size for arrays given none (its array adapter's rule):
    the samples spread over `steps` where the call sets them, else 32. Always
    32 here, fit(x, y, steps_per_epoch=3) of 90 samples trained on batches of
    32, 32, 26 where serial Keras takes 30, and predict(x, steps=2) returned
    64 predictions of 90, without a word."""
    if isinstance(steps, (int, np.integer)) and not isinstance(steps, bool) and steps > 0:
        return max(1, -(-num_samples // int(steps)))
    return 32


def _class_weights_as_keras_arrays(y, sample_weight, class_weight):
    """The sample weights Keras' array adapter makes of `class_weight` for
    arrays (its errors too). Left to Keras, they were made by the tf.data
    adapter, since tnt hands Keras a dataset: a class above the dict's largest
    key indexed past its table of weights (an InvalidArgumentError on CPU, a
    weight of 0 on GPU, without a word) where serial Keras weights it 1."""
    from keras.src.trainers.data_adapters import data_adapter_utils

    if sample_weight is not None:
        raise ValueError("You cannot `class_weight` and `sample_weight` at the same time.")
    if keras.tree.is_nested(y):
        raise ValueError("`class_weight` is only supported for Models with a single output.")
    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def _split_arrays(arrays, validation_split):
    """Keras' own split: the last `validation_split` of the samples validate."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


# keras.saving.save_model(model, path) and keras.saving.save_weights of a tnt.Model: its own saves
keras_saving.install()
checkpoint_writes.install()
