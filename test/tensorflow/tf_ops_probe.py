"""One rank's view of the compiled TensorFlow ops (test_tf_ops.py): which
library it loaded, and what the ops computed inside a tf.function.
--broken-rank R: rank R builds the ops with a compiler that fails, into the
cache --broken-cache (a host without a working compiler)."""
import argparse
import json
import os

import tensorflow as tf

import tarantella.tensorflow as tnt
from tarantella.tensorflow import ops


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--broken-rank", type=int)
    parser.add_argument("--broken-cache")
    args = parser.parse_args()
    rank, size = tnt.get_rank(), tnt.get_size()
    if rank == args.broken_rank:
        os.environ.update(CXX="false", XDG_CACHE_HOME=args.broken_cache)
    compiled = ops.get()

    # a named call of one tensor runs as the compiled ops (unnamed calls and structures go as
    # the NumPy API's requests, through tf.numpy_function: tensor_collectives._run)
    @tf.function
    def step(x):
        return (tnt.allreduce(x, name="sum"), tnt.broadcast(x, root=size - 1, name="bcast"),
                tnt.allgather(x[:1], name="gather"))

    summed, bcast, gathered = step(tf.fill([3], float(rank + 1)))
    pair = tf.function(lambda x: tnt.allreduce([x[:1], 2 * x[:2]], name="pair"))(tf.fill([3], float(rank + 1)))
    graph = step.get_concrete_function(tf.TensorSpec([3], tf.float32)).graph
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"library": compiled and compiled.path, "summed": summed.numpy().tolist(),
                   "broadcast": bcast.numpy().tolist(), "gathered": gathered.numpy().tolist(),
                   "pair": [p.numpy().tolist() for p in pair],
                   "op_types": sorted({op.type for op in graph.get_operations()})}, f)


if __name__ == "__main__":
    main()
