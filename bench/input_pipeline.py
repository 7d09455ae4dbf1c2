"""Input cost per rank: slicing each global batch after the per-sample maps
(every rank maps the whole global batch) against slicing before them (each
rank maps only its own samples; tarantella.tensorflow.data.slice_before_map).

    python bench/input_pipeline.py                 # N = 2 and 4, a few epochs each
    python bench/input_pipeline.py --ranks 2 --epochs 5

The pipeline is `from_tensor_slices(images) -> map(augment) -> batch(B)` with
an expensive per-sample map (resize to 64x64, a few convolutions by matrix
products, normalization). Each variant iterates rank 0's dataset of N ranks in
this process (the input work of one rank does not depend on the other ranks),
timed over whole epochs; the median epoch is printed, with serial (N=1) for
reference and a check that both variants give the same tensors.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tarantella.tensorflow.data.distribute_dataset import distribute_dataset  # noqa: E402


def augment(image, label):
    x = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (64, 64))
    w = tf.eye(64) * 0.5 + 0.01
    for _ in range(4):  # stand-in for decoding / augmentation work
        x = tf.nn.relu(tf.einsum("hwc,wv->hvc", x, w) + 0.1)
    x = (x - tf.reduce_mean(x)) / (tf.math.reduce_std(x) + 1e-6)
    return x, label


def dataset(n, batch):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, size=(n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int32)
    return (tf.data.Dataset.from_tensor_slices((images, labels))
            .map(augment, num_parallel_calls=tf.data.AUTOTUNE).batch(batch))


def epoch_seconds(ds, epochs):
    times = []
    for _ in range(epochs + 1):  # the first epoch warms up (tracing, threads)
        t = time.perf_counter()
        for _ in ds:
            pass
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    ds = dataset(args.samples, args.batch)
    serial = epoch_seconds(ds, args.epochs)
    print(f"serial (1 rank): {serial * 1e3:8.1f} ms per epoch ({args.samples} samples, "
          f"global batch {args.batch})")
    for size in map(int, args.ranks.split(",")):
        late = distribute_dataset(ds, rank=0, size=size, slice_early=False).dataset
        early = distribute_dataset(ds, rank=0, size=size, slice_early=True).dataset
        same = all(np.array_equal(a, b) for ea, eb in zip(late, early)
                   for a, b in zip(ea, eb)) and len(list(late)) == len(list(early))
        t_late, t_early = epoch_seconds(late, args.epochs), epoch_seconds(early, args.epochs)
        print(f"{size} ranks, rank 0: slice after the map {t_late * 1e3:8.1f} ms, before the map "
              f"{t_early * 1e3:8.1f} ms per epoch: {t_late / t_early:.2f}x less input work "
              f"(ideal {size}x); same tensors: {same}")


if __name__ == "__main__":
    main()
