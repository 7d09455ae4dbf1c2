"""Callbacks, save/load, custom loops and warnings, checked on real ranks in one launch.

    python features.py --out DIR --reference       # plain Keras, for the parts compared with serial
    tntrun -n 2 -- python features.py --out DIR    # tnt on every rank

Each rank writes DIR/rank<r>.json (results), its stdout to DIR/stdout<r>.txt and
the files a check saves under DIR/files; test_features.py asserts on them.
"""
import argparse
import json
import logging
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

B, N = 20, 90


def data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 8)).astype("float32"), rng.integers(0, 3, size=n).astype("int32"))


def build(batch_norm=False):
    keras.utils.set_random_seed(3)
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(3))
    return keras.Sequential(layers)


def compile_(model, lr=0.1):
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def datasets():
    x, y = data()
    xv, yv = data(33, seed=1)
    return (tf.data.Dataset.from_tensor_slices((x, y)).batch(B),
            tf.data.Dataset.from_tensor_slices((xv, yv)).batch(B))


def weights(model):
    return [np.asarray(w).tolist() for w in model.get_weights()]


class CountingMonitor(keras.callbacks.RemoteMonitor):
    """A RemoteMonitor that counts the events it would send to its server."""

    def __init__(self):
        super().__init__()
        self.sent = 0

    def on_epoch_end(self, epoch, logs=None):
        self.sent += 1


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs, self.batches, self.train_end = [], 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})

    def on_train_end(self, logs=None):
        self.train_end = {k: float(v) for k, v in (logs or {}).items()}


def check_callbacks(tnt, files, reference):
    """Deciding callbacks decide as in serial training; writing ones write on the master."""
    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model, lr=0.5)
    train, val = datasets()
    rank = tnt.get_rank() if tnt else 0
    csv = keras.callbacks.CSVLogger(os.path.join(files, "log.csv"))
    ckpt = keras.callbacks.ModelCheckpoint(os.path.join(files, "ckpt.keras"), monitor="val_loss")
    everywhere, master_only, local = Recorder(), Recorder(), Recorder()
    monitor = CountingMonitor()
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.02)
    callbacks = [
        # wrapped explicitly: the wrapper must still be (and act as) this EarlyStopping
        early if reference else tnt.keras.callbacks.Callback(early),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=0.05),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        keras.callbacks.TerminateOnNaN(), csv, ckpt, everywhere, monitor,
    ]
    # LambdaCallback stores its functions on the object itself, where they shadowed
    # the wrapper's hooks: the original Tarantella's documented master-only example
    lambda_seen = {"master_only": 0, "local": []}
    if not reference:
        lambda_master_only = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: lambda_seen.__setitem__(
                "master_only", lambda_seen["master_only"] + 1),
            on_epoch_end=lambda epoch, logs: lambda_seen.__setitem__(
                "master_only", lambda_seen["master_only"] + 1))
        lambda_local = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
            lambda_seen["local"].append({k: float(v) for k, v in logs.items()})))
        callbacks += [tnt.keras.callbacks.Callback(master_only, run_on_all_ranks=False),
                      tnt.keras.callbacks.Callback(local, aggregate_logs=False),
                      tnt.keras.callbacks.Callback(lambda_master_only, aggregate_logs=False,
                                                   run_on_all_ranks=False),
                      tnt.keras.callbacks.Callback(lambda_local, aggregate_logs=False)]
    history = model.fit(train, validation_data=val, epochs=8, verbose=2, callbacks=callbacks)
    result = {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
              "epochs_run": len(history.epoch), "everywhere": everywhere.epochs,
              "csv_opened": getattr(csv, "csv_file", None) is not None,
              "monitor_events": monitor.sent,
              "weights": weights(model)}
    if not reference:
        result.update(master_only_batches=master_only.batches, local_epochs=local.epochs,
                      local_train_end=local.train_end, everywhere_train_end=everywhere.train_end,
                      lambda_master_only_calls=lambda_seen["master_only"],
                      lambda_local_epochs=lambda_seen["local"],
                      csv_is_wrapped=isinstance(csv, tnt.keras.callbacks.Callback),
                      wrapped_early_stopping={
                          "same_object": callbacks[0] is early,
                          "is_wrapper": isinstance(early, tnt.keras.callbacks.Callback),
                          "is_early_stopping": isinstance(early, keras.callbacks.EarlyStopping),
                          "class_name": type(early).__name__})
    result["stopped_epoch"] = early.stopped_epoch  # > 0: it stopped the training itself
    return result


def check_save_load(tnt, files):
    rank = tnt.get_rank()
    model = tnt.Model(build())
    out = {}
    model.save(os.path.join(files, "uncompiled.keras"))
    # A name Keras refuses is refused on every rank, naming the user's path,
    # before any rank writes or waits: the next collective still pairs up.
    out["bad_paths"] = []
    for save in (model.save, model.save_weights):
        try:
            save(os.path.join(files, "no_extension"))
            out["bad_paths"].append(None)
        except ValueError as exc:
            out["bad_paths"].append(str(exc))
    # Keras 2's keywords (the original Tarantella passed them on): Keras 3 refuses them,
    # and so does every rank, before the master writes or the others wait for it
    out["bad_keywords"] = []
    for save, name, keywords in (
            (model.save, "kw.keras", {"options": None, "signatures": None}),
            (model.save_weights, "kw.weights.h5", {"save_format": "h5"}),
            (lambda path, **kw: tnt.models.save_model(keras.Sequential([keras.Input((2,))]), path,
                                                      **kw), "kw_plain.keras", {"save_traces": True})):
        try:
            save(os.path.join(files, name), **keywords)
            out["bad_keywords"].append(None)
        except (TypeError, ValueError) as exc:
            out["bad_keywords"].append(f"{type(exc).__name__}: {exc}")
    compile_(model)
    train, _ = datasets()
    model.fit(train, epochs=1, verbose=0)
    # saves inside a callback that runs on the master only skip their barrier (the other
    # ranks are not saving): tnt.Model.save did; tnt.models.save_model of the plain Keras
    # model waited there for the others until TNT_TIMEOUT_S

    class SaveOnMaster(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.save(os.path.join(files, "master_cb.keras"))
            tnt.models.save_model(self.model.model, os.path.join(files, "master_cb_plain.keras"))

    model.fit(train, epochs=1, verbose=0,
              callbacks=[tnt.keras.callbacks.Callback(SaveOnMaster(), run_on_all_ranks=False)])
    out["master_callback_saved"] = sorted(f for f in os.listdir(files) if f.startswith("master_cb"))
    # a legacy .h5 save (written by the master only): Keras 3.15's HDF5 writer popped the
    # optimizer out of the model's compile config, there only; save_model of the plain Keras
    # model was then a MismatchError, and every later .keras file lost its optimizer (model.keras
    # below: load_model gave a fresh RMSprop)
    model.save(os.path.join(files, "legacy.h5"))
    tnt.models.save_model(model.model, os.path.join(files, "after_h5_plain.keras"))
    path = os.path.join(files, "model.keras")
    model.save(path)
    # master only by default: a rank-specific name shows who wrote
    model.save(os.path.join(files, f"by_rank{rank}.keras"))
    model.save(os.path.join(files, f"all_rank{rank}.keras"), tnt_save_all_devices=True)
    if rank == 0:
        # A compiled checkpoint loaded on the master only (no collective): it creates and
        # wraps an optimizer there only. The next models must still name their requests
        # alike on every rank (loaded.fit below would wait for the others otherwise).
        out["master_only_load"] = type(keras.saving.load_model(path).optimizer).__name__
    loaded = tnt.models.load_model(path)
    out["loaded_is_tnt"] = isinstance(loaded, tnt.Model)
    out["loaded_optimizer"] = type(loaded.optimizer).__name__
    out["same_weights"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(),
                                                                    loaded.get_weights()))
    out["same_iterations"] = int(loaded.optimizer.iterations) == int(model.optimizer.iterations)
    model.fit(train, epochs=1, verbose=0)
    loaded.fit(train, epochs=1, verbose=0)
    out["resumed_max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in
                                  zip(model.get_weights(), loaded.get_weights()))
    uncompiled = tnt.models.load_model(path, compile=False)
    out["uncompiled_compiled"] = bool(uncompiled.compiled)
    empty = tnt.models.load_model(os.path.join(files, "uncompiled.keras"))
    out["uncompiled_file_layers"] = len(empty.layers)
    wpath = os.path.join(files, "model.weights.h5")
    model.save_weights(wpath)
    other = tnt.Model(build())
    compile_(other)
    other.load_weights(wpath)
    out["weights_roundtrip"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(),
                                                                        other.get_weights()))
    # Keras' own saving functions given the tnt.Model: every rank wrote the one file at once
    # (a zip whose reading failed with "Bad CRC-32" on 2 ranks), of the wrapper's class
    kpath = os.path.join(files, "keras_save_model.keras")
    keras.saving.save_model(model, kpath)
    kloaded = keras.saving.load_model(kpath)
    out["keras_save_model"] = [type(kloaded).__name__, type(kloaded.optimizer).__name__, all(
        np.array_equal(a, b) for a, b in zip(model.get_weights(), kloaded.get_weights()))]
    kwpath = os.path.join(files, "keras_save_weights.weights.h5")
    keras.saving.save_weights(model, kwpath)
    other = tnt.Model(build())
    other.load_weights(kwpath)
    out["keras_save_weights"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(),
                                                                        other.get_weights()))
    # model.export: refused by Keras ("The model provided has never called"); the master
    # writes the SavedModel, every rank can serve from it once export returns
    model.export(os.path.join(files, "exported"), verbose=False)
    exported = tf.saved_model.load(os.path.join(files, "exported"))  # kept: serve uses its variables
    served = exported.serve(data()[0][:4])
    out["exported_max_diff"] = float(np.max(np.abs(served - model(data()[0][:4]))))
    # tf.saved_model.save of the tnt.Model, on every rank: every rank wrote the one directory
    # at once (now and then one rank alone failed in MergeV2Checkpoints), into what was
    # there. The master now writes it atomically: a file left in the old directory is gone
    saved = os.path.join(files, "tf_saved")
    os.makedirs(os.path.join(saved, "assets"), exist_ok=True)
    if rank == 0:
        open(os.path.join(saved, "assets", "left_over.txt"), "w").close()
    for _ in range(3):
        tf.saved_model.save(model, saved)
    out["tf_saved_model_files"] = sorted(os.listdir(os.path.join(saved, "assets")))
    served = tf.saved_model.load(saved).signatures["serving_default"](tf.constant(data()[0][:4]))
    out["tf_saved_model_max_diff"] = float(np.max(np.abs(list(served.values())[0]
                                                          - model(data()[0][:4]))))
    config = model.get_config()
    out["from_config_layers"] = len(tnt.Model.from_config(config).layers)
    out["from_json_is_tnt"] = isinstance(tnt.models.model_from_json(model.to_json()), tnt.Model)
    out["model_from_config_is_tnt"] = isinstance(
        tnt.models.model_from_config(keras.saving.serialize_keras_object(build())), tnt.Model)
    clone = tnt.models.clone_model(model)
    out["clone"] = [isinstance(clone, tnt.Model), len(clone.layers) == len(model.layers)]
    # set_weights: every rank passes its own values, the master's win
    model.set_weights([np.full_like(w, rank + 1.0) for w in model.get_weights()])
    out["set_weights_value"] = float(model.get_weights()[0].flat[0])
    return out


def custom_loop(tnt, reference, tape_mode):
    """SGD on a global batch of 20 (equal micro-batches) or 25 (uneven, with
    the tape weighted by the micro-batch size), 2 epochs."""
    model = build()
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = data()
    batch = 25 if tape_mode else 20
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    if not reference:
        ds = tnt.data.distribute_dataset(ds).dataset
        tnt.broadcast_variables(model.variables)
        if not tape_mode:
            optimizer = tnt.DistributedOptimizer(optimizer)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        if reference or not tape_mode:
            grads = tape.gradient(loss, model.trainable_variables)
        else:
            grads = tnt.DistributedGradientTape(tape).gradient(
                loss, model.trainable_variables, weight=tf.shape(xb)[0])
        optimizer.apply(grads, model.trainable_variables)

    for _ in range(2):
        for xb, yb in ds:
            step(xb, yb)
    return weights(model)


def loss_scale_around_a_distributed_optimizer(tnt, reference, how):
    """mixed_float16 with the LossScaleOptimizer *around* a DistributedOptimizer:
    made by the user in a loop (how="loop"), or by Keras' compile given
    tnt.DistributedOptimizer(SGD), of a plain model ("compile") or of a
    tnt.Model ("tnt_model", fed the global batches). The first global batch of 20 overflows in float16 on rank 0's half only: serial
    training skips it, and so must every rank. The loss scale after each step
    and the weights."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        # a tnt.Model: a last batch of 1, whose empty slice on rank 1 replays the step's applies
        x, y = data(61 if how == "tnt_model" else 60)
        x[0] *= 1e4  # the first batch's first sample: rank 0's micro-batch
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
        optimizer = keras.optimizers.SGD(0.1)
        if not reference:
            if how == "tnt_model":
                model = tnt.Model(model)
            else:
                ds = tnt.data.distribute_dataset(ds).dataset
                tnt.broadcast_variables(model.variables)
            optimizer = tnt.DistributedOptimizer(optimizer)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        scales = []
        if how != "loop":
            model.compile(optimizer=optimizer, loss=loss_fn)
            record = keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: scales.append(float(model.optimizer.scale_loss(1.0))))
            model.fit(ds, epochs=1, verbose=0, callbacks=[record])
            return {"scales": scales, "weights": weights(model)}
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = optimizer.scale_loss(loss_fn(yb, model(xb, training=True)))
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        for xb, yb in ds:
            step(xb, yb)
            scales.append(float(optimizer.scale_loss(1.0)))
        return {"scales": scales, "weights": weights(model)}
    finally:
        keras.mixed_precision.set_global_policy("float32")


class TwoOptimizers(keras.Model):
    """The GAN pattern of Keras' "customize what happens in fit()": its own
    compile(first, second, loss_fn) and a train_step that applies `first` to
    the first layer and `second` to the second."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.a = keras.layers.Dense(16, activation="relu")
        self.b = keras.layers.Dense(3)
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, inputs):
        return self.b(self.a(inputs))

    def compile(self, first, second, loss_fn):
        super().compile()
        self.first, self.second, self.loss_fn = first, second, loss_fn

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            loss = self.loss_fn(y, self(x, training=True))
        self.first.apply(tape.gradient(loss, self.a.trainable_variables), self.a.trainable_variables)
        self.second.apply(tape.gradient(loss, self.b.trainable_variables), self.b.trainable_variables)
        self.tracker.update_state(loss, sample_weight=tf.shape(x)[0])
        return {"loss": self.tracker.result()}


def own_compile(tnt, reference):
    """A model with its own compile() and two optimizers, 81 samples in global
    batches of 20: the last batch of 1 leaves rank 1 an empty slice, which
    must still take part in both optimizers' allreduces."""
    keras.utils.set_random_seed(6)
    model = TwoOptimizers()
    model(np.zeros((1, 8), "float32"))
    if not reference:
        model = tnt.Model(model)
    model.compile(first=keras.optimizers.SGD(0.1, momentum=0.5),
                  second=keras.optimizers.Adam(0.01),
                  loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(81)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(B), epochs=2, verbose=0)
    return {"history": [float(v) for v in history.history["loss"]], "weights": weights(model)}


def transfer_learning(tnt, reference):
    """Fine-tuning as Keras' transfer learning guide does it, on a base that is
    a tnt.Model itself (as tnt.models.load_model returns it): fit a new head
    on the frozen base, then unfreeze it, recompile with a lower learning rate
    and fit again (the trainable variables change between the fits). Used as
    a layer of another model, a tnt.Model failed at once: Keras handed its
    compute_output_shape the shapes by keyword, and read the output of a
    Sequential that was never called itself."""
    keras.utils.set_random_seed(12)
    base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.2), keras.layers.Dense(12, activation="relu")])
    if not reference:
        base = tnt.Model(base)
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(3)(base(inputs)))
    if not reference:
        model = tnt.Model(model)
    x, y = data(103, seed=13)  # global batches of 20, the last of 3
    out = {}
    for phase, trainable, lr in (("frozen", False, 0.05), ("fine_tuned", True, 0.01)):
        base.trainable = trainable
        model.compile(optimizer=keras.optimizers.Adam(lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
        out[phase] = {"history": [float(v) for v in history.history["loss"]],
                      "weights": weights(model)}
    out["predict"] = model.predict(x[:B], batch_size=B, verbose=0).tolist()
    return out


def epoch_loop(tnt, reference):
    """fit in a loop of one epoch each (initial_epoch=e), on a dataset with an
    unseeded shuffle, which tnt seeds with 42 (the reference passes seed=42):
    every pass must draw a new order, as serial Keras' shuffle does. tnt
    rebuilt the seeded pipeline at every fit, so each epoch trained on the
    first epoch's order again."""
    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    x, y = data()
    tf.random.set_seed(None)  # build() set one, from which TF would derive the shuffle's seed
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=42 if reference else None)
    ds = ds.batch(B)
    history = [float(model.fit(ds, epochs=e + 1, initial_epoch=e, verbose=0).history["loss"][0])
               for e in range(3)]
    # a subclassed model, built by tnt before fit: it read a first batch for that, a pass
    # over the dataset, so every epoch's (seeded) shuffle took the next epoch's order
    keras.utils.set_random_seed(3)
    sub = Subclassed()
    if not reference:
        sub = tnt.Model(sub)
    compile_(sub)
    shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=7).batch(B)
    sub_history = sub.fit(shuffled, epochs=2, verbose=0).history["loss"]
    return {"history": history, "weights": weights(model),
            "subclassed": {"history": [float(v) for v in sub_history], "weights": weights(sub)}}


class Subclassed(keras.Model):
    """A subclassed model: its weights are made at its first call."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def py_datasets(tnt, reference):
    """A keras.utils.PyDataset as fit's x (refused before: build a tf.data
    pipeline), validation_data, evaluate's and predict's x: each rank feeds
    its slice of every batch, and the results are serial Keras'. 81 samples
    in batches of 20 (the last of 1: rank 1's slice is empty), batches
    returned as lists, in worker threads, then in worker processes forked
    after the core started, with class weights. fit shuffles a PyDataset's
    batches (Keras: Python's random.shuffle); the ranks' Python random states
    differ here (rank 1's seed is not the master's): left to each rank, they
    sliced different batches in the same step, samples lost and others taken
    twice, without a word."""
    import random

    x, y = data(81, seed=21)

    class Batches(keras.utils.PyDataset):
        def __init__(self, n, **kwargs):
            super().__init__(**kwargs)
            self.n, self.ends = n, 0

        def __len__(self):
            return -(-self.n // 20)

        def __getitem__(self, i):
            return [x[i * 20:(i + 1) * 20][:self.n], y[i * 20:(i + 1) * 20][:self.n]]

        def on_epoch_end(self):
            self.ends += 1  # Keras' hook reaches the user's dataset

    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    out = {}
    for name, kwargs in (("threads", {"workers": 2}),
                         ("processes", {"workers": 2, "use_multiprocessing": True})):
        random.seed(5 if reference or tnt.get_rank() == 0 else 99)
        train = Batches(81, **kwargs)
        history = model.fit(train, epochs=2, verbose=0, validation_data=Batches(40),
                            class_weight={0: 1.0, 1: 2.0, 2: 0.5} if name == "processes" else None)
        out[name] = {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.history.items())},
                     "epoch_ends": train.ends}
    out["history"] = out["threads"]["history"]  # for _assert_fit_as_serial
    out["weights"] = weights(model)
    out["evaluate"] = [float(v) for v in model.evaluate(Batches(81), verbose=0)]
    out["predict"] = np.asarray(model.predict(Batches(81), verbose=0)).tolist()
    return out


def backup_and_restore(tnt, files, reference):
    """Keras' BackupAndRestore, a job preempted at the start of its third
    epoch and run again: the second fit resumes at epoch 2 from the backup
    (weights and optimizer state), ends with the serial run's history and
    weights, and removes the folder. With double_checkpoint, the previous
    backup is kept beside the latest. Then a backup whose latest weights are
    damaged (a job stopped mid-write by a Keras that writes in place): the
    previous one is restored, as Keras does, alike on every rank. Refused
    before; run unchanged on every rank, each rank decided alone from its own
    disk and made, wrote and removed the folder at once."""
    folder = os.path.join(files, "backup")  # one folder for every rank (a shared file system)

    class Preempted(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt("preempted")  # not an Exception: nothing catches it

    def model():
        m = build()
        m = m if reference else tnt.Model(m)
        compile_(m)
        return m

    x, y = data()
    fit = dict(batch_size=B, epochs=4, shuffle=False, verbose=0)
    try:
        model().fit(x, y, **fit, callbacks=[
            keras.callbacks.BackupAndRestore(folder, double_checkpoint=True), Preempted()])
    except KeyboardInterrupt:
        pass
    left = sorted(os.listdir(folder))
    resumed = model()
    history = resumed.fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(folder)])
    result = {"left": left, "epochs": history.epoch, "history": history.history["loss"],
              "weights": weights(resumed), "removed": not os.path.exists(folder)}
    # a damaged latest backup, the previous one whole: training resumes from the previous one
    try:
        model().fit(x, y, **fit, callbacks=[
            keras.callbacks.BackupAndRestore(folder, double_checkpoint=True), Preempted()])
    except KeyboardInterrupt:
        pass
    if reference or tnt.get_rank() == 0:
        with open(os.path.join(folder, "latest.weights.h5"), "wb") as f:
            f.write(b"half a file")
    if not reference:
        tnt.barrier()
    again = model().fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(folder)])
    result["fallback_epochs"] = again.epoch
    return result


def _traced_step_has_a_cond(model):
    """Whether the train function Keras traced last contains a tf.cond (tnt's
    empty-slice branch: a tiny Dense model has no other)."""
    def find(f):  # Keras keeps the tf.function in a closure of its own wrapper
        if hasattr(f, "_list_all_concrete_functions"):
            return f
        for cell in getattr(f, "__closure__", None) or ():
            try:
                found = find(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
            if found is not None:
                return found
    graph = find(model.train_function)._list_all_concrete_functions()[-1].graph
    ops = list(graph.get_operations()) + [
        op for f in graph._functions.values() for op in f.graph.get_operations()]
    return any(op.type in ("If", "StatelessIf") for op in ops)


def array_fits(tnt, reference):
    """fit() on arrays three times: batches with a sample for every rank (the
    step is traced without the empty-slice branch), then a last batch of 1
    that leaves rank 1 an empty slice (traced again, with it), then full
    batches again."""
    keras.utils.set_random_seed(7)
    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    history, conds = [], []
    for n in (80, 81, 80):
        x, y = data(n, seed=n)
        h = model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        history.append(float(h.history["loss"][0]))
        conds.append(None if reference else _traced_step_has_a_cond(model))
    return {"history": history, "weights": weights(model), "empty_slice_branch": conds}


def wrapped_twice(tnt, reference):
    """One Keras model wrapped in two tnt.Models, both compiled, then the
    first one's fit, on batches of 25 (slices of 13 and 12): the model trains
    with the optimizer of its latest compile (the second wrapper's), as serial
    Keras trains a model compiled twice. That optimizer weighted the gradients
    by the second wrapper's micro-batch, which is no step's: equally, not the
    serial mean gradient (weights 1e-2 apart after 2 epochs)."""
    keras.utils.set_random_seed(7)
    model = build()
    first, second = (model, model) if reference else (tnt.Model(model), tnt.Model(model))
    compile_(first)
    compile_(second)
    x, y = data(75, seed=4)
    h = first.fit(x, y, batch_size=25, epochs=2, shuffle=False, verbose=0)
    return {"history": [float(v) for v in h.history["loss"]], "weights": weights(model)}


def list_arrays(tnt, reference):
    """fit/evaluate/predict on arrays given as lists (x=[a, b] of a two-input
    model, y=[y1, y2] of a two-output one): tf.data refuses lists in a
    dataset's elements, so every rank failed with a TypeError about
    Dataset.map where serial Keras trains."""
    keras.utils.set_random_seed(8)
    a, b = keras.Input((8,)), keras.Input((2,))
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], [keras.layers.Dense(3, name="cls")(h), keras.layers.Dense(1, name="reg")(h)])
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss_weights=[1.0, 0.5],
                  loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"])
    x, y = data(81, seed=4)
    x2 = x[:, :2] * 2.0
    h = model.fit([x, x2], [y, x[:, :1]], batch_size=B, epochs=2, shuffle=False, verbose=0,
                  validation_data=([x, x2], [y, x[:, :1]]))
    evaluated = model.evaluate([x, x2], [y, x[:, :1]], batch_size=B, verbose=0)
    predicted = model.predict([x, x2], batch_size=B, verbose=0)
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(h.history.items())},
            "evaluate": [float(v) for v in evaluated], "weights": weights(model),
            "predict": [np.asarray(p).tolist() for p in predicted]}


class Reconstruction(keras.Model):
    """An autoencoder whose loss is added in call(): it trains on x alone."""

    def __init__(self):
        super().__init__()
        self.encode, self.decode = keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(8)

    def call(self, x):
        reconstructed = self.decode(self.encode(x))
        self.add_loss(tf.reduce_mean(tf.square(reconstructed - x)))
        return reconstructed


def arrays_without_targets(tnt, reference):
    """fit(x, sample_weight=w) without y (Keras takes it, for a model whose
    loss is its own), and a Python list of numbers as y (Keras refuses it:
    'Unrecognized data type'). Both failed on every rank with 'IndexError:
    tuple index out of range'; the first now trains as serial Keras, the
    second is a ValueError that says to pass np.asarray(y), in train_on_batch
    too (an IndexError there, or "'int' object is not subscriptable")."""
    x, _ = data(41, seed=27)
    keras.utils.set_random_seed(28)
    model = Reconstruction()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    history = model.fit(x, sample_weight=np.linspace(0.0, 1.0, 41), batch_size=10, epochs=2,
                        shuffle=False, verbose=0).history
    out = {"history": [float(v) for v in history["loss"]], "weights": weights(model)}
    for call, run in (("list_of_numbers", lambda: model.fit(x, [1.0] * 41, batch_size=10, verbose=0)),
                      ("list_of_numbers_on_batch", lambda: model.train_on_batch(x[:7], [1.0] * 7))):
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - its type and message are checked
            out[call] = [type(exc).__name__, str(exc)]
    return out


def array_steps(tnt, reference):
    """Arrays without a batch size in calls that set the steps: Keras spreads
    the samples over them (fit(x, y, steps_per_epoch=3) of 90 samples: batches
    of 30), also for validation arrays over validation_steps (with x arrays
    without a batch size, or a batched dataset). tnt batched them by 32: other
    batches, 2 steps of evaluate covered 64 samples, predict(steps=2) returned
    64 rows, without a word."""
    x, y = data(90, seed=14)
    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    fits = [model.fit(x, y, epochs=2, steps_per_epoch=3, shuffle=False, verbose=0,
                      validation_data=(x[:50], y[:50]), validation_steps=1),
            model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(B), verbose=0,
                      validation_data=(x[:50], y[:50]), validation_steps=1)]
    return {"history": [{k: [float(v) for v in vs] for k, vs in sorted(h.history.items())}
                        for h in fits],
            "evaluate": [float(v) for v in model.evaluate(x, y, steps=2, verbose=0)],
            "predict": model.predict(x, steps=2, verbose=0).tolist(), "weights": weights(model)}


def validation_iterables(tnt, reference):
    """validation_data that is a generator or a keras.utils.PyDataset, each
    rank's part of every global batch (tnt_distribute_validation_dataset=False;
    serial Keras: the whole batches): the logs are serial Keras'. Before, fit
    unpacked it with tuple(), which consumed a generator (Keras then found it
    empty) and took its batches for x, y and sample_weight; distributed, that
    read as a MismatchError about arrays the user never passed. Now it is the
    TypeError that names validation_data and the switch."""
    x, y = data(80, seed=15)
    rank, size = (0, 1) if reference else (tnt.get_rank(), tnt.get_size())
    share = 20 // size

    def part(i):  # this rank's part of the i-th global batch of 20
        return x[i * 20 + rank * share:i * 20 + (rank + 1) * share], \
            y[i * 20 + rank * share:i * 20 + (rank + 1) * share]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return part(i)

    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    own = {} if reference else {"tnt_distribute_validation_dataset": False}
    out = {}
    for name, validation in (("generator", (part(i) for i in range(4))), ("py_dataset", Batches())):
        history = model.fit(x, y, batch_size=20, shuffle=False, verbose=0,
                            validation_data=validation, **own).history
        out[name] = {k: [float(v) for v in vs] for k, vs in sorted(history.items())}
    if not reference:
        try:
            model.fit(x, y, batch_size=20, verbose=0, validation_data=(part(i) for i in range(4)))
        except Exception as exc:  # noqa: BLE001 - its type and message are checked
            out["distributed_generator"] = [type(exc).__name__, str(exc)]
    return out


def validation_arrays_beside_a_dataset(tnt, reference):
    """Validation arrays (33 samples) beside a dataset x batched by 20, no
    validation batch size: serial Keras batches them by 32 (a dataset's
    batches are no fit batch_size), so a test step's tracker updated with its
    batch's loss (Keras' guides) averages the losses of batches of 32 and 1.
    tnt batched them like the dataset (20 and 13): another val_tracked,
    without a word."""
    x, y = data(40, seed=35)
    xv, yv = data(33, seed=36)
    keras.utils.set_random_seed(37)
    model = OneValueTracker()
    model.build((None, 8))
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(20), epochs=2, verbose=0,
                        validation_data=(xv, yv)).history
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
            "weights": weights(model)}


class OwnSquaredError(keras.Model):
    """Custom steps that use the targets as fed (`y - y_pred`)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            error = tf.reduce_mean(tf.square(y - self(x)))
        self.optimizer.apply(tape.gradient(error, self.trainable_variables),
                             self.trainable_variables)
        return {"error": error}

    def test_step(self, data):
        x, y = data
        return {"error": tf.reduce_mean(tf.square(y - self(x)))}


def float64_arrays(tnt, reference):
    """NumPy's default float64 arrays: Keras feeds them to the steps as
    float32 (floatx); tnt fed float64, and `y - y_pred` in a custom step
    failed on every rank with a TypeError where serial Keras trains."""
    x, _ = data(36, seed=16)
    x, y = x.astype("float64"), (x[:, :1] * 2.0 - 1.0).astype("float64")
    keras.utils.set_random_seed(17)
    model = OwnSquaredError()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    return {"history": [float(v) for v in history["error"]],
            "evaluate": float(model.evaluate(x, y, batch_size=10, verbose=0)),
            "predict": model.predict(x, batch_size=10, verbose=0).tolist(), "weights": weights(model)}


def own_shards_validation_split(tnt, reference):
    """Each rank feeds its own shard (tnt_distribute_dataset=False) with
    validation_split: the end of each shard validates, as that rank's part;
    serial Keras: global batches of both shards' batches, validated on both
    ends. Before, the split was distributed like arrays every rank shares: a
    MismatchError that told the user to feed each rank its own shard with
    tnt_distribute_dataset=False, as they did."""
    x, y = data(80, seed=18)
    shards = [(x[r * 40:(r + 1) * 40], y[r * 40:(r + 1) * 40]) for r in range(2)]
    keras.utils.set_random_seed(19)
    model = build()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    if reference:
        def train(k):  # global batch i: rank 0's batch i of 10, then rank 1's
            return np.concatenate([s[k][i * 10:(i + 1) * 10] for i in range(3) for s in shards])
        history = model.fit(train(0), train(1), batch_size=20, epochs=2, shuffle=False, verbose=0,
                            validation_data=tuple(np.concatenate([s[k][30:] for s in shards])
                                                  for k in range(2))).history
    else:
        xs, ys = shards[tnt.get_rank()]
        history = model.fit(xs, ys, batch_size=10, epochs=2, shuffle=False, verbose=0,
                            validation_split=0.25, tnt_distribute_dataset=False).history
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
            "weights": weights(model)}


class RaggedFeatures(keras.Model):
    """A model of ragged inputs (a variable number of values per sample)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(tf.stack([tf.reduce_mean(x, axis=1), tf.reduce_max(x, axis=1),
                                    tf.cast(x.row_lengths(), "float32")], axis=1))


def ragged_inputs(tnt, reference):
    """fit, evaluate and predict on a dataset of ragged samples, 33 in batches
    of 8 (rank 1's slice of the last batch is empty). predict failed on every
    rank ("All relevant dimensions must be uniform": the empty slice's zero
    sample was built from tf.shape, which a ragged tensor has no dense form
    of), where serial Keras predicts."""
    rng = np.random.default_rng(20)
    values = tf.ragged.constant([rng.normal(size=n).astype("float32")
                                 for n in rng.integers(1, 6, 33)], dtype=tf.float32)
    labels = rng.integers(0, 3, 33).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((values, labels)).batch(8)
    keras.utils.set_random_seed(21)
    model = RaggedFeatures()
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    history = model.fit(dataset, epochs=2, verbose=0).history
    out = {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
           "evaluate": [float(v) for v in model.evaluate(dataset, verbose=0)],
           "predict": model.predict(dataset.map(lambda x, y: x), verbose=0).tolist()}
    # the ragged tensor as arrays (Keras takes them; tnt refused them with a TypeError)
    history = model.fit(values, labels, batch_size=8, validation_split=0.25, shuffle=False,
                        verbose=0).history
    out["array_history"] = {k: [float(v) for v in vs] for k, vs in sorted(history.items())}
    out["array_evaluate"] = [float(v) for v in model.evaluate(values, labels, batch_size=8, verbose=0)]
    out["array_predict"] = model.predict(values, batch_size=8, verbose=0).tolist()
    out["weights"] = weights(model)
    if not reference:  # ragged arrays that differ between ranks are refused like any others
        other = values.with_flat_values(values.flat_values + tnt.get_rank())
        try:
            model.predict(other, batch_size=8, verbose=0)
        except Exception as exc:  # noqa: BLE001 - its type and message are checked
            out["differ"] = [type(exc).__name__, str(exc)]
    return out


def string_arrays(tnt, reference):
    """Strings as arrays (a NumPy object array, a tf.string tensor) into a
    model that looks them up: as serial Keras. The ranks' arrays check read
    their bytes, which an array of references has none of: 'Cannot change
    data-type for array of references' on every rank."""
    words = ["red", "green", "blue", "cyan"]
    rng = np.random.default_rng(22)
    x = np.array(words, dtype=object)[rng.integers(0, 4, 30)]
    y = rng.integers(0, 3, 30).astype("int32")
    keras.utils.set_random_seed(23)
    inputs = keras.Input((), dtype="string")
    model = keras.Model(inputs, keras.layers.Dense(3)(
        keras.layers.StringLookup(vocabulary=words, output_mode="one_hot")(inputs)))
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    history = [model.fit(x, y, batch_size=7, shuffle=False, verbose=0).history["loss"][0],
               model.fit(tf.constant(x.astype(str)), y, batch_size=7, shuffle=False,
                         verbose=0).history["loss"][0]]
    return {"history": [float(v) for v in history], "weights": weights(model),
            "predict": model.predict(x, batch_size=7, verbose=0).tolist()}


class RaggedAndSparseOutputs(keras.Model):
    """Per sample, its positive activations: as a ragged and a sparse tensor."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        h = tf.nn.relu(self.dense(x))
        return {"ragged": tf.RaggedTensor.from_tensor(h, lengths=tf.math.count_nonzero(h, axis=1)),
                "sparse": tf.sparse.from_dense(h)}


def predict_output_dtypes(tnt, reference):
    """predict of a model whose outputs are no float: a bool (a comparison),
    int8, uint64 and strings (StringLookup(invert=True)), 41 samples in
    batches of 10 (rank 1's slice of the last is empty). The core gathers
    float and int32/int64 values only: every rank failed ("DataType bool not
    in list of allowed values") where serial Keras predicts. Then a model's
    ragged and sparse outputs, by predict and predict_on_batch."""
    keras.utils.set_random_seed(29)
    inputs = keras.Input((8,))
    logits = keras.layers.Dense(3)(inputs)
    index = keras.ops.argmax(logits, axis=-1)
    words = keras.layers.StringLookup(vocabulary=["a", "bb", "ccc"], invert=True,
                                      num_oov_indices=0)(index)
    model = keras.Model(inputs, {
        "positive": keras.ops.greater(logits[:, 0], 0.0), "int8": keras.ops.cast(logits * 10, "int8"),
        "uint64": keras.ops.cast(keras.ops.abs(logits) * 1e6, "uint64"),
        "words": keras.ops.stack([words, words], axis=1)})
    if not reference:
        model = tnt.Model(model)
    x = data(41, seed=30)[0]
    predicted = model.predict(x, batch_size=10, verbose=0)
    out = {key: [str(value.dtype), value.astype(str if value.dtype == object else "float64").tolist()]
           for key, value in sorted(predicted.items())}
    # ragged and sparse outputs (they failed on every rank: "NOT CONVERTIBLE TO TENSOR")
    keras.utils.set_random_seed(31)
    model = RaggedAndSparseOutputs()
    if not reference:
        model = tnt.Model(model)
    for call, predicted in (("predict", model.predict(x, batch_size=10, verbose=0)),
                            ("predict_on_batch", model.predict_on_batch(x[:3]))):
        ragged, sparse = predicted["ragged"], predicted["sparse"]
        out[call] = {"ragged": [type(ragged).__name__, ragged.to_list()],
                     "sparse": [type(sparse).__name__, sparse.indices.numpy().tolist(),
                                sparse.values.numpy().tolist(), sparse.dense_shape.numpy().tolist()]}
    return out


def class_weight_arrays(tnt, reference):
    """class_weight naming some classes only ({0: 2.0}, labels 0-2) with
    arrays: Keras weights the others 1. tnt handed Keras a dataset, whose
    adapter indexes a table of weights up to the largest key: an
    InvalidArgumentError on CPU (a weight of 0 on GPU, without a word)."""
    x, y = data(41, seed=24)
    keras.utils.set_random_seed(25)
    model = build()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, class_weight={0: 2.0}, batch_size=10, epochs=2, shuffle=False,
                        verbose=0).history
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
            "weights": weights(model)}


def pandas_and_sparse_arrays(tnt, reference):
    """The arrays Keras' array adapter takes besides NumPy arrays and dense
    tensors: a pandas DataFrame with a Series of labels, a SciPy sparse
    matrix and a tf.SparseTensor, fit (validation_split, shuffled), evaluate
    and predict on 41 samples in batches of 10 (rank 1's slice of the last is
    empty), and the *_on_batch calls on a batch of 7 of the DataFrame (its
    index of floats: pandas before 3.0 sliced it by label) and the
    tf.SparseTensor. tnt refused them all with a TypeError that said to build
    a dataset (the *_on_batch calls of a tf.SparseTensor: "'SparseTensor'
    object is not subscriptable"). A kind whose package is not installed is
    left out."""
    import importlib.util

    rng = np.random.default_rng(26)
    x = rng.normal(size=(41, 8)) * (rng.random((41, 8)) < 0.4)  # float64, mostly zeros
    y = rng.integers(0, 3, 41)
    kinds = {}
    if importlib.util.find_spec("pandas") is not None:
        import pandas

        index = np.linspace(0.0, 40.0, 41)  # floats (timestamps, say): by label for pandas < 3
        kinds["pandas"] = (pandas.DataFrame(x, columns=[f"f{i}" for i in range(8)], index=index),
                           pandas.Series(y, index=index))
    if importlib.util.find_spec("scipy") is not None:
        import scipy.sparse

        kinds["scipy"] = (scipy.sparse.csr_matrix(x), y)
    kinds["tf_sparse"] = (tf.sparse.from_dense(x.astype("float32")), y)
    out = {}
    for kind, (xs, ys) in kinds.items():
        model = build()
        if not reference:
            model = tnt.Model(model)
        compile_(model)
        history = model.fit(xs, ys, batch_size=10, validation_split=0.2, verbose=0).history
        got = {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
               "evaluate": [float(v) for v in model.evaluate(xs, ys, batch_size=10, verbose=0)],
               "predict": model.predict(xs, batch_size=10, verbose=0).tolist()}
        if kind != "scipy":  # Keras' *_on_batch take no SciPy matrix
            head = tf.sparse.slice(xs, [0, 0], [7, 8]) if kind == "tf_sparse" else xs.iloc[:7]
            labels = ys.iloc[:7] if kind == "pandas" else ys[:7]
            got["on_batch"] = [float(model.train_on_batch(head, labels)[0]),
                               float(model.test_on_batch(head, labels)[0]),
                               np.asarray(model.predict_on_batch(head)).tolist()]
        got["weights"] = weights(model)
        out[kind] = got
    return out


class OneValueTracker(keras.Model):
    """A test step that updates a Mean tracker with its batch's loss alone
    (Keras' guides): inside tnt, a share of the global batch, which sums the
    batch sizes."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)
        self.tracker = keras.metrics.Mean(name="tracked")

    def call(self, x):
        return self.dense(x)

    def test_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        self.tracker.update_state(self.compute_loss(x=x, y=y, y_pred=self(x)))
        return {"tracked": self.tracker.result()}


def empty_slices(tnt, reference):
    """Steps in which rank 1's slice is empty (a last batch of 1 sample):
    - fit of a model with synchronised BatchNormalization layers (one over
      axis 1, whose statistics are transposed first): the empty rank must
      update the moving statistics from the global moments like the others,
      and name its gradient requests alike;
    - run eagerly, with a summed loss (a global normaliser: the step sums the
      batch sizes), train_on_batch whose very first batch is smaller than the
      ranks, then a full one, then another of 1 sample; test_on_batch alike of
      a model whose test step updates a tracker with one value (the empty
      rank's first step, traced with a static batch of 0, saw a loss of
      shape (0,), skipped the batch sizes' sum: a timeout); then compiled again
      with Adam and a metric, and a layer frozen, rank 1's first step after each
      with an empty slice."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([
        keras.Input((4, 8)), keras.layers.Dense(6, activation="relu"),
        keras.layers.BatchNormalization(axis=1, synchronized=True), keras.layers.Flatten(),
        keras.layers.BatchNormalization(synchronized=True), keras.layers.Dense(3)])
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    x, y = data(81, seed=4)
    x = np.stack([x * (i + 1) for i in range(4)], axis=1)
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
    out = {"batch_norm_weights": weights(model),
           "batch_norm_predict": model.predict(x[:B], batch_size=B, verbose=0).tolist()}
    model = build()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.01), run_eagerly=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="sum"))
    x, y = data(22, seed=5)
    out["eager_losses"] = [float(model.train_on_batch(x[a:b], y[a:b]))
                           for a, b in ((0, 1), (1, 21), (21, 22))]
    out["eager_weights"] = weights(model)
    # compiled again (Adam, a metric) and a layer frozen later, still run eagerly: rank 1's
    # first step after each has an empty slice (it replayed the earlier steps' requests: it
    # applied the old SGD to the global gradient, its weights apart without a word; failed on
    # the new metric; waited for requests named after the unfrozen variables)
    model.compile(optimizer=keras.optimizers.Adam(0.01), run_eagerly=True, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out["recompiled_losses"] = [float(model.train_on_batch(x[a:b], y[a:b], return_dict=True)["loss"])
                                for a, b in ((0, 1), (1, 21))]
    model.layers[0].trainable = False
    out["recompiled_losses"] += [float(model.train_on_batch(x[a:b], y[a:b], return_dict=True)["loss"])
                                 for a, b in ((21, 22), (1, 21))]
    out["recompiled_weights"] = weights(model)
    keras.utils.set_random_seed(12)
    model = OneValueTracker()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer="sgd", run_eagerly=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out["eager_tracked"] = [float(model.test_on_batch(x[a:b], y[a:b], return_dict=True)["tracked"])
                            for a, b in ((0, 1), (1, 21), (21, 22))]
    out["own_collectives"] = own_collectives_in_the_model(tnt, reference)
    return out


def own_collectives_in_the_model(tnt, reference):
    """A layer that centres its input on the global batch mean and a metric whose result() sums
    its state over the ranks, both with an unnamed tarantella.tensorflow.allreduce, fit and
    evaluated on 81 samples in batches of 20: rank 1's slice of the last batch is empty, and it
    skips the model (the metric's result() comes after the optimizer's apply). Rank 1 runs
    eagerly, rank 0 traced. Before, the empty rank made neither call, and both ranks waited until
    TNT_TIMEOUT_S; now it makes them with zeros, which add nothing, as serial Keras sees it.
    Then predict alike, whose empty rank runs the model on a stand-in sample."""
    if reference:
        allreduce = tf.stop_gradient  # the collectives have no gradient (docs/api.md)
    else:
        import tarantella.tensorflow as tnt_tf

        allreduce = tnt_tf.allreduce

    class GlobalCentre(keras.layers.Layer):
        def call(self, x):
            sums = allreduce(tf.concat([tf.reduce_sum(x, 0), tf.cast(tf.shape(x)[:1], x.dtype)], 0))
            return x - sums[:-1] / sums[-1]

    class GlobalMeanLogit(keras.metrics.Metric):
        def __init__(self, name="mean_logit"):
            super().__init__(name=name)
            self.total = self.add_weight(name="total", initializer="zeros")
            self.count = self.add_weight(name="count", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(tf.reduce_sum(y_pred))
            self.count.assign_add(tf.cast(tf.size(y_pred), "float32"))

        def result(self):
            both = allreduce(tf.stack([tf.convert_to_tensor(self.total), tf.convert_to_tensor(self.count)]))
            return both[0] / both[1]

    keras.utils.set_random_seed(13)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(6), GlobalCentre(), keras.layers.Dense(3)])
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[GlobalMeanLogit()], run_eagerly=not reference and tnt.get_rank() == 1)
    x, y = data(81, seed=6)
    history = model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0).history
    evaluated = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    # predict runs the empty rank's model on a stand-in sample of zeros: its layer's allreduce
    # counted that sample (rank 0's last prediction centred on half its input, without a word)
    predicted = model.predict(x, batch_size=B, verbose=0).tolist()
    return {"history": history, "evaluated": evaluated, "weights": weights(model), "predicted": predicted}


class MonteCarloDropout(keras.Model):
    """Dropout called with training=True, in predict too (Monte Carlo dropout)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.drop, self.out = (keras.layers.Dense(16, activation="relu"),
                                            keras.layers.Dropout(0.5), keras.layers.Dense(2))

    def call(self, x):
        return self.out(self.drop(self.hidden(x), training=True))


class BatchStatisticsInPredict(keras.Model):
    """A synchronised BatchNormalization called with training=True, in predict too."""

    def __init__(self):
        super().__init__()
        self.hidden, self.norm, self.out = (keras.layers.Dense(4), keras.layers.BatchNormalization(synchronized=True),
                                            keras.layers.Dense(2))

    def call(self, x):
        return self.out(self.norm(self.hidden(x), training=True))


def monte_carlo_dropout(tnt, reference):
    """predict of a model whose Dropout always draws, on one input repeated 41 times in batches of
    20 (the last one leaves rank 1 empty), uncompiled, then compiled and run eagerly on rank 1:
    every prediction is serial Keras' draw. Before, each rank drew the noise of its micro-batch,
    with the same seed: rank 1's 10 rows of each batch repeated rank 0's (20 distinct values of 41
    where serial Keras gives 41), without a word. Then a synchronised BatchNormalization called
    with training=True: the global batch's statistics, an empty rank's stand-in counting none."""
    keras.utils.set_random_seed(21)
    model = MonteCarloDropout()
    model(np.zeros((1, 8), "float32"))
    if not reference:
        model = tnt.Model(model)
    x = np.repeat(data(1, seed=22)[0], 41, axis=0)
    out = {"uncompiled": model.predict(x, batch_size=B, verbose=0).tolist()}
    model.compile(optimizer="sgd", loss="mse", run_eagerly=not reference and tnt.get_rank() == 1)
    out["eager_on_1"] = model.predict(x, batch_size=B, verbose=0).tolist()
    # the batch's statistics in predict: rank 1's stand-in sample of the last batch (1 sample)
    # counted as a sample of zeros in them (that row 1.9 off serial Keras, without a word)
    keras.utils.set_random_seed(23)
    model = BatchStatisticsInPredict()
    model(np.zeros((2, 8), "float32"))
    if not reference:
        model = tnt.Model(model)
    out["batch_statistics"] = model.predict(data(41, seed=24)[0], batch_size=B, verbose=0).tolist()
    out["batch_statistics_weights"] = weights(model)  # the moving statistics, updated alike
    return out


def check_stale_file_loads(tnt, files):
    """Every rank reads the file it loads: without a shared filesystem, one
    may read a stale copy. Rank r reads its own file here (the same relative
    path in its own directory), of a model that has trained 1 + r epochs on
    its own data: after tnt.models.load_model and load_weights every rank
    holds the master's weights, optimizer state (Adam's iterations and slots:
    only the weights were broadcast) and Dropout's generator state (a loaded
    model's was per rank, so its noise was not serial training's)."""
    rank = tnt.get_rank()

    def build_with_dropout():  # its seed per rank (the global ones are left alone)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dropout(0.3, seed=100 + rank), keras.layers.Dense(3)])

    def compile_adam(model):
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    own = os.path.join(files, f"stale_rank{rank}")
    os.makedirs(own, exist_ok=True)
    plain = build_with_dropout()  # a plain Keras model: each rank trains and saves its own
    compile_adam(plain)
    x, y = data(24, seed=10 + rank)
    plain.fit(x, y, batch_size=8, epochs=1 + rank, verbose=0)
    plain.save(os.path.join(own, "stale.keras"))
    plain.save_weights(os.path.join(own, "stale.weights.h5"))
    here = os.getcwd()
    os.chdir(own)
    try:
        loaded = tnt.models.load_model("stale.keras")
        into = tnt.Model(build_with_dropout())
        compile_adam(into)
        into.load_weights("stale.weights.h5")
    finally:
        os.chdir(here)
    out = {}
    for name, model in (("load_model", loaded), ("load_weights", into)):
        out[name] = {
            "weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "optimizer": [np.asarray(v).tolist() for v in model.optimizer.variables],
            "seeds": [np.asarray(layer.seed_generator.state).tolist() for layer in model.layers
                      if hasattr(layer, "seed_generator")]}
    return out


class ArrayLogs(keras.Model):
    """Custom steps that log arrays besides the loss: one value per sample
    (serial Keras shows the batch's), a pair per sample, one value per
    feature (the same length on every rank) and, with `one_more`, an array of
    one more value than the slice's samples (no global value)."""

    def __init__(self, one_more=False):
        super().__init__()
        self.dense = keras.layers.Dense(3)
        self.one_more = one_more

    def call(self, x):
        return self.dense(x)

    def _per_sample(self, x, y):
        return keras.losses.sparse_categorical_crossentropy(y, self(x), from_logits=True)

    def train_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            per_sample = self._per_sample(x, y)
            loss = tf.reduce_mean(per_sample)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        return {"loss": loss, "per_sample": per_sample,
                "pair": tf.stack([per_sample, 2 * per_sample], axis=1),
                "feature_means": tf.reduce_mean(x, axis=0)[:5]}

    def test_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if self.one_more:
            return {"one_more": tf.range(tf.shape(x)[0] + 1)}
        return {"per_sample": self._per_sample(x, y)}


def array_logs(tnt, reference):
    """Log entries that are arrays, in a custom step's logs, on uneven slices
    (35 samples: 18 and 17; 9: 5 and 4), in graph and run eagerly, as serial
    Keras shows them; rank 1's slice is empty in a test_on_batch of 1. Before,
    each was a weighted mean of the ranks' arrays: a MismatchError about
    'tnt.metrics' on uneven slices, one slice's shape otherwise."""
    x, y = data(35, seed=6)
    out = {}
    for eager in (False, True):
        keras.utils.set_random_seed(13)
        model = ArrayLogs()
        if not reference:
            model = tnt.Model(model)
        model.compile(optimizer=keras.optimizers.SGD(0.05), run_eagerly=eager)
        run = {}
        for n in (35, 16, 1):
            run[f"test_on_batch_{n}"] = model.test_on_batch(
                x[:n], y[:n], return_dict=True)["per_sample"].tolist()
        run["train_on_batch"] = {k: np.asarray(v).tolist() for k, v in model.train_on_batch(
            x[:9], y[:9], return_dict=True).items()}
        history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
        run["history"] = {k: np.asarray(v).tolist() for k, v in history.items()}
        run["evaluate"] = np.asarray(model.evaluate(
            x, y, batch_size=10, verbose=0, return_dict=True)["per_sample"]).tolist()
        out["eager" if eager else "graph"] = run
    if not reference:
        model = tnt.Model(ArrayLogs(one_more=True))
        model.compile()
        try:
            model.test_on_batch(x, y)
        except Exception as exc:  # noqa: BLE001 - its type and message are checked
            out["one_more_error"] = [type(exc).__name__, str(exc)]
    return out


class StepsSeen(keras.metrics.Metric):
    """The steps a metric was updated in, counted alike on every rank
    (aggregation="only_first_replica"), and a running mean of the batches'
    mean predictions (aggregation="mean"), as a dict."""

    def __init__(self, name="steps_seen", **kwargs):
        super().__init__(name=name, **kwargs)
        self.steps = self.add_variable((), "zeros", aggregation="only_first_replica", name="steps")
        self.mean = self.add_variable((), "zeros", aggregation="mean", name="mean")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.steps.assign_add(1.0)
        self.mean.assign(self.mean * 0.5 + 0.5 * tf.reduce_mean(y_pred))

    def result(self):
        return {"steps_seen": self.steps, "running_mean": self.mean}


def metric_aggregations(tnt, reference):
    """A custom metric's states declared aggregation="only_first_replica" (a
    step counter) and "mean", as Keras reads them under a tf.distribute
    strategy: the master's value and the ranks' mean. Every state was summed:
    2 steps per step on 2 ranks, without a word. 40 samples in batches of 10
    (even slices: the running mean is then serial Keras' up to rounding)."""
    x, y = data(40, seed=31)
    keras.utils.set_random_seed(32)
    model = build()
    if not reference:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[StepsSeen()])
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
            "evaluate": {k: float(v) for k, v in sorted(model.evaluate(
                x, y, batch_size=10, verbose=0, return_dict=True).items())}}


def adapted_normalization(tnt, reference):
    """A Normalization layer adapted on the master's data, another rank's
    adapted on other data (its own shard): every rank takes the master's
    weights, and computes with them, so fit and predict are serial Keras'
    (adapted on the master's data). The layer computes with constants taken
    from its variables at adapt (finalize_state): the broadcast assigned the
    master's mean and variance to the variables, and rank 1 kept normalising
    with its own, without a word."""
    x, y = data(41, seed=33)
    norm = keras.layers.Normalization()
    norm.adapt(x if reference or tnt.is_master_rank() else x[:7] * 3.0 + 1.0)
    keras.utils.set_random_seed(34)
    model = keras.Sequential([keras.Input((8,)), norm, keras.layers.Dense(3)])
    if not reference:
        model = tnt.Model(model)
    compile_(model)
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    return {"history": {k: [float(v) for v in vs] for k, vs in sorted(history.items())},
            "weights": weights(model),
            "predict": np.asarray(model.predict(x, batch_size=10, verbose=0)).tolist()}


def check_misc(tnt, files):
    out = {}
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("tarantella").addHandler(Catch())
    model = tnt.Model(build(batch_norm=True))
    compile_(model)
    x, y = data()
    # micro-batches of 20 and 19: unsynchronised BN still warns, and the ranks' moving
    # statistics (from different samples) are averaged so that every rank ends alike
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(39), epochs=2, verbose=0)
    out["batch_norm_warning"] = [m for m in records if "BatchNormalization" in m]
    out["batch_norm_weights"] = weights(model)
    # a frozen BatchNormalization (transfer learning's pretrained base, trainable=False)
    # normalises with its moving statistics and never updates them, as in serial Keras: it
    # must not warn, and its statistics must stay what they were (they were averaged over
    # the ranks after every step, which rounded them anew: 1 ulp of drift per step)
    records.clear()
    model = tnt.Model(build(batch_norm=True))
    norm = model.layers[1]
    norm.moving_mean.assign(np.linspace(-1.0, 1.0, 16) * 0.37)
    norm.moving_variance.assign(np.linspace(0.5, 2.0, 16) * 1.13)
    statistics = [np.array(norm.moving_mean), np.array(norm.moving_variance)]
    norm.trainable = False
    compile_(model)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(39), epochs=2, verbose=0)
    out["frozen_batch_norm"] = {
        "warning": [m for m in records if "BatchNormalization" in m],
        "statistics_kept": [np.array_equal(a, np.array(v)) for a, v in
                            zip(statistics, (norm.moving_mean, norm.moving_variance))]}
    model = tnt.Model(build())
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    out["jit_compile"] = bool(model.jit_compile)
    out["xla_info"] = any("XLA" in m for m in records)
    # TensorBoard (on the master only) works with what `pip install .[tensorflow]` installs
    model = tnt.Model(build())
    compile_(model)
    model.fit(datasets()[0], epochs=1, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(os.path.join(files, "tb_fit"))])
    # broadcast_variables of lists that differ between the ranks: shapes (2, 3) and (3, 2) have
    # one count, which used to be enough to assign the master's values in the wrong shape;
    # an empty list on one rank left the others waiting
    rank = tnt.get_rank()
    for key, shapes in (("broadcast_shapes", [(2, 3) if rank == 0 else (3, 2), (4,)]),
                        ("broadcast_empty", [] if rank == 1 else [(2,)])):
        variables = [tf.Variable(tf.zeros(shape)) for shape in shapes]
        try:
            tnt.broadcast_variables(variables)
            out[key] = None
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = type(exc).__name__
    variables = [tf.Variable(tf.fill((2, 3), float(rank))), tf.Variable(rank + 1), tf.Variable(rank > 0)]
    tnt.broadcast_variables(variables, root_rank=1)
    out["broadcast_values"] = [np.asarray(v).tolist() for v in variables]
    # summary(print_fn=...) hands the caller the summary: printed on the master only, it left
    # the other ranks' collected lines empty (a count or parse of them then differed)
    lines = []
    model.summary(print_fn=lambda line, **kwargs: lines.append(line))
    out["summary_lines"] = len(lines)
    # CSVLoggers wrapped to run on every rank: one file for both ranks was written by both at
    # once (one rank's lines and a stray tail of the other's), now refused on every rank
    # before training; a file per rank is written by its rank
    for key, name in (("csv_shared", "shared.csv"), ("csv_own", f"own-{rank}.csv")):
        logger = tnt.keras.callbacks.Callback(keras.callbacks.CSVLogger(os.path.join(files, name)),
                                              aggregate_logs=False, run_on_all_ranks=True)
        try:
            model.fit(x, y, batch_size=39, epochs=2, verbose=0, callbacks=[logger])
            out[key] = None
        except ValueError as exc:
            out[key] = str(exc)
    return out


def check_callback_failure(tnt, out):
    """A callback that runs on the master only raises: the master handles the
    error and carries on (sleeps); the other rank must not wait for it until
    TNT_TIMEOUT_S but fail at once with a PeerLostError naming the master."""
    rank = tnt.get_rank()

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom in a master-only callback")

    model = tnt.Model(build())
    compile_(model)
    start = time.time()
    try:
        model.fit(datasets()[0], epochs=3, verbose=0,
                  callbacks=[tnt.keras.callbacks.Callback(Boom(), run_on_all_ranks=False)])
        result = {"error": None}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        result = {"error": type(exc).__name__, "message": str(exc), "rank_blamed":
                  getattr(exc, "rank", None)}
    result["seconds"] = time.time() - start
    with open(os.path.join(out, f"failure{rank}.json"), "w") as f:
        json.dump(result, f)
    if rank == 0:
        time.sleep(120)  # handled the error, still alive: the others must not wait for it
    raise SystemExit(1)


def check_slow_master(tnt, out):
    """Saves on the master that outlast TNT_TIMEOUT_S (a large model, a slow
    network file system), stood in for by a layer whose state takes
    TNT_TIMEOUT_S + 3 s to write: a ModelCheckpoint on every rank (the master writes,
    the other rank waits in the save's closing allgather) and one that runs on
    the master only (the other rank waits in its next collective). The other
    rank used to fail with a TimeoutError at TNT_TIMEOUT_S; it waits for the
    master, busy on its own, and both end with the files written."""
    rank = tnt.get_rank()
    slow_s = float(os.environ["TNT_TIMEOUT_S"]) + 3

    class SlowToSave(keras.layers.Layer):
        def call(self, x):
            return x

        def save_own_variables(self, store):
            time.sleep(slow_s)

    model = tnt.Model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(3), SlowToSave()]))
    compile_(model)
    files = os.path.join(out, "files")
    on_all = keras.callbacks.ModelCheckpoint(os.path.join(files, "slow_all.keras"))
    on_master = tnt.keras.callbacks.Callback(
        keras.callbacks.ModelCheckpoint(os.path.join(files, "slow_master.keras")), run_on_all_ranks=False)
    try:
        model.fit(datasets()[0], epochs=1, verbose=0, callbacks=[on_all, on_master])
        tnt.barrier()  # the other rank waits here for the master's last save
        # a custom loop's tf.train.Checkpoint saved on the master only (Horovod's guides): the
        # other rank waits for it in the barrier
        folder = os.path.join(out, "tf_checkpoint")
        if rank == 0:
            slow = tf.train.CheckpointOptions(experimental_write_callbacks=[lambda path: time.sleep(slow_s)])
            tf.train.Checkpoint(step=tf.Variable(1)).save(os.path.join(folder, "ckpt"), options=slow)
        tnt.barrier()
        result = {"error": None, "files": sorted(os.listdir(files)), "checkpoint": sorted(os.listdir(folder))}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        result = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(out, f"slow{rank}.json"), "w") as f:
        json.dump(result, f)


def check_slow_teardown(tnt, out):
    """Keras's own work between the callback hooks that takes longer than
    TNT_TIMEOUT_S on one rank: in TensorFlow 2.21 dropping a tf.data iterator
    can take up to the autotune period (up to 60 s; between_hooks.py has the
    measurement). Stood in for on rank 1 by a TFEpochIterator that records,
    each time it replaces the iterator it holds or is dropped, whether the
    rank is in a section of its own then (its peers' view of it: this decides
    the test without timing), and takes TNT_TIMEOUT_S + 1 s there three times:
    replacing fit's after epoch 1's last batch, dropping fit's as fit returns
    (the flaky end of the slow-master test), and dropping the iterator of a fit
    that a callback stops after its first batch, which Python's garbage
    collector drops. The other rank waits in its next collective each time; it
    used to fail with a TimeoutError at TNT_TIMEOUT_S."""
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    from tarantella.common import busy

    rank = tnt.get_rank()
    slow_s = float(os.environ["TNT_TIMEOUT_S"]) + 1
    stalls = []
    slow = {("replaced", 1), ("dropped", 2), ("dropped", 5)}  # the nth of each that takes long

    def stall(what):
        stalls.append([what, busy._open > 0])
        if (what, sum(1 for s in stalls if s[0] == what)) in slow:
            time.sleep(slow_s)

    make, drop = TFEpochIterator._get_iterator, vars(TFEpochIterator).get("__del__")
    if rank == 1:
        def slow_to_replace(self):
            if self._current_iterator is not None:  # one still held: replaced now
                stall("replaced")
            return make(self)

        TFEpochIterator._get_iterator = slow_to_replace
        TFEpochIterator.__del__ = lambda self: stall("dropped")
    model = tnt.Model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)]))
    compile_(model)
    train, validation = datasets()
    stop = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: setattr(model, "stop_training", True))
    try:
        history = model.fit(train, validation_data=validation, epochs=2, verbose=0)
        evaluated = model.evaluate(validation, verbose=0, return_dict=True)
        predicted = model.predict(validation, verbose=0)
        stopped = model.fit(train, epochs=2, verbose=0, callbacks=[stop])
        stalls.append("stopped fit returned")
        tnt.barrier()
        result = {"error": None, "history": history.history, "evaluated": evaluated,
                  "predicted": np.asarray(predicted).tolist(), "stopped": stopped.history,
                  "stalls": stalls}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        result = {"error": type(exc).__name__, "message": str(exc), "stalls": stalls}
    finally:  # Keras's own again, for check_slow_master after this in the same launch
        TFEpochIterator._get_iterator = make
        if drop is not None:
            TFEpochIterator.__del__ = drop
        elif "__del__" in vars(TFEpochIterator):
            del TFEpochIterator.__del__
    with open(os.path.join(out, f"teardown{rank}.json"), "w") as f:
        json.dump(result, f)


def check_replicas_diverging(tnt):
    """Callbacks that change the model on some ranks only: a master-only one sets
    the learning rate, one edits a kernel on rank 1 in the middle of the first
    epoch. Without the epoch's check both trained on without an error, each
    rank with its own model. Every rank must raise the same MismatchError.
    Before them, arrays that differ between the ranks, which fit refuses at once."""
    rank = tnt.get_rank()

    class LearningRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.optimizer.learning_rate.assign(0.01)

    class EditKernel(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if rank == 1 and batch == 1:
                kernel = self.model.trainable_variables[0]
                kernel.assign_add(tf.fill(kernel.shape, 1e-3))

    out = {}
    # arrays that differ between ranks: a value (another file), the number of samples
    x, y = data()
    # ... and the same rows in another order (each rank shuffled them on its own): rows of whole 64-bit
    # words, whose sum and XOR (the fingerprint before) no order changes
    shuffled = np.roll(np.arange(N), 2 * rank)
    for key, (xr, yr) in (("arrays", (x + rank, y)), ("arrays_length", (x[:N - 10 * rank], y[:N - 10 * rank])),
                          ("arrays_shuffled", (x[shuffled], y[shuffled]))):
        model = tnt.Model(build())
        compile_(model)
        try:
            model.fit(xr, yr, batch_size=B, epochs=1, verbose=0)
            out[key] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
    for key, callback in (("learning_rate", tnt.keras.callbacks.Callback(LearningRate(),
                                                                         run_on_all_ranks=False)),
                          ("kernel", EditKernel())):
        model = tnt.Model(build())
        compile_(model)
        history = keras.callbacks.History()
        try:
            model.fit(datasets()[0], epochs=3, verbose=0, callbacks=[callback, history])
            out[key] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
        out[key]["epochs_run"] = len(history.epoch)
    # The master builds a model and an optimizer the others do not (to inspect a
    # checkpoint, say): Keras' name counters then differ between the ranks, so the
    # same variables have other paths (sequential_5/dense_9/kernel on rank 0,
    # sequential_4/... on rank 1), which the check compared and refused as a
    # different model
    if rank == 0:
        keras.optimizers.SGD().build(build().trainable_variables)
    model = tnt.Model(build())
    compile_(model)
    try:
        model.fit(datasets()[0], epochs=2, verbose=0)
        out["master_built_more"] = {"error": None}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        out["master_built_more"] = {"error": type(exc).__name__, "message": str(exc)}
    return out


def check_stops(tnt):
    """Callbacks that stop a loop on one rank only: fit at the end of epoch 1
    on rank 0, fit after batch 1 of epoch 1 on rank 1, evaluate after batch 0
    on rank 0, predict after batch 1 on rank 1. Before, the stopping rank left
    and the others waited for its next step until TNT_TIMEOUT_S (the epoch's
    end raised a MismatchError). Every rank must stop with it, after the same
    step, and say which rank asked."""
    rank = tnt.get_rank()

    class Stop(keras.callbacks.Callback):
        def __init__(self, flag, hook, on_rank, at):
            super().__init__()
            self.flag, self.on_rank, self.at = flag, on_rank, at
            setattr(self, hook, self._maybe_stop)

        def _maybe_stop(self, step, logs=None):
            if rank == self.on_rank and step == self.at:
                setattr(self.model, self.flag, True)

    class Record(logging.Handler):
        def emit(self, record):
            out["warnings"].append(record.getMessage())

    out = {"warnings": []}
    record = Record()
    logging.getLogger("tarantella").addHandler(record)
    x, y = data()
    for key, callback in (("fit_epoch", Stop("stop_training", "on_epoch_end", 0, 0)),
                          ("fit_batch", Stop("stop_training", "on_train_batch_end", 1, 1))):
        model = tnt.Model(build())
        compile_(model)
        history = keras.callbacks.History()
        started = time.monotonic()
        model.fit(datasets()[0], epochs=3, verbose=0, callbacks=[callback, history])
        out[key] = {"epochs_run": len(history.epoch), "steps": int(model.optimizer.iterations),
                    "seconds": time.monotonic() - started, "weights": weights(model)}
    model = tnt.Model(build())
    compile_(model)
    out["evaluate"] = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True,
                                     callbacks=[Stop("stop_evaluating", "on_test_batch_end", 0, 0)])
    out["evaluate_full"] = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    out["predict_rows"] = len(model.predict(
        x, batch_size=B, verbose=0, callbacks=[Stop("stop_predicting", "on_predict_batch_end", 1, 1)]))
    logging.getLogger("tarantella").removeHandler(record)
    return out


def check_rank_state(tnt):
    """Non-trainable state that each rank updates from its own slice (a
    custom layer summing its inputs) differed without a word: the epoch's
    replica check now warns, naming it, once per fit. A model with
    BatchNormalization and Dropout (whose moving statistics are averaged and
    whose seed states draw per rank on purpose) fits without that warning."""
    class Total(keras.layers.Layer):
        def build(self, input_shape):
            self.total = self.add_weight(shape=(), initializer="zeros", trainable=False, name="total")

        def call(self, inputs, training=None):
            if training:
                self.total.assign_add(tf.reduce_sum(inputs))
            return inputs

    said = []

    class Record(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    record = Record()
    logging.getLogger("tarantella").addHandler(record)
    out = {}
    for key, layers in (("alike", [keras.layers.Dense(16), keras.layers.BatchNormalization(synchronized=True),
                                   keras.layers.Dropout(0.3), keras.layers.Dense(3)]),
                        ("total", [Total(), keras.layers.Dense(3)])):
        keras.utils.set_random_seed(3)
        model = tnt.Model(keras.Sequential([keras.Input((8,))] + layers))
        compile_(model)
        said.clear()
        model.fit(datasets()[0], epochs=2, verbose=0)
        out[key] = [m for m in said if "non-trainable state" in m]
    logging.getLogger("tarantella").removeHandler(record)
    return out


def run_cases(tnt, cases):
    """Each case on a fresh compiled model: {key: {"error": None}} or the
    error's type and message."""
    out = {}
    for key, run in cases.items():
        model = tnt.Model(build())
        compile_(model)
        try:
            run(model)
            out[key] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
    return out


def check_unnamed_tf_collectives(tnt):
    """Unnamed TF collectives in a tf.function that ranks retrace apart: 99
    samples in global batches of 25 give rank 0 micro-batches of 13 and (last)
    12, rank 1 only 12s, so rank 0 traces the step twice and rank 1 once.
    Each step allgathers its samples and sums their count; the sums and the
    gathered batches, which every rank must see as the serial global ones."""
    import tarantella.tensorflow as ttf

    x = np.arange(99, dtype="float32")
    local = tnt.data.distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(25)).dataset

    @tf.function
    def step(xb):
        return ttf.allgather(xb), ttf.allreduce(tf.cast(tf.shape(xb)[0], tf.float32))

    gathered, counts = [], []
    for xb in local:
        batch, count = step(xb)
        gathered.append(batch.numpy().tolist())
        counts.append(float(count))
    # threads that each trace a function named "f" at once: each pairs with its namesake thread
    sums = {}

    def work(t):
        @tf.function
        def f(v):
            return ttf.allreduce(v)

        sums[t] = [float(f(tf.fill([4], 10.0 * t + tnt.get_rank()))[0]) for _ in range(20)]

    threads = [threading.Thread(target=work, args=(t,), name=f"summer{t}") for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"gathered": gathered, "counts": counts, "traces": step.experimental_get_tracing_count(),
            "threads": [sums.get(t) for t in range(3)]}


def check_threads_training(tnt, named):
    """Four Python threads train a model each (of one architecture) at once, in
    custom loops of a tf.function with tnt.DistributedOptimizer (even threads)
    or tnt.DistributedGradientTape (odd ones), their requests named after the
    thread (named) or not, after tnt.broadcast_variables of weights that rank 1
    has changed; rank 1 starts the threads in the other order. Per thread: the
    largest difference between its weights and a serial replay of its data
    (the mean of every rank's gradients), or the error its thread met. None on the numpy_function path (TNT_TF_OPS), whose
    waits hold inter-op threads (keras.md, "The ops")."""
    from tarantella.tensorflow import ops as tf_ops

    if tf_ops.get() is None:
        return None
    # 12 steps: enough for the named threads to meet the hang every time before (3 runs of 3)
    threads, steps, size, rank = 4, 12 if named else 4, tnt.get_size(), tnt.get_rank()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def batch(t, r, i):
        rng = np.random.default_rng([t, r, i])
        return rng.normal(size=(6, 8)).astype("float32"), rng.integers(0, 3, 6).astype("int32")

    def gradients(model, x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    models = []
    for t in range(threads):
        keras.utils.set_random_seed(t)
        models.append(keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(3)]))
    initial = [m.get_weights() for m in models]
    trained = {}

    def train(t):
        try:
            model, name = models[t], f"trainer{t}" if named else None
            if rank:
                model.set_weights([w + 1 for w in initial[t]])
            tnt.broadcast_variables(model.variables)
            optimizer = keras.optimizers.SGD(0.1)
            if t % 2 == 0:
                optimizer = tnt.DistributedOptimizer(optimizer, name=name)

            @tf.function
            def step(x, y):
                if t % 2 == 0:
                    grads = gradients(model, x, y)
                else:
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, model(x, training=True))
                    grads = tnt.DistributedGradientTape(tape, name=name).gradient(loss, model.trainable_variables)
                optimizer.apply(grads, model.trainable_variables)

            for i in range(steps):
                step(*batch(t, rank, i))
            trained[t] = model.get_weights()
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            text = str(exc)
            trained[t] = f"{type(exc).__name__}: {text[text.find('Tarantella'):] if 'Tarantella' in text else text}"[:800]

    workers = [threading.Thread(target=train, args=(t,), name=f"trainer{t}") for t in range(threads)]
    for worker in (workers if rank == 0 else workers[::-1]):
        worker.start()
    for worker in workers:
        worker.join()
    out = []
    for t, model in enumerate(models):
        if isinstance(trained.get(t), str):
            out.append(trained[t])
            continue
        model.set_weights(initial[t])
        optimizer = keras.optimizers.SGD(0.1)
        for i in range(steps):
            grads = [gradients(model, *batch(t, r, i)) for r in range(size)]
            optimizer.apply([sum(g[k] for g in grads) / size for k in range(len(grads[0]))],
                            model.trainable_variables)
        out.append(max(float(np.abs(a - b).max()) for a, b in zip(trained[t], model.get_weights())))
    return out


def check_step_counts(tnt):
    """Inputs and arguments that would make the ranks take different numbers
    of steps (each step is collective, so they used to wait for each other
    until TNT_TIMEOUT_S), which fit and evaluate refuse before the first step,
    and two that must still run: a rank whose dataset is longer under
    steps_per_epoch, and datasets tf.data cannot count (a filter)."""
    rank = tnt.get_rank()
    x, y = data()
    extra = 20 * rank  # rank 1: one more batch of B
    more = data(extra, seed=1)  # the same first N samples, then `extra` more
    xl, yl = np.concatenate([x, more[0]]), np.concatenate([y, more[1]])
    shard = slice(0, 50) if rank == 0 else slice(50, N)  # own shards: 3 and 2 batches of B
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    cases = {
        "dataset_length": lambda m: m.fit(tf.data.Dataset.from_tensor_slices((xl, yl)).batch(B),
                                          epochs=1, verbose=0),
        "own_shards": lambda m: m.evaluate(x[shard], y[shard], batch_size=B, verbose=0,
                                           tnt_distribute_dataset=False),
        "epochs": lambda m: m.fit(ds, epochs=2 - rank, verbose=0),
        "input_type": lambda m: m.fit(ds if rank == 0 else x, None if rank == 0 else y,
                                      batch_size=None if rank == 0 else B, epochs=1, verbose=0),
        "batch_size": lambda m: m.fit(x, y, batch_size=B * (1 + rank), verbose=0),
        "class_weight": lambda m: m.fit(ds, class_weight={0: 1.0, 1: 1.0 + rank, 2: 1.0}, verbose=0),
        "validation_length": lambda m: m.fit(ds, validation_data=(xl, yl), validation_batch_size=B,
                                             tnt_distribute_validation_dataset=False, verbose=0),
        # must run: the steps are set, or tf.data cannot count the batches
        "bounded": lambda m: m.fit(tf.data.Dataset.from_tensor_slices((xl, yl)).batch(B),
                                   steps_per_epoch=2, epochs=2, verbose=0),
        "filtered": lambda m: m.fit(ds.unbatch().filter(lambda a, b: b >= 0).batch(B), epochs=1,
                                    verbose=0),
    }
    return run_cases(tnt, cases)


def check_master_only_collectives(tnt):
    """A callback that runs on the master only calls collectives: the other
    ranks never call them, so each waited for them until TNT_TIMEOUT_S (or, an
    unnamed one, took the name of their next collective). Each is refused at
    once with an InvalidUsageError naming it; the callback catches them here,
    so fit goes on, on every rank. So is reset_metrics, which reset the
    master's metric totals only (the next logs summed them with the other
    ranks' older ones, without a word)."""
    import tarantella.tensorflow as tnt_tf
    tried = {}

    class Collectives(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            calls = {
                "allreduce": lambda: tnt.allreduce(np.ones(2, np.float32)),
                "allreduce_async": lambda: tnt.allreduce_async(np.ones(2, np.float32)).wait(),
                "broadcast": lambda: tnt.broadcast(np.ones(2, np.float32)),
                "allgather": lambda: tnt.allgather(np.ones(2, np.float32)),
                "barrier": lambda: tnt.barrier(),
                "tf_allreduce": lambda: tnt_tf.allreduce(tf.ones(2)),
                "evaluate": lambda: self.model.evaluate(datasets()[1], verbose=0),
                "predict": lambda: self.model.predict(data()[0][:8], verbose=0),
                "set_weights": lambda: self.model.set_weights(self.model.get_weights()),
                "get_metrics_result": lambda: self.model.get_metrics_result(),
                # no collective, but the master's totals only: the global logs mixed them
                # with the other ranks' stale ones
                "reset_metrics": lambda: self.model.reset_metrics(),
            }
            for key, call in calls.items():
                try:
                    call()
                    tried[key] = {"error": None}
                except Exception as exc:  # noqa: BLE001 - recorded for the test
                    tried[key] = {"error": type(exc).__name__, "message": str(exc)}

    model = tnt.Model(build())
    compile_(model)
    history = model.fit(datasets()[0], epochs=2, verbose=0,
                        callbacks=[tnt.keras.callbacks.Callback(Collectives(), run_on_all_ranks=False)])
    return {"tried": tried, "epochs": len(history.history["loss"])}


def check_rank_branches(tnt):
    """A branch on the rank in the script: evaluate on the master only, a layer
    frozen on one rank, a recompile on the master only, a loss chosen per rank.
    Each made the ranks request what the others never did (the call's own
    checks, the broadcast of the weights after compile, gradients named after
    other shapes, a global normaliser), and they waited for each other until
    TNT_TIMEOUT_S. Every rank must raise the same MismatchError when the call
    begins; the same changes made on every rank must train."""
    rank = tnt.get_rank()
    ds = datasets()[0]

    def evaluate_on_master(m):
        if rank == 0:
            m.evaluate(ds, verbose=0)
        m.fit(ds, epochs=1, verbose=0)

    def frozen(on_ranks):
        def run(m):
            if rank in on_ranks:
                m.layers[0].trainable = False
            compile_(m)
            m.fit(ds, epochs=1, verbose=0)
        return run

    def compiled_on_master(m):
        m.fit(ds, epochs=1, verbose=0)
        if rank == 0:
            compile_(m, lr=0.01)
        m.fit(ds, epochs=1, verbose=0)

    def steps_per_execution_per_rank(m):
        m.compile(optimizer="sgd", loss="mse", steps_per_execution=1 + rank)
        m.fit(ds.map(lambda x, y: (x, tf.one_hot(y, 3))), epochs=1, verbose=0)

    def loss_per_rank(m):
        m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum" if rank else "sum_over_batch_size"))
        m.fit(ds, epochs=1, verbose=0)

    # the *_on_batch calls compare the same on their first call of each kind after compile
    # (they waited until TNT_TIMEOUT_S too); alternated and recompiled alike, they train
    x, y = data()

    def on_batch_loss_per_rank(m):
        m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum" if rank else "sum_over_batch_size"))
        m.train_on_batch(x[:B], y[:B])

    def test_on_batch_on_master(m):
        if rank == 0:
            m.test_on_batch(x[:B], y[:B])
        m.train_on_batch(x[:B], y[:B])

    def on_batch_frozen_on_one_rank(m):
        m.train_on_batch(x[:B], y[:B])
        if rank == 1:
            m.layers[0].trainable = False
        compile_(m)
        m.train_on_batch(x[:B], y[:B])

    # each rank trains on its slice of its own copy of the batch: ranks that passed their own
    # data mixed their samples without a word
    def on_batch_own_data(m):
        m.train_on_batch(x[:B] + rank, y[:B])

    def predict_on_batch_own_size(m):
        m.predict_on_batch(x[:B + rank])

    def on_batch_own_sparse_data(m):  # 1600 values, one apart: its repr elided it ("...")
        dense = np.ones((200, 8), "float32")
        dense[100, 4] += rank
        m.train_on_batch(tf.sparse.from_dense(dense), np.zeros(200, "int32"))

    def on_batch_alike(m):
        for _ in range(2):
            m.train_on_batch(x[:B], y[:B])
            m.test_on_batch(x[B:2 * B], y[B:2 * B])
            m.predict_on_batch(x[:B])
        compile_(m, lr=0.01)
        m.train_on_batch(x[:B], y[:B])
        m.fit(ds, epochs=1, verbose=0)
        m.train_on_batch(x[:B], y[:B])

    # between *_on_batch calls that agreed (they compared only their first call of each kind
    # after compile): another model of the same shapes and compile on one rank (the two models'
    # gradients were averaged without a word), a learning rate set on one rank (its weights
    # apart without a word), a compile on the master only (a wait until TNT_TIMEOUT_S)
    def on_batch_other_model(m):
        other = tnt.Model(build())
        compile_(other)
        m.train_on_batch(x[:B], y[:B])
        other.train_on_batch(x[:B], y[:B])
        (m if rank == 0 else other).train_on_batch(x[:B], y[:B])

    def on_batch_rate_on_one_rank(m):
        m.train_on_batch(x[:B], y[:B])
        if rank == 1:
            m.optimizer.learning_rate.assign(0.01)
        m.train_on_batch(x[:B], y[:B])

    def on_batch_compiled_on_master(m):
        m.train_on_batch(x[:B], y[:B])
        m.test_on_batch(x[:B], y[:B])
        if rank == 0:
            compile_(m, lr=0.01)
        m.test_on_batch(x[:B], y[:B])

    # tnt.Model calls in two threads at once: their requests are named after the call ("a
    # collective named 'tnt.call' is already in flight", or a wait until TNT_TIMEOUT_S); the
    # thread "held" is in fit (its callback waits) while the main thread calls fit
    def threads_at_once(m):
        other = tnt.Model(build())
        compile_(other)
        inside, done = threading.Event(), threading.Event()

        class Hold(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                inside.set()
                done.wait(120)

        held = threading.Thread(target=lambda: m.fit(ds, epochs=1, verbose=0, callbacks=[Hold()]),
                                name="held")
        held.start()
        inside.wait(120)
        try:
            other.fit(ds, epochs=1, verbose=0)
        finally:
            done.set()
            held.join()

    # each rank's call in a thread of its own name: the first calls of two models agreed and
    # their requests, named after the thread, waited for each other until the stall warning
    def thread_per_rank(m):
        failed = []

        def train():
            try:
                m.fit(ds, epochs=1, verbose=0)
            except Exception as exc:  # noqa: BLE001 - raised below, in the main thread
                failed.append(exc)

        thread = threading.Thread(target=train, name=f"trainer{rank}")
        thread.start()
        thread.join()
        if failed:
            raise failed[0]

    # another tnt.Model of the same shapes and compile on one rank: the ranks paired up and
    # averaged the two models' gradients without a word; a model made (and compiled) on the
    # master only, for itself, and never used in a collective call, is fine
    def other_model_on_one_rank(m):
        other = tnt.Model(build())
        compile_(other)
        m.fit(ds, epochs=1, verbose=0)
        other.fit(ds, epochs=1, verbose=0)
        (m if rank == 0 else other).fit(ds, epochs=1, verbose=0)

    # a model that makes its weights at its first call, called on the master only to have a
    # look: the others build it from their first batch and take the master's weights (it was
    # refused: "the number of trainable variables (rank 0: 4, rank 1: 0)")
    def built_on_master_only(m):
        plain = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model = tnt.Model(plain)
        compile_(model)
        if rank == 0:
            plain(x[:1])
        model.fit(ds, epochs=1, verbose=0)

    # a model built with other settings on each rank (a rate from a per-rank config, a lookup
    # layer adapted on each rank's own data, whose vocabulary is no weight): the ranks summed
    # the gradients of different computations without a word
    def rate_per_rank(m):
        keras.utils.set_random_seed(3)
        model = tnt.Model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                            keras.layers.Dropout(0.1 + 0.4 * rank),
                                            keras.layers.Dense(3)]))
        compile_(model)
        model.fit(ds, epochs=1, verbose=0)

    def lookup(adapted_on):
        inputs = keras.Input((8,), dtype="int64")
        layer = keras.layers.IntegerLookup()
        layer.adapt(adapted_on)
        h = keras.layers.Flatten()(keras.layers.Embedding(12, 2)(layer(inputs)))
        model = tnt.Model(keras.Model(inputs, keras.layers.Dense(3)(h)))
        compile_(model)
        return model

    tokens = (np.abs(x) * 3).astype("int64") % 10

    def vocabulary_per_rank(m):
        lookup(tokens[:30 * (1 + rank)]).fit(tokens, y, batch_size=B, epochs=1, verbose=0)

    # alike where it counts: names numbered apart (a rank built one more model first), a
    # nested model, per-rank initializer seeds (the master's weights are broadcast)
    def built_alike_named_apart(m):
        if rank == 0:
            keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        keras.utils.set_random_seed(3)
        inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(
            16, kernel_initializer=keras.initializers.GlorotUniform(seed=rank))])
        inputs = keras.Input((8,))
        model = tnt.Model(keras.Model(inputs, keras.layers.Dense(3)(inner(inputs))))
        compile_(model)
        model.fit(ds, epochs=1, verbose=0)
        lookup(tokens).fit(tokens, y, batch_size=B, epochs=1, verbose=0)

    def extra_model_on_master(m):
        if rank == 0:
            compile_(tnt.Model(build()))
        m.fit(ds, epochs=1, verbose=0)
        m.train_on_batch(x[:B], y[:B])

    return run_cases(tnt, {"evaluate_on_master": evaluate_on_master,
                           "frozen_on_one_rank": frozen((1,)),
                           "compiled_on_master": compiled_on_master,
                           "loss_per_rank": loss_per_rank,
                           "steps_per_execution_per_rank": steps_per_execution_per_rank,
                           "frozen_everywhere": frozen((0, 1)),
                           "on_batch_loss_per_rank": on_batch_loss_per_rank,
                           "test_on_batch_on_master": test_on_batch_on_master,
                           "on_batch_frozen_on_one_rank": on_batch_frozen_on_one_rank,
                           "on_batch_own_data": on_batch_own_data,
                           "predict_on_batch_own_size": predict_on_batch_own_size,
                           "on_batch_own_sparse_data": on_batch_own_sparse_data,
                           "on_batch_alike": on_batch_alike,
                           "other_model_on_one_rank": other_model_on_one_rank,
                           "on_batch_other_model": on_batch_other_model,
                           "on_batch_rate_on_one_rank": on_batch_rate_on_one_rank,
                           "on_batch_compiled_on_master": on_batch_compiled_on_master,
                           "threads_at_once": threads_at_once,
                           "thread_per_rank": thread_per_rank,
                           "extra_model_on_master": extra_model_on_master,
                           "built_on_master_only": built_on_master_only,
                           "rate_per_rank": rate_per_rank,
                           "vocabulary_per_rank": vocabulary_per_rank,
                           "built_alike_named_apart": built_alike_named_apart})


class BroadcastFrom(keras.layers.Layer):
    """Adds the root's slice sum to every sample (a tarantella.tensorflow.broadcast in a layer)."""

    def __init__(self, root, name=None, **kwargs):
        super().__init__(**kwargs)
        self.root, self.call_name = root, name

    def call(self, x):
        import tarantella.tensorflow as tnt_tf

        return x + tnt_tf.broadcast(tf.reduce_sum(x, 0, keepdims=True), root=self.root, name=self.call_name)


class BroadcastingStep(keras.Model):
    """A train_step of its own that broadcasts its loss from rank 1."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        import tarantella.tensorflow as tnt_tf

        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": tnt_tf.broadcast(loss, root=1)}


def check_outputs_not_one_row_per_sample(tnt):
    """tnt.Model.predict of a model whose output is a statistic of the batch (shape (3,), not one
    row per sample): serial Keras concatenates 3 values a batch (6 for 2 batches); predict
    gathered every rank's 3 (12 on 2 ranks), without a word. Every rank must raise the error
    that says so, traced and with rank 1 run eagerly."""
    out = {}
    for how, eager in (("traced", False), ("eager_on_1", tnt.get_rank() == 1)):
        inp = keras.Input((3,))
        m = tnt.Model(keras.Model(inp, keras.layers.Lambda(lambda t: keras.ops.mean(t, axis=0))(inp)))
        m.compile(run_eagerly=eager)
        try:
            got = m.predict(np.arange(24, dtype="float32").reshape(8, 3), batch_size=4, verbose=0)
            out[how] = {"error": None, "shape": list(got.shape)}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[how] = {"error": type(exc).__name__, "message": str(exc)[-2000:]}
    return out


class MeanOfRankMeans(keras.layers.Layer):
    """x minus the mean of the per-rank means of x (gathered as scalars, one row per rank)."""

    def call(self, x):
        import tarantella.tensorflow as tnt_tf

        gathered = tnt_tf.allgather({"m": keras.ops.mean(x), "k": 1.0}, name="rank_means")
        return x - keras.ops.mean(gathered["m"])


def check_scalar_gather_on_an_empty_slice(tnt):
    """A layer that allgathers a scalar per rank (its slice's mean) and centres on their mean, in
    evaluate and predict on 9 samples in batches of 4 (rank 1's slice of the last batch is empty):
    the empty rank sent a zero row (the replay of fit / evaluate, predict's stand-in), and the last
    batch was centred on half its mean, without a word. Evaluate's loss and predict's outputs
    against serial Keras' (each batch centred on its mean), traced and with rank 1 run eagerly."""
    x = np.random.RandomState(0).rand(9, 3).astype(np.float32)
    centred = [b - b.mean() for b in (x[0:4], x[4:8], x[8:9])]
    out = {"serial_loss": float(sum((c ** 2).mean() * len(c) for c in centred) / 9),
           "serial_predict": np.concatenate(centred).tolist()}
    for how, eager in (("traced", False), ("eager_on_1", tnt.get_rank() == 1)):
        inp = keras.Input((3,))
        m = tnt.Model(keras.Model(inp, MeanOfRankMeans()(inp)))
        m.compile(loss="mse", run_eagerly=eager)
        out[how] = {"loss": float(m.evaluate(x, np.zeros_like(x), batch_size=4, verbose=0)),
                    "predict": m.predict(x, batch_size=4, verbose=0).tolist()}
    return out


def check_broadcast_from_an_empty_slice(tnt):
    """A tarantella.tensorflow.broadcast from rank 1 in a step where rank 1's slice of the batch is
    empty (41 samples in batches of 20: the last one has 1): in a layer, in predict (rank 1 runs
    the model on a stand-in sample), fit (rank 1 run eagerly, rank 0 traced) and evaluate (named);
    in a train_step of its own. The empty rank has nothing to send: before, it alone failed, and
    the other rank waited in the broadcast until TNT_TIMEOUT_S (a TimeoutError naming no cause).
    Every rank must raise the InvalidUsageError saying so, at once; then a broadcast from rank 0,
    which always gets a sample, works."""
    x, y = data(41, seed=7)
    rank = tnt.get_rank()

    def model(root=1, name=None, eager_rank=None):
        keras.utils.set_random_seed(5)
        m = tnt.Model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(3), BroadcastFrom(root, name)]))
        compile_(m)
        if eager_rank is not None:
            m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      run_eagerly=rank == eager_rank)
        return m

    def predict(m):
        m.predict(x, batch_size=B, verbose=0)

    def fit(m):
        m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)

    def evaluate(m):
        m.evaluate(x, y, batch_size=B, verbose=0)

    own = tnt.Model(BroadcastingStep())
    own.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cases = {"layer_predict": (model(), predict),
             "layer_predict_eager_on_1": (model(eager_rank=1), predict),
             "layer_fit_eager_on_1": (model(eager_rank=1), fit),
             "layer_evaluate_named": (model(name="from_rank_1"), evaluate),
             "own_train_step": (own, fit)}
    out = {}
    for key, (m, run) in cases.items():
        start = time.monotonic()
        try:
            run(m)
            out[key] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
        out[key]["seconds"] = time.monotonic() - start
    # the failed calls left nothing behind: the next one works (each case's calls too)
    m = model(root=0)
    out["from_rank_0"] = {"predicted": m.predict(x, batch_size=B, verbose=0).tolist(),
                          "dense": np.asarray(m.layers[0](x)).tolist()}
    return out


def check_noise_off_the_batch_axis(tnt):
    """A Dropout after a transpose to time-major: its input's first dimension
    (6 steps) is not the batch (4 samples a rank). Rows cut from the global
    batch's noise along it ran past the end on rank 1 only (a shape error
    there, rank 0 waiting for it); such a layer draws per rank instead."""
    inputs = keras.Input((6, 3))
    h = keras.layers.Lambda(lambda t: keras.ops.transpose(t, (1, 0, 2)))(inputs)  # (6, batch, 3)
    h = keras.layers.Dropout(0.3, seed=1)(h)
    h = keras.layers.Lambda(lambda t: keras.ops.transpose(t, (1, 0, 2)))(h)
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(h))
    model = tnt.Model(keras.Model(inputs, outputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 6, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0)
        return {"error": None, "kernel": float(np.sum(model.get_weights()[0]))}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        return {"error": type(exc).__name__, "message": str(exc)[:300]}


def check_tf_checkpoints_on_every_rank(tnt, files):
    """A custom loop's tf.train.Checkpoint.save and CheckpointManager.save
    (max_to_keep=2) called on every rank, into one folder, as a serial script
    does: the ranks wrote the same files at once, and one rank's merge failed
    ("MergeV2Checkpoints ... did not exist"), ending the job. Every checkpoint
    is now whole, and every rank restores the last one."""
    folder = os.path.join(files, "tf_checkpoints")
    seeded = lambda: keras.Sequential([keras.Input((64,))] + [  # noqa: E731 - alike on every rank
        keras.layers.Dense(1500, kernel_initializer=keras.initializers.GlorotUniform(seed=i)) for i in (1, 2)])
    model = seeded()
    optimizer = tnt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(folder, "managed"), max_to_keep=2)
    saved = []
    for _ in range(3):  # each save begun together on the ranks, as in a loop's lockstep
        tnt.barrier()
        saved.append(os.path.relpath(manager.save(), folder))
        tnt.barrier()
        saved.append(os.path.relpath(checkpoint.save(os.path.join(folder, "plain", "ckpt")), folder))
    tnt.barrier()
    restored = seeded()
    for variable in restored.weights:
        variable.assign(tf.zeros_like(variable))
    again = tf.train.Checkpoint(model=restored)
    again.restore(manager.latest_checkpoint).expect_partial()
    equal = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.weights, restored.weights))
    return {"saved": saved, "latest": os.path.relpath(tf.train.latest_checkpoint(os.path.join(folder, "plain")), folder),
            "managed": sorted(os.listdir(os.path.join(folder, "managed"))), "restored_equal": equal}


def check_master_only_checkpoints(tnt, files):
    """A ModelCheckpoint passed to fit on the master only (Horovod's `if
    hvd.rank() == 0: callbacks.append(...)`): its save waited for the other
    ranks until TNT_TIMEOUT_S. fit refuses it on every rank before the first
    step; wrapped to run on the master only, or the same History on the
    master only (the original Tarantella's documented example), it runs."""
    master = tnt.is_master_rank()
    path = os.path.join(files, "master_only_{epoch}.keras")

    def stop(**kwargs):  # stops after the first epoch
        return keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=100, **kwargs)

    cases = {
        "guarded": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(path)] if master else []),
        "wrapped": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            tnt.keras.callbacks.Callback(keras.callbacks.ModelCheckpoint(path),
                                         run_on_all_ranks=False)] if master else []),
        "history": lambda m: m.fit(datasets()[0], epochs=1, verbose=0,
                                   callbacks=[keras.callbacks.History()] if master else []),
        # its restore is set_weights, collective: the master waited there for the others
        "restoring_stop": lambda m: m.fit(datasets()[0], epochs=3, verbose=0, callbacks=[
            stop(restore_best_weights=True)] if master else []),
        "restoring_stop_everywhere": lambda m: m.fit(datasets()[0], epochs=3, verbose=0,
                                                     callbacks=[stop(restore_best_weights=True)]),
        "stop_on_master": lambda m: m.fit(datasets()[0], epochs=3, verbose=0,
                                          callbacks=[stop()] if master else []),
        # the ranks applied the summed gradients at different rates: seen after the epoch
        "rate_on_master": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 2)] if master else []),
        # the master decides whether and where to resume, every rank loads from its folder
        "backup_on_master": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(os.path.join(files, "bar"))] if master else []),
        "backup_per_rank": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(os.path.join(files, f"bar{tnt.get_rank()}"))]),
        # damaged, without a previous backup: Keras' OSError on the master, an error on the others
        "backup_unreadable": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(_damaged_backup(files, master))]),
        # its removal at the end of fit meets the ranks: rank 1 had left fit (rank 0 failed
        # with a MismatchError against rank 1's next call, which named neither the callback
        # nor delete_checkpoint)
        "backup_delete_on_master": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(os.path.join(files, "bar_del"),
                                             delete_checkpoint=master)]),
        "backup_on_master_wrapped": lambda m: tnt.keras.callbacks.Callback(
            keras.callbacks.BackupAndRestore(os.path.join(files, "bar")), run_on_all_ranks=False),
        # on every rank, deciding apart when to save: one rank saved while the other went on
        # to its next step, and both waited until TNT_TIMEOUT_S
        "checkpoint_save_freq_per_rank": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(path, save_freq=2 if master else 3)]),
        "checkpoint_mode_per_rank": lambda m: m.fit(datasets()[0], epochs=2, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=True,
                                            mode="min" if master else "max")]),
        # the file name may differ (the master's is written)
        "checkpoint_name_per_rank": lambda m: m.fit(datasets()[0], epochs=1, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(os.path.join(files, f"named_{tnt.get_rank()}.keras"))]),
    }
    return run_cases(tnt, cases)


def _damaged_backup(files, master):
    """A BackupAndRestore folder whose latest weights are half a file (written on the master)."""
    folder = os.path.join(files, "bar_damaged")
    if master:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "latest.weights.h5"), "wb") as f:
            f.write(b"half a file")
    return folder


def check_rank_only_saves(tnt, files):
    """Saves and loads that some ranks only make: Horovod's `if hvd.rank() ==
    0: model.save(path)`, a load on the master only, a write or a read that
    fails on one rank (a missing directory, a file the other rank cannot
    see). The master waited in the save's barrier, or the ranks in the load's
    broadcast, until TNT_TIMEOUT_S; each now fails every rank at once (the
    other ranks' next call, or the failure, is met in the call agreement)."""
    rank = tnt.get_rank()
    ds = datasets()[0]
    path = os.path.join(files, "rank_only.keras")
    wpath = os.path.join(files, "rank_only.weights.h5")
    missing = os.path.join(files, "no_such_dir", "m.keras")

    def on_master(call):
        def run(m):
            m.save(path)
            m.save_weights(wpath)
            if rank == 0:
                call(m)
            m.fit(ds, epochs=1, verbose=0)
        return run

    def late_on_rank_1(call):
        def run(m):
            if rank == 1:
                time.sleep(2)  # after the master's write (none of the results depends on it)
            call(m)
        return run

    return run_cases(tnt, {
        "save_on_master": on_master(lambda m: m.save(os.path.join(files, "on_master.keras"))),
        "save_weights_on_master": on_master(lambda m: m.save_weights(wpath)),
        "load_weights_on_master": on_master(lambda m: m.load_weights(wpath)),
        "load_model_on_master": on_master(lambda m: tnt.models.load_model(path)),
        "set_weights_on_master": on_master(lambda m: m.set_weights(m.get_weights())),
        "tf_saved_model_save_on_master": on_master(
            lambda m: tf.saved_model.save(m, os.path.join(files, "on_master_saved"))),
        "save_to_a_missing_directory": lambda m: m.save(missing),
        "save_model_to_a_missing_directory": lambda m: tnt.models.save_model(m.model, missing),
        "load_weights_missing_on_rank_1": lambda m: m.load_weights(
            wpath if rank == 0 else os.path.join(files, "none.weights.h5")),
        "load_model_missing_on_rank_1": lambda m: tnt.models.load_model(
            path if rank == 0 else os.path.join(files, "none.keras")),
        "set_weights_of_other_shapes_on_rank_1": lambda m: m.set_weights(
            m.get_weights() if rank == 0 else m.get_weights()[:1]),
        # overwrite=False of a new file, rank 1 coming to the save after the master wrote it:
        # rank 1 found the file and raised a FileExistsError alone (the master waited for it)
        "save_new_file_without_overwrite_late_rank_1": late_on_rank_1(
            lambda m: m.save(os.path.join(files, "late.keras"), overwrite=False)),
        "save_weights_new_file_without_overwrite_late_rank_1": late_on_rank_1(
            lambda m: m.save_weights(os.path.join(files, "late.weights.h5"), overwrite=False)),
        "save_model_new_file_without_overwrite_late_rank_1": late_on_rank_1(
            lambda m: tnt.models.save_model(m.model, os.path.join(files, "late_plain.keras"),
                                            overwrite=False)),
        "save_existing_file_without_overwrite": lambda m: m.save(
            os.path.join(files, "late.keras"), overwrite=False),
        "fit_after": lambda m: m.fit(ds, epochs=1, verbose=0),
    })


def check_stateful_rnn(tnt):
    """A stateful LSTM (one state per sample of a fixed batch of 20): each rank's
    slice of 10 clashed with its 20 states in a TensorFlow error about
    incompatible shapes ("[10,1] vs. [20,1]"; with slices of one sample they
    broadcast, silently). Every distributed call now refuses it alike, naming
    the layer; each rank's own data (tnt_distribute_dataset=False) with a
    batch_shape of its part's size still trains."""
    def stateful(batch):
        keras.utils.set_random_seed(3)
        inputs = keras.Input(batch_shape=(batch, 4, 2))
        model = tnt.Model(keras.Model(inputs, keras.layers.Dense(1)(
            keras.layers.LSTM(4, stateful=True, name="stateful_lstm")(inputs))))
        model.compile(optimizer="sgd", loss="mse")
        return model

    x = np.random.default_rng(0).normal(size=(2 * B, 4, 2)).astype("float32")
    y = x[:, 0, :1]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    cases = {
        "fit": lambda m: m.fit(ds, epochs=1, verbose=0),
        "fit_arrays": lambda m: m.fit(x, y, batch_size=B, shuffle=False, verbose=0),
        "evaluate": lambda m: m.evaluate(ds, verbose=0),
        "predict": lambda m: m.predict(x, batch_size=B, verbose=0),
        "train_on_batch": lambda m: m.train_on_batch(x[:B], y[:B]),
        "predict_on_batch": lambda m: m.predict_on_batch(x[:B]),
    }
    out = {}
    for key, run in cases.items():
        try:
            run(stateful(B))
            out[key] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
    half = B // tnt.get_size()
    mine = slice(tnt.get_rank() * half, (tnt.get_rank() + 1) * half)
    try:
        stateful(half).fit(x[mine], y[mine], batch_size=half, shuffle=False, verbose=0,
                           tnt_distribute_dataset=False)
        out["own_data"] = {"error": None}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        out["own_data"] = {"error": type(exc).__name__, "message": str(exc)}
    return out


def check_same_data(tnt):
    """Datasets that yield different batches on different ranks (each rank
    keeps its slice of its own global batch, so their samples were mixed: some
    trained on twice, some never, without an error), which fit, evaluate and
    predict refuse once the first batch has been used; and pipelines that must
    still run: the same data, and random augmentation drawn per rank."""
    rank = tnt.get_rank()
    x, y = data()
    same = tf.data.Dataset.from_tensor_slices((x, y))
    other = tf.data.Dataset.from_tensor_slices((x + rank, y))  # another file on rank 1

    def unseeded(make):  # build() set a global seed, which gives every shuffle a seed alike
        def run(m):
            tf.random.set_seed(None)
            m.fit(make(), epochs=1, verbose=0)
        return run

    # a shuffle inside an interleave's function (a shard or file each): a stateful function, so
    # the batches are not compared, and each rank shuffled its own way: the ranks' global
    # batches mixed other samples without a word
    def files(seed):
        return tf.data.Dataset.range(2).interleave(
            lambda k: same.shard(2, k).shuffle(N, seed=seed), cycle_length=2).batch(B)
    cases = {
        "shuffle_seed": lambda m: m.fit(same.shuffle(N, seed=rank).batch(B), epochs=2, verbose=0),
        "other_file": lambda m: m.evaluate(other.batch(B), verbose=0),
        "validation": lambda m: m.fit(same.batch(B), validation_data=other.batch(B), epochs=2,
                                      verbose=0),
        "predict": lambda m: m.predict(other.map(lambda a, b: a).batch(B), verbose=0),
        # random augmentation on rank 0 only: not compared there, compared on rank 1; every
        # rank still takes part in the comparison, so both fail alike instead of waiting
        "augmented_on_one_rank": lambda m: m.fit(
            (same.map(lambda a, b: (a + tf.random.uniform([8]), b)) if rank == 0 else same).batch(B),
            epochs=1, verbose=0),
        "shuffle_in_interleave": unseeded(lambda: files(None)),
        "shuffle_before_enumerate": unseeded(lambda: same.shuffle(N).enumerate().map(
            lambda i, e: e).batch(B)),
        # its random choice of the next sample drawn per rank, under random augmentation (so
        # not compared): the ranks' batches mixed other samples without a word
        "sample_from_datasets": unseeded(lambda: tf.data.Dataset.sample_from_datasets(
            [same.shard(2, 0), same.shard(2, 1)]).map(
                lambda a, b: (a + tf.random.uniform([8]), b)).batch(B)),
        # must run
        "shuffle_in_interleave_seeded": unseeded(lambda: files(1)),
        "sample_from_datasets_seeded": unseeded(lambda: tf.data.Dataset.sample_from_datasets(
            [same.shard(2, 0), same.shard(2, 1)], seed=1).batch(B)),
        "same": lambda m: m.fit(same.shuffle(N).batch(B), validation_data=same.batch(B), epochs=2,
                                verbose=0),
        "augmented": lambda m: m.fit(same.map(lambda a, b: (a + tf.random.uniform([8]), b)).batch(B),
                                     epochs=1, verbose=0),
    }

    def per_rank_global_seed(m):  # e.g. to draw other dropout per rank
        tf.random.set_seed(100 + rank)  # a shuffle() without seed= takes its seed from it
        try:
            m.fit(same.shuffle(N).batch(B), epochs=1, verbose=0)
        finally:
            tf.random.set_seed(None)
    cases["per_rank_global_seed"] = per_rank_global_seed  # last: it leaves no global seed
    return run_cases(tnt, cases)


def check_overlap(tnt):
    """A few steps of a 5-layer MLP whose gradients go in several buckets; the
    test reads the core's timeline (TNT_TIMELINE) for the tensors named
    "tnt.overlap.*" and checks that communication began during backprop."""
    keras.utils.set_random_seed(1)
    width, batch, steps = 1024, 256, 8
    model = tnt.Model(keras.Sequential(
        [keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(4)]
        + [keras.layers.Dense(10)]))
    model.compile(optimizer=tnt.DistributedOptimizer(keras.optimizers.SGD(0.01), name="tnt.overlap"),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, width)).astype("float32")
    y = rng.integers(0, 10, batch * steps).astype("int32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=1, verbose=0)
    return {"steps": steps}


def check_unseeded_shuffle(tnt):
    """fit(x, y, shuffle=True) without a global seed, twice: the samples each
    rank trains on, per step (x is the sample's index)."""
    tf.random.set_seed(None)
    seen = []

    def record(t):
        seen.append(t.numpy()[:, 0].astype(int).tolist())
        return t

    class Record(keras.layers.Layer):
        def call(self, t):
            out = tf.py_function(record, [t], tf.float32)
            out.set_shape(t.shape)
            return out

    keras.utils.set_random_seed(3)
    tf.random.set_seed(None)  # set_random_seed set one
    inputs = keras.Input((1,))
    model = tnt.Model(keras.Model(inputs, keras.layers.Dense(1)(Record()(inputs))))
    model.compile(optimizer="sgd", loss="mse")
    x = np.arange(30, dtype="float32")[:, None]
    runs = []
    for _ in range(2):
        seen.clear()
        model.fit(x, np.zeros_like(x), batch_size=7, epochs=2, shuffle=True, verbose=0)
        runs.append(list(seen))
    return runs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--callback-failure", action="store_true")
    parser.add_argument("--slow-master", action="store_true")
    parser.add_argument("--slow-teardown", action="store_true")
    args = parser.parse_args()
    tnt = None
    rank = 0
    if not args.reference:
        import tarantella as tnt

        rank = tnt.get_rank()
    os.makedirs(args.out, exist_ok=True)
    if args.callback_failure:
        return check_callback_failure(tnt, args.out)
    if args.slow_master or args.slow_teardown:  # one launch may do both (test_features.py)
        if args.slow_teardown:
            check_slow_teardown(tnt, args.out)
        if args.slow_master:
            check_slow_master(tnt, args.out)
        return None
    files = os.path.join(args.out, "files")
    os.makedirs(files, exist_ok=True)
    stdout = open(os.path.join(args.out, f"stdout{rank}.txt"), "w")
    real_stdout, sys.stdout = sys.stdout, stdout
    results = {"callbacks": check_callbacks(tnt, files, args.reference)}
    sys.stdout = real_stdout
    results["loop_optimizer"] = custom_loop(tnt, args.reference, tape_mode=False)
    results["loop_tape"] = custom_loop(tnt, args.reference, tape_mode=True)
    results["own_compile"] = own_compile(tnt, args.reference)
    for how in ("loop", "compile", "tnt_model"):
        results[f"loss_scale_{how}"] = loss_scale_around_a_distributed_optimizer(tnt, args.reference, how)
    results["array_fits"] = array_fits(tnt, args.reference)
    results["empty_slices"] = empty_slices(tnt, args.reference)
    results["list_arrays"] = list_arrays(tnt, args.reference)
    results["arrays_without_targets"] = arrays_without_targets(tnt, args.reference)
    results["wrapped_twice"] = wrapped_twice(tnt, args.reference)
    results["array_steps"] = array_steps(tnt, args.reference)
    results["validation_iterables"] = validation_iterables(tnt, args.reference)
    results["validation_arrays_beside_a_dataset"] = validation_arrays_beside_a_dataset(
        tnt, args.reference)
    results["float64_arrays"] = float64_arrays(tnt, args.reference)
    results["own_shards_validation_split"] = own_shards_validation_split(tnt, args.reference)
    results["ragged_inputs"] = ragged_inputs(tnt, args.reference)
    results["string_arrays"] = string_arrays(tnt, args.reference)
    results["class_weight_arrays"] = class_weight_arrays(tnt, args.reference)
    results["predict_output_dtypes"] = predict_output_dtypes(tnt, args.reference)
    results["pandas_and_sparse_arrays"] = pandas_and_sparse_arrays(tnt, args.reference)
    results["array_logs"] = array_logs(tnt, args.reference)
    results["metric_aggregations"] = metric_aggregations(tnt, args.reference)
    results["adapted_normalization"] = adapted_normalization(tnt, args.reference)
    results["transfer_learning"] = transfer_learning(tnt, args.reference)
    results["epoch_loop"] = epoch_loop(tnt, args.reference)
    results["backup_and_restore"] = backup_and_restore(tnt, files, args.reference)
    results["py_datasets"] = py_datasets(tnt, args.reference)
    results["monte_carlo_dropout"] = monte_carlo_dropout(tnt, args.reference)
    if not args.reference:
        results["save_load"] = check_save_load(tnt, files)
        results["misc"] = check_misc(tnt, files)
        results["stale_file_loads"] = check_stale_file_loads(tnt, files)
        results["overlap"] = check_overlap(tnt)
        results["replicas"] = check_replicas_diverging(tnt)
        results["stops"] = check_stops(tnt)
        results["rank_state"] = check_rank_state(tnt)
        results["step_counts"] = check_step_counts(tnt)
        results["unnamed_tf_collectives"] = check_unnamed_tf_collectives(tnt)
        results["threads_training_named"] = check_threads_training(tnt, named=True)
        results["threads_training_unnamed"] = check_threads_training(tnt, named=False)
        results["same_data"] = check_same_data(tnt)
        results["master_only_checkpoints"] = check_master_only_checkpoints(tnt, files)
        results["tf_checkpoints"] = check_tf_checkpoints_on_every_rank(tnt, files)
        results["master_only_collectives"] = check_master_only_collectives(tnt)
        results["rank_only_saves"] = check_rank_only_saves(tnt, files)
        results["stateful_rnn"] = check_stateful_rnn(tnt)
        results["rank_branches"] = check_rank_branches(tnt)
        results["noise_off_the_batch_axis"] = check_noise_off_the_batch_axis(tnt)
        results["broadcast_from_an_empty_slice"] = check_broadcast_from_an_empty_slice(tnt)
        results["outputs_not_one_row_per_sample"] = check_outputs_not_one_row_per_sample(tnt)
        results["scalar_gather_on_an_empty_slice"] = check_scalar_gather_on_an_empty_slice(tnt)
        results["unseeded_shuffle"] = check_unseeded_shuffle(tnt)
        from tarantella.tensorflow.keras.callbacks.callback_preparation import prepare_callbacks

        tb = prepare_callbacks([keras.callbacks.TensorBoard(os.path.join(files, "tb"))])[0]
        results["tensorboard"] = [tb.run_on_all_ranks, os.path.relpath(tb.log_dir, files)]
        # TNT_TENSORBOARD_ON_ALL_DEVICES: every rank's own metrics (the original's "local
        # information on all devices"), each rank in its folder; they were the global ones
        os.environ["TNT_TENSORBOARD_ON_ALL_DEVICES"] = "true"
        try:
            tb = prepare_callbacks([keras.callbacks.TensorBoard(os.path.join(files, "tb_env"))])[0]
            results["tensorboard_env"] = [tb.run_on_all_ranks, tb.aggregate_logs,
                                          os.path.relpath(tb.log_dir, files)]
        finally:
            del os.environ["TNT_TENSORBOARD_ON_ALL_DEVICES"]
        # wrapped by the user to run on every rank (the original Tarantella's way to ask for
        # every rank's events): each rank in its own log_dir/rank_<r>, never one shared folder
        wrap = tnt.keras.callbacks.Callback
        results["tensorboard_wrapped"] = [  # prepared twice: passed to two fit calls
            os.path.relpath(prepare_callbacks(prepare_callbacks([cb]))[0].log_dir, files) for cb in (
                wrap(keras.callbacks.TensorBoard(os.path.join(files, "tb_all")), run_on_all_ranks=True),
                wrap(keras.callbacks.TensorBoard(os.path.join(files, "tb_unset"))),
                wrap(keras.callbacks.TensorBoard(os.path.join(files, "tb_one")), run_on_all_ranks=False))]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
