"""Training scenarios run once per rank count; results go to an .npz per rank.

    python scenarios.py --out DIR --reference   # plain serial Keras, the reference
    tntrun -n N -- python scenarios.py --out DIR  # tnt.Model on N ranks

Every scenario uses the same data, seed and global batch in both modes, so the
test (test_serial_equivalence.py) can compare weights, History, evaluate() and
predict() key by key. One launch runs them all: TensorFlow costs seconds per
process to import, and the test machine has two cores.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

N_TRAIN, N_VAL = 103, 37  # with B=25: 4 full batches and a last batch of 3 (< 4 ranks)
SEQ = 6


def data(n, shape, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n,) + shape).astype("float32")
    y = rng.integers(0, classes, size=n).astype("int32")
    return x, y


def mlp():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((20,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dense(16, activation="tanh")(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def cnn():
    keras.utils.set_random_seed(2)
    return keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


class CallInputsOnly(keras.Model):
    """A subclassed model whose call() takes neither `training` nor `mask`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.hidden2 = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(10)

    def call(self, inputs):
        return self.out(self.hidden2(self.hidden(inputs)))


class CustomSteps(keras.Model):
    """Keras' "customize what happens in fit()" pattern: its own train_step
    (a loss with a weight penalty; it also returns an entry that is no
    metric), test_step, predict_step (probabilities) and metrics; call()
    takes `training` but no `mask`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.dropout = keras.layers.Dropout(0.0)
        self.hidden2 = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(10)
        self.loss_tracker = keras.metrics.Mean(name="custom_loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="custom_accuracy")

    def call(self, inputs, training=None):
        return self.out(self.hidden2(self.dropout(self.hidden(inputs), training=training)))

    @property
    def metrics(self):
        return [self.loss_tracker, self.accuracy]

    def _update(self, x, y, logits, loss):
        # weighted by the batch size: the mean over all samples seen
        self.loss_tracker.update_state(loss, sample_weight=tf.shape(x)[0])
        self.accuracy.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=logits) + 1e-3 * tf.add_n(
                [tf.reduce_sum(tf.square(w)) for w in self.trainable_variables])
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        # an entry that is no metric: this batch's loss (tnt: the ranks' mean,
        # weighted by their batch sizes, i.e. the global batch's loss)
        return {**self._update(x, y, logits, loss), "batch_loss": loss}

    def test_step(self, data):
        x, y = data
        logits = self(x, training=False)
        return self._update(x, y, logits, self.compute_loss(x=x, y=y, y_pred=logits))

    def predict_step(self, data):
        x = data[0] if isinstance(data, (tuple, list)) else data
        return tf.nn.softmax(self(x, training=False))


class GuideSteps(CallInputsOnly):
    """The steps of Keras 3's guide "customizing what happens in fit()": they
    return `{m.name: m.result() for m in self.metrics}`, so the compiled
    metrics come as one nested entry, "compile_metrics" (which tnt averaged
    over the ranks, weighted by their last slice: val_accuracy off by up to
    0.1). The train step returns its batch's loss as "loss" and leaves Keras'
    loss tracker, also named "loss", alone (tnt showed the tracker: 0.0)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            if metric.name != "loss":
                metric.update_state(y, y_pred)
        return {"loss": loss, **{m.name: m.result() for m in self.metrics if m.name != "loss"}}

    def test_step(self, data):
        x, y = data
        y_pred = self(x)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":  # one value per step, no sample weight: counted once
                metric.update_state(loss)  # per rank and step, val_loss was off by 1e-3
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class LossSteps(CallInputsOnly):
    """Custom train and test steps that compute the compiled loss and hand
    the step's values to `_update(x, y, y_pred, loss)`, which returns the
    logs: the subclasses differ in what they track and log."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return self._update(x, y, y_pred, loss)

    def test_step(self, data):
        x, y = data
        y_pred = self(x)
        return self._update(x, y, y_pred, self.compute_loss(y=y, y_pred=y_pred))


class LateTrackers(LossSteps):
    """Trackers added to the model after compile (it is built at its first
    call, so Keras lets it), each updated with one value and no sample
    weight: a Mean of the batch's loss (each rank's update counted once,
    val_late_loss off by 1e-3: only the trackers seen at compile counted
    this rank's share of the batch), and a Sum of the batch's samples (a
    total over the slice: the ranks' values add up to serial's)."""

    def add_trackers(self):
        self.late_loss = keras.metrics.Mean(name="late_loss")
        self.samples = keras.metrics.Sum(name="samples")

    def _update(self, x, y, y_pred, loss):
        self.late_loss.update_state(loss)
        self.samples.update_state(tf.shape(x)[0])
        return self.compute_metrics(x, y, y_pred)


class RenamedResults(LossSteps):
    """Steps that return metrics' results under other names, as Keras' VAE
    guide does (`{"loss": self.total_loss_tracker.result()}`), while the
    compiled loss tracker, also "loss", is never updated: each entry was the
    mean of the ranks' running results weighted by the step's slices (acc
    off by 0.016 after an epoch, loss by 0.03)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.hits = keras.metrics.SparseCategoricalAccuracy(name="hits")

    def _update(self, x, y, y_pred, loss):
        self.total_loss_tracker.update_state(loss)
        self.hits.update_state(y, y_pred)
        return {"loss": self.total_loss_tracker.result(), "acc": self.hits.result()}


class CorrectCount(keras.metrics.Metric):
    """Keras' guide to writing metrics (BinaryTruePositives): a total in a
    variable, and a result() that returns the variable itself."""

    def __init__(self, name="correct_count", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable((), "zeros", name="correct")

    def update_state(self, y_true, y_pred, sample_weight=None):
        hits = tf.equal(tf.cast(tf.argmax(y_pred, -1), tf.int32), tf.cast(y_true, tf.int32))
        self.correct.assign_add(tf.reduce_sum(tf.cast(hits, self.dtype)))

    def result(self):
        return self.correct


def renamed_results():
    keras.utils.set_random_seed(12)
    return RenamedResults()


def late_trackers():
    keras.utils.set_random_seed(11)
    return LateTrackers()


def guide_steps():
    keras.utils.set_random_seed(10)
    return GuideSteps()


def call_inputs_only():
    keras.utils.set_random_seed(4)
    return CallInputsOnly()


def custom_steps():
    keras.utils.set_random_seed(5)
    return CustomSteps()


def mlp_dropout():
    """Every random layer tnt.Model makes exact: GaussianNoise, Dropout,
    AlphaDropout (and one whose noise is shared by the batch's samples),
    GaussianDropout."""
    keras.utils.set_random_seed(8)
    inputs = keras.Input((20,))
    h = keras.layers.GaussianNoise(0.3)(inputs)
    h = keras.layers.AlphaDropout(0.2)(keras.layers.Dense(32, activation="selu")(h))
    h = keras.layers.AlphaDropout(0.3, noise_shape=(1, 32))(h)
    h = keras.layers.Dropout(0.3)(keras.layers.Dense(16, activation="tanh")(h))
    h = keras.layers.GaussianDropout(0.3)(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))  # 6 variables, as the others


def spatial_dropout():
    """SpatialDropout1D: one mask entry per sample and channel."""
    keras.utils.set_random_seed(9)
    inputs = keras.Input((20,))
    h = keras.layers.Reshape((5, 4))(keras.layers.Dense(20, activation="relu")(inputs))
    h = keras.layers.Dense(16, activation="tanh")(keras.layers.Flatten()(
        keras.layers.SpatialDropout1D(0.3)(h)))
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def sequence_model():
    """Per-timestep classes of padded sequences: the loss is a mean over the
    unmasked steps (Embedding(mask_zero=True), return_sequences=True)."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
    h = keras.layers.SimpleRNN(8, return_sequences=True)(h)
    return keras.Model(inputs, keras.layers.Dense(5)(h))


def embedding_model():
    """An Embedding's gradient is an IndexedSlices (one slice per token); 6
    trainable variables, like the other models (the fusion-off timeline
    check counts the requests)."""
    keras.utils.set_random_seed(9)
    return keras.Sequential([
        keras.Input((SEQ,), dtype="int32"),
        keras.layers.Embedding(20, 8),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(16, activation="tanh", use_bias=False),
        keras.layers.Dense(10),
    ])


def two_heads():
    keras.utils.set_random_seed(5)
    inputs = keras.Input((20,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, {"cls": keras.layers.Dense(10, name="cls")(h),
                                "reg": keras.layers.Dense(1, name="reg")(h)})


def fp16_mlp():
    """Mixed precision with a large input scale: the first steps' scaled
    gradients are close to float16's range, so the loss-scale decisions are
    at stake."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(6)
        inputs = keras.Input((20,))
        h = keras.layers.Dense(64, activation="relu")(inputs)
        h = keras.layers.Dense(64, activation="relu")(h)
        return keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def bn_cnn():
    """Synchronised batch normalisation: a BatchNormalization layer switched by
    synchronize_batch_normalization, and a SyncBatchNormalization layer."""
    import tarantella as tnt

    keras.utils.set_random_seed(7)
    return tnt.keras.layers.synchronize_batch_normalization(keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(8, 3),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(16),
        tnt.keras.layers.SyncBatchNormalization(momentum=0.8),
        keras.layers.ReLU(),
        keras.layers.Dense(10),
    ]))


def sequences(n, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, SEQ + 1, size=n)
    x = rng.integers(1, 20, size=(n, SEQ)).astype("int32")
    x[np.arange(SEQ)[None, :] >= lengths[:, None]] = 0  # padding: masked
    return x, rng.integers(0, 5, size=(n, SEQ)).astype("int32")


def compile_(model, optimizer, loss=None, run_eagerly=False, **kwargs):
    model.compile(optimizer=optimizer,
                  loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=run_eagerly,
                  **(kwargs or dict(metrics=["accuracy",
                                             keras.metrics.SparseTopKCategoricalAccuracy(k=3)])))


def scenarios(size):
    """name -> (model builder, optimizer, how to fit). `size` only matters for
    the unbatched case, whose global batch is micro * ranks."""
    xm, ym = data(N_TRAIN, (20,))
    xmv, ymv = data(N_VAL, (20,), seed=1)
    xc, yc = data(N_TRAIN, (12, 12, 1), seed=2)
    xcv, ycv = data(N_VAL, (12, 12, 1), seed=3)
    sgd = lambda: keras.optimizers.SGD(0.05, momentum=0.9)  # noqa: E731
    return {
        # global batch 25: not divisible by 2, 3 or 4; last batch 3 leaves rank 3 of 4 empty
        "mlp_dataset": dict(build=mlp, opt=sgd, B=25, kind="dataset", x=xm, y=ym, val=(xmv, ymv)),
        "cnn_dataset": dict(build=cnn, opt=sgd, B=25, kind="dataset", x=xc, y=yc, val=(xcv, ycv)),
        "mlp_numpy": dict(build=mlp, opt=lambda: keras.optimizers.Adam(1e-2), B=25, kind="numpy",
                          x=xm, y=ym, val=(xmv, ymv)),
        # fit(x, y, shuffle=True) after keras.utils.set_random_seed (in mlp()): serial
        # Keras' order (the same permutation every epoch, as Keras 3 does)
        "mlp_numpy_shuffled": dict(build=mlp, opt=sgd, B=25, kind="numpy", shuffle=True, x=xm,
                                   y=ym, val=(xmv, ymv), sizes=(2, 3)),
        # an unseeded shuffle: tnt seeds it (42); the reference uses seed=42 explicitly; a metric
        # whose result() returns its state variable itself: the global total (each rank logged its
        # own). No validation: serial Keras reads such a variable for History only after the
        # validation has reset and reused the metric, and logs the validation's value for both.
        "mlp_shuffled": dict(build=mlp, opt=sgd, B=16, kind="shuffled", x=xm, y=ym, val=None,
                             compile=dict(metrics=["accuracy", CorrectCount()])),
        "mlp_unbatched": dict(build=mlp, opt=sgd, B=7 * size, micro=7, kind="unbatched", x=xm,
                              y=ym, val=None),
        # subclassed models: call(inputs) alone; call(inputs, training) with its own steps
        "sub_call_inputs": dict(build=call_inputs_only, opt=sgd, B=25, kind="dataset", x=xm, y=ym,
                                val=None),
        "sub_custom_steps": dict(build=custom_steps, opt=sgd, B=25, kind="dataset", x=xm, y=ym,
                                 val=(xmv, ymv)),
        "sub_guide_steps": dict(build=guide_steps, opt=sgd, B=25, kind="dataset", x=xm, y=ym,
                                val=(xmv, ymv)),
        # a Mean and a Sum updated with one value per step, made after compile (uneven slices)
        "sub_late_trackers": dict(build=late_trackers, opt=sgd, B=25, kind="dataset", x=xm, y=ym,
                                  val=(xmv, ymv), sizes=(2, 3)),
        # metrics' results returned under other names (the VAE guide's "loss")
        "sub_renamed_results": dict(build=renamed_results, opt=sgd, B=25, kind="dataset", x=xm,
                                    y=ym, val=(xmv, ymv), sizes=(2, 3),
                                    compile=dict(metrics=None)),
        # train/test/predict_on_batch, run eagerly, from rank-dependent initial weights
        "mlp_on_batch_eager": dict(build=mlp, opt=sgd, B=25, kind="on_batch", x=xm, y=ym,
                                   val=(xmv, ymv)),
        # Losses that are not a plain batch mean, run on 2 and 3 ranks only (one rank is
        # Keras itself; the normalisers are global quantities from 2 ranks on).
        "loss_sum": dict(build=mlp, opt=lambda: keras.optimizers.SGD(0.002), B=25, kind="dataset",
                         x=xm, y=ym, val=(xmv, ymv), sizes=(2, 3), loss=lambda: (
                             keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                        reduction="sum"))),
        "loss_sample_weight": dict(
            build=mlp, opt=sgd, B=25, kind="dataset", x=xm, y=ym, sw=weights(N_TRAIN, 7),
            val=(xmv, ymv, weights(N_VAL, 8)), sizes=(2, 3), loss=lambda: (
                keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction="mean_with_sample_weight")),
            compile=dict(weighted_metrics=["accuracy"])),
        "loss_masked": dict(build=sequence_model, opt=sgd, B=25, kind="dataset",
                            x=sequences(N_TRAIN, 9)[0], y=sequences(N_TRAIN, 9)[1],
                            val=sequences(N_VAL, 10), sizes=(2, 3),
                            compile=dict(metrics=["accuracy"])),
        # Adam (and clipnorm) on an Embedding's IndexedSlices gradient: Keras adds the squares
        # of the slices, so the ranks' slices are gathered, not summed densely (4 ranks: an
        # empty slice of the last batch gathers none); a loss that masks its own values
        # (ignore_class: a quarter of the labels) is normalised by the global unmasked count
        "embedding_adam_ignore_class": dict(
            build=embedding_model, opt=lambda: keras.optimizers.Adam(0.01, clipnorm=0.5), B=25,
            kind="dataset", x=sequences(N_TRAIN, 11)[0], y=ym % 4,
            val=(sequences(N_VAL, 12)[0], ymv % 4), sizes=(2, 3, 4),
            loss=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    ignore_class=3)),
        # the optimizer's own gradient treatments act on the averaged gradient, as in serial
        # Keras: global_clipnorm, decoupled weight decay, a schedule, EMA (overwriting the
        # weights every 3 updates) and gradient accumulation (a mean of 2 averaged gradients;
        # 4 ranks: an empty slice accumulates zeros of weight 0)
        "mlp_optimizer_features": dict(
            build=mlp, B=25, kind="dataset", x=xm, y=ym, val=(xmv, ymv), sizes=(2, 4),
            opt=lambda: keras.optimizers.AdamW(
                keras.optimizers.schedules.ExponentialDecay(0.02, 3, 0.7), weight_decay=0.05,
                global_clipnorm=0.5, use_ema=True, ema_momentum=0.8, ema_overwrite_frequency=3,
                gradient_accumulation_steps=2)),
        # Ftrl with all its regularisations: its accumulators add the squares of the averaged
        # gradient, as serial Ftrl adds those of the batch's (it used to be refused)
        "mlp_ftrl": dict(
            build=mlp, B=25, kind="dataset", x=xm, y=ym, val=(xmv, ymv), sizes=(2,),
            opt=lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=1e-3,
                                              l2_regularization_strength=1e-2,
                                              l2_shrinkage_regularization_strength=1e-2, beta=0.1)),
        # per-output losses (cls_loss, val_reg_loss, ...) and EarlyStopping on one of them
        "two_heads": dict(build=two_heads, opt=sgd, B=25, kind="dataset", x=xm,
                          y={"cls": ym, "reg": xm[:, :1] * 2.0}, sizes=(2, 3), epochs=5,
                          val=(xmv, {"cls": ymv, "reg": xmv[:, :1] * 2.0}),
                          loss=lambda: {"cls": keras.losses.SparseCategoricalCrossentropy(
                              from_logits=True), "reg": "mse"},
                          compile=dict(loss_weights={"cls": 1.0, "reg": 0.5},
                                       metrics={"cls": ["accuracy"]}),
                          callbacks=lambda: [keras.callbacks.EarlyStopping(
                              monitor="val_reg_loss", mode="min", patience=0,
                              min_delta=0.3)]),
        # Dropout, AlphaDropout, GaussianNoise and GaussianDropout draw the serial noise of the
        # global batch (4 ranks: one rank's last slice is empty, yet its seed generators
        # advance like the others')
        "mlp_dropout": dict(build=mlp_dropout, opt=sgd, B=25, kind="dataset", x=xm, y=ym,
                            val=(xmv, ymv), sizes=(2, 3, 4), epochs=3),
        # SpatialDropout1D run eagerly: the last batch (3) gives micro-batches of a static 1,
        # where serial Keras draws 3 rows of noise (each rank drew the shape (1, 1, 4) as
        # shared by the batch, every rank the same row)
        "spatial_dropout_on_batch_eager": dict(build=spatial_dropout, opt=sgd, B=25,
                                               kind="on_batch", x=xm, y=ym, val=(xmv, ymv),
                                               sizes=(2, 3)),
        # synchronised BatchNormalization: global batch statistics, serial-equivalent
        # (tolerance: serial Keras computing the same moments in float64 instead of float32
        # already ends this far from serial Keras; BN amplifies rounding, see docs/keras.md)
        "bn_sync": dict(build=bn_cnn, opt=sgd, B=25, kind="dataset", x=xc, y=yc, val=(xcv, ycv),
                        sizes=(2, 3),
                        tolerance=dict(rtol=1e-4, atol=1e-5, logs=1e-5, predict=1e-4)),
        # mixed_float16: the loss scale must take the serial decisions
        # (inputs x40: both the per-sample float16 backward values and the float16 sums over
        # the batch reach float16's range; float16 rounding makes the weights differ ~1e-3)
        "fp16": dict(build=fp16_mlp, opt=lambda: keras.optimizers.SGD(0.01), B=25,
                     kind="dataset", x=xm * 40.0, y=ym, val=None, sizes=(2, 3),
                     compile=dict(), tolerance=dict(rtol=5e-2, atol=2e-2, logs=2e-2, predict=0.5),
                     record_loss_scale=True),
    }


def weights(n, seed):
    return np.random.default_rng(seed).uniform(0.0, 2.0, size=n).astype("float32")


def run(name, s, reference, out):
    import tarantella as tnt

    if s["kind"] == "on_batch":
        return run_on_batch(name, s, reference)
    model = s["build"]()
    if not reference:
        model = tnt.Model(model)
    compile_(model, s["opt"](), s["loss"]() if "loss" in s else None, **s.get("compile", {}))
    if hasattr(model, "add_trackers"):  # (tnt.Model: the wrapped model's)
        model.add_trackers()  # after compile, before the first step
    B, x, y, kw = s["B"], s["x"], s["y"], {}
    val = s["val"]
    train = (x, y, s["sw"]) if "sw" in s else (x, y)
    callbacks = s["callbacks"]() if "callbacks" in s else []
    scales = []
    if s.get("record_loss_scale"):
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: (
            scales.append(float(model.optimizer.dynamic_scale.numpy())))))
    if s["kind"] == "numpy":
        fit_x, fit_y = x, y
        kw = dict(batch_size=B, shuffle=s.get("shuffle", False))
        val_data = val
        eval_args = dict(x=val[0], y=val[1], batch_size=B)
    else:
        ds = tf.data.Dataset.from_tensor_slices(train)
        if s["kind"] == "shuffled":
            tf.random.set_seed(None)  # no global seed: an unseeded shuffle is random per process
            ds = ds.shuffle(50, seed=42 if reference else None)
        if s["kind"] == "unbatched" and not reference:
            kw = dict(tnt_micro_batch_size=s["micro"])
        else:
            ds = ds.batch(B)
        fit_x, fit_y = ds, None
        val_data = tf.data.Dataset.from_tensor_slices(val).batch(B) if val else None
        eval_args = dict(x=val_data) if val else dict(x=tf.data.Dataset.from_tensor_slices(
            train).batch(B))
    history = model.fit(fit_x, fit_y, epochs=s.get("epochs", 2), verbose=0,
                        validation_data=val_data, callbacks=callbacks, **kw)
    results = model.evaluate(**eval_args, verbose=0, return_dict=True)
    pred_x = eval_args["x"]
    predictions = model.predict(pred_x, batch_size=B if s["kind"] == "numpy" else None, verbose=0)
    arrays = {f"{name}/w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    predictions = tf.nest.map_structure(np.asarray, predictions)
    outputs = predictions.items() if isinstance(predictions, dict) else [("", predictions)]
    for key, value in outputs:
        arrays[f"{name}/predict{key}"] = value
    logs = {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "evaluate": {k: float(v) for k, v in results.items()}}
    if "tolerance" in s:
        logs["tolerance"] = s["tolerance"]
    if scales:
        logs["loss_scale"] = scales
    return arrays, logs


def run_on_batch(name, s, reference):
    """train_on_batch over the epoch's global batches (the last one partial),
    test_on_batch, predict, then predict_on_batch; every rank passes the same
    global batches. The model's initial weights differ between ranks (as an
    unseeded model's would); the master's are serial's."""
    import tarantella as tnt

    rank = 0 if reference else tnt.get_rank()
    model = s["build"]()
    if rank != 0:
        for w in model.weights:
            w.assign(w + rank)
    if not reference:
        model = tnt.Model(model)
    compile_(model, s["opt"](), run_eagerly=True)
    B, x, y, (xv, yv) = s["B"], s["x"], s["y"], s["val"]
    history = {}
    for epoch in range(2):
        for begin in range(0, len(x), B):
            logs = model.train_on_batch(x[begin:begin + B], y[begin:begin + B], return_dict=True)
            for k, v in logs.items():
                history.setdefault(k, []).append(float(v))
    results = model.test_on_batch(xv[:B], yv[:B], return_dict=True)
    arrays = {f"{name}/w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    arrays[f"{name}/predict"] = model.predict(xv, batch_size=B, verbose=0)
    arrays[f"{name}/predict_on_batch"] = model.predict_on_batch(xv[:B])
    return arrays, {"history": history, "evaluate": {k: float(v) for k, v in results.items()}}


def tensor_collectives(tnt):
    """tnt's TF-level collectives on nested structures of tensors, variables,
    arrays and scalars, eagerly and in a tf.function: the failures found."""
    rank, size = tnt.get_rank(), tnt.get_size()
    failures = []

    def x(q):
        return {"t": tf.fill([2, 2], float(q + 1)), "v": tf.Variable([q, 1]),
                "n": np.full(3, q, np.float64), "s": q + 0.5,
                "special": [tf.constant([np.nan if q == 0 else 1.0, np.inf]),
                            tf.constant(-np.inf if q == size - 1 else 2.0, tf.float64)]}

    def check(label, got, want):
        if isinstance(want, dict):
            if not isinstance(got, dict) or list(got) != list(want):
                return failures.append(f"{label}: got {got!r}")
            return [check(f"{label}.{k}", got[k], want[k]) for k in want]
        if isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                return failures.append(f"{label}: got {got!r}")
            return [check(f"{label}[{i}]", g, w) for i, (g, w) in enumerate(zip(got, want))]
        tensor = isinstance(want, tf.Tensor)
        if tensor != isinstance(got, tf.Tensor) or np.asarray(got).dtype != np.asarray(want).dtype \
                or not np.array_equal(np.asarray(got), np.asarray(want), equal_nan=True):
            failures.append(f"{label}: got {type(got).__name__} {got!r}, want {want!r}")

    total = sum(q + 1 for q in range(size))
    ranks = float(sum(range(size)))
    check("TensorAllreducer", tnt.TensorAllreducer(x(rank)).allreduce(x(rank)), {
        "t": tf.fill([2, 2], float(total)), "v": tf.constant([int(ranks), size]),
        "n": np.full(3, ranks), "s": np.float64(ranks + 0.5 * size),
        "special": [tf.constant([np.nan, np.inf]), tf.constant(-np.inf, tf.float64)]})
    root = size - 1
    got = tnt.TensorBroadcaster(x(rank), root_rank=root).broadcast(x(rank) if rank == root else None)
    want = x(root)
    want["v"], want["s"] = tf.convert_to_tensor(want["v"]), np.float64(want["s"])
    check("TensorBroadcaster", got, want)
    rows = {"r": tf.fill([rank + 1, 2], rank), "s": float(rank)}
    check("TensorAllgatherer", tnt.TensorAllgatherer(rows).allgather(rows), {
        "r": tf.concat([tf.fill([q + 1, 2], q) for q in range(size)], 0),
        "s": np.arange(size, dtype=np.float64)})

    import tarantella.tensorflow as tnt_tf  # tensors back for tensors (tnt.allreduce: NumPy)

    @tf.function
    def in_graph(a, c):
        return tnt_tf.allreduce([a, {"c": c}], op="average"), tnt_tf.allgather({"a": a})

    summed, gathered = in_graph(tf.constant([1.0, rank]), tf.constant(rank * size, tf.int64))
    check("tf.function allreduce", summed, [tf.constant([1.0, ranks / size]),
                                            {"c": tf.constant(int(ranks), tf.int64)}])
    check("tf.function allgather", gathered, {"a": tf.constant(
        [v for q in range(size) for v in (1.0, q)])})
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    rank, size = 0, 1
    if not args.reference:
        import tarantella as tnt

        rank, size = tnt.get_rank(), tnt.get_size()
    arrays, logs = {}, {}
    for name, s in scenarios(size).items():
        if args.only and name not in args.only.split(","):
            continue
        if not args.reference and size not in s.get("sizes", (size,)):
            continue
        if args.reference and s["kind"] == "unbatched":
            for n in (1, 2, 3, 4):  # one reference per rank count: the global batch is 7n
                s2 = dict(s, B=7 * n)
                a, l = run(name, s2, True, args.out)
                arrays.update({k.replace(name, f"{name}@{n}"): v for k, v in a.items()})
                logs[f"{name}@{n}"] = dict(l, sizes=[n])
            continue
        a, l = run(name, s, args.reference, args.out)
        if s["kind"] == "unbatched":
            a = {k.replace(name, f"{name}@{size}"): v for k, v in a.items()}
            name = f"{name}@{size}"
        arrays.update(a)
        logs[name] = dict(l, sizes=list(s.get("sizes", (1, 2, 3, 4))))
    checks = {}
    if not args.reference:
        checks["tensor_collectives"] = tensor_collectives(tnt)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"size": size, "logs": logs, "checks": checks}, f)


if __name__ == "__main__":
    main()
