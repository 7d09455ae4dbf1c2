"""ResNet image classification, data-parallel with Tarantella: the ResNet-50 recipe.

    tntrun -n 2 -- examples/resnet.py --epochs 2 --steps 4     # here: small ResNet, seconds
    python examples/resnet.py --epochs 2 --steps 4              # the same script, serially

The recipe of "Accurate, Large Minibatch SGD" (Goyal et al., 2017), which
trains ResNet-50 on ImageNet in the same number of epochs whatever the number
of processes:

- every rank keeps its batch (--batch-per-rank), so the global batch is that
  times the number of ranks, and the learning rate grows with it:
  0.1 x global batch / 256 (linear scaling);
- the learning rate rises linearly from 0 over the first epochs (warm-up),
  then follows a cosine decay; SGD with momentum 0.9 and weight decay;
- a checkpoint at the end of every epoch (--resume continues from the last);
- TensorBoard logs, when the tensorboard package is installed.

The images are synthetic (every class has its own pattern, plus noise), made
with a fixed seed so that every rank builds the same data set: Tarantella
gives each rank its slice of every global batch. --arch resnet50 trains
keras.applications.ResNet50 (no pretrained weights, nothing downloaded);
the default is a small ResNet of the same bottleneck blocks for CPUs. The
lines that concern Tarantella are marked "# tnt".
"""
import argparse
import glob
import importlib.util
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # tnt  # noqa: E402


def synthetic_images(samples, image_size, classes, seed):
    """A tf.data.Dataset of (image, label): class c is its own smooth random
    pattern plus noise. Images are made on the fly, each from its index alone
    (stateless random ops), so any size fits in memory and Tarantella can
    slice each global batch before the map: a rank makes only its own images."""
    # the classes' patterns are the same in every split; the seed draws labels and noise
    coarse = tf.constant(np.random.default_rng(0).normal(size=(classes, 4, 4, 3)), tf.float32)
    labels = tf.constant(np.random.default_rng(seed).integers(0, classes, size=samples), tf.int32)

    def make(index):
        label = labels[index]
        pattern = tf.image.resize(coarse[label][None], (image_size, image_size))[0]
        noise = tf.random.stateless_normal((image_size, image_size, 3), seed=[seed, index],
                                           stddev=0.8)
        return pattern + noise, label

    # shuffled before the map, so that the map stays next to the batch
    return tf.data.Dataset.range(samples).shuffle(samples, seed=seed).map(make)


def bottleneck(x, filters, stride):
    """ResNet-50's block: 1x1 reduce, 3x3, 1x1 expand (x4), projection shortcut if needed."""
    shortcut = x
    if stride != 1 or x.shape[-1] != 4 * filters:
        shortcut = keras.layers.Conv2D(4 * filters, 1, strides=stride, use_bias=False)(x)
        shortcut = keras.layers.BatchNormalization()(shortcut)
    x = keras.layers.Conv2D(filters, 1, use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.Conv2D(4 * filters, 1, use_bias=False)(x)
    # zero-initialised: each block starts as the identity
    x = keras.layers.BatchNormalization(gamma_initializer="zeros")(x)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, x]))


def small_resnet(image_size, classes, blocks=(1, 1), width=16):
    """ResNet-50's layout (stem, stages of bottleneck blocks, pooling), fewer and narrower."""
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for stage, count in enumerate(blocks):
        for i in range(count):
            x = bottleneck(x, width * 2 ** stage, stride=2 if stage > 0 and i == 0 else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="small_resnet")


def build_model(arch, image_size, classes):
    if arch == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                           classes=classes, classifier_activation=None)
    return small_resnet(image_size, classes)


def last_checkpoint(folder):
    """(path, epoch) of the newest epoch-NNN.keras in folder, or (None, 0)."""
    found = sorted(glob.glob(os.path.join(folder, "epoch-*.keras")))
    if not found:
        return None, 0
    return found[-1], int(re.search(r"epoch-(\d+)", found[-1]).group(1))


class PrintLearningRate(keras.callbacks.Callback):
    """Print the learning rate after every epoch, to see the warm-up."""

    def on_epoch_end(self, epoch, logs=None):
        rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        print(f"epoch {epoch + 1}: learning rate {rate:.4f}, loss {logs['loss']:.4f}, "
              f"accuracy {logs['accuracy']:.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("small", "resnet50"), default="small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-per-rank", type=int, default=32,
                        help="samples per rank and step; global batch = this x ranks")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps (global batches) per epoch")
    parser.add_argument("--warmup-epochs", type=int, default=5,
                        help="learning-rate warm-up (at most epochs - 1)")
    parser.add_argument("--base-learning-rate", type=float, default=0.1,
                        help="the learning rate of a global batch of 256")
    parser.add_argument("--output-dir", default="resnet_run",
                        help="checkpoints/ and tensorboard/ go here")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the last checkpoint in OUTPUT_DIR/checkpoints")
    args = parser.parse_args()

    ranks = tnt.get_size()  # tnt
    global_batch = args.batch_per_rank * ranks
    learning_rate = args.base_learning_rate * global_batch / 256  # linear scaling rule
    total_steps = args.epochs * args.steps
    warmup_steps = min(args.warmup_epochs, args.epochs - 1) * args.steps

    # the same seed on every rank: the same data set, of which each rank trains on its slice
    train = synthetic_images(args.steps * global_batch, args.image_size, args.classes, seed=1) \
        .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    val = synthetic_images(4 * global_batch, args.image_size, args.classes, seed=2) \
        .batch(global_batch)

    checkpoints = os.path.join(args.output_dir, "checkpoints")
    os.makedirs(checkpoints, exist_ok=True)
    resume_from, initial_epoch = last_checkpoint(checkpoints) if args.resume else (None, 0)
    if resume_from:
        # the weights, the optimizer's state and its step count (so the schedule goes on)
        model = tnt.models.load_model(resume_from)  # tnt
        planned = model.optimizer._learning_rate  # the schedule the run began with
        if isinstance(planned, keras.optimizers.schedules.CosineDecay) and \
                planned.warmup_steps + planned.decay_steps != warmup_steps + max(total_steps - warmup_steps, 1):
            # its rate is 0 from its last step on: more epochs would train at rate 0, without a word
            parser.error(f"--resume continues the run of {resume_from}, whose learning-rate schedule "
                         f"ends after {planned.warmup_steps + planned.decay_steps} steps; --epochs "
                         f"{args.epochs} --steps {args.steps} make {total_steps}: resume with the run's "
                         "--epochs, --steps and --warmup-epochs (a longer run starts afresh)")
    else:
        keras.utils.set_random_seed(42)
        schedule = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=0.0, warmup_target=learning_rate, warmup_steps=warmup_steps,
            decay_steps=max(total_steps - warmup_steps, 1))
        model = tnt.Model(build_model(args.arch, args.image_size, args.classes))  # tnt
        model.compile(
            optimizer=keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])

    callbacks = [
        PrintLearningRate(),
        # every rank runs it (its decisions must match); the master rank writes the file
        keras.callbacks.ModelCheckpoint(os.path.join(checkpoints, "epoch-{epoch:03d}.keras")),
    ]
    if importlib.util.find_spec("tensorboard") is None:
        if tnt.is_master_rank():
            print("TensorBoard logs skipped: the tensorboard package is not installed "
                  "(pip install tensorboard)")
    else:  # written by the master rank only (TNT_TENSORBOARD_ON_ALL_DEVICES=true: every rank)
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(args.output_dir, "tensorboard")))

    if tnt.is_master_rank():
        print(f"{args.arch}: {ranks} rank(s), global batch {global_batch}; " + (
            f"resuming from {resume_from} (optimizer and learning-rate schedule included)"
            if resume_from else
            f"learning rate {learning_rate:g} after {warmup_steps} warm-up steps"), flush=True)
    model.fit(train, validation_data=val, epochs=args.epochs, initial_epoch=initial_epoch,
              callbacks=callbacks, verbose=0)
    loss, accuracy = model.evaluate(val, verbose=0)
    if tnt.is_master_rank():
        print(f"validation accuracy: {accuracy:.4f}; checkpoints in {checkpoints}")


if __name__ == "__main__":
    main()
