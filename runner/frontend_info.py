"""Whether the TensorFlow frontend's compiled ops can be used here, and GPUs
(`tntrun --version`, `python -m tarantella.runner.frontend_info`).

The runner never imports TensorFlow: a child Python asks
tarantella.tensorflow.ops.status() (which builds nothing) and lists the GPUs
TensorFlow sees, so the answer is the one a rank started now would get.
"""
import importlib.util
import json
import subprocess
import sys

_PROBE = """
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
from tarantella.tensorflow import ops
ok, why = ops.status()
print("TNT_INFO " + json.dumps({"tf": tf.__version__, "ops": [ok, why],
                                "gpus": len(tf.config.list_physical_devices("GPU")),
                                "cuda": bool(tf.test.is_built_with_cuda())}))
"""


def probe(python=None, timeout=120):
    """The child's answer as a dict, or {"error": why}."""
    if importlib.util.find_spec("tensorflow") is None:
        return {"error": "TensorFlow is not installed (pip install tensorflow)"}
    try:
        out = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True,
                             timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"asking TensorFlow failed: {exc}"}
    for line in out.stdout.splitlines():
        if line.startswith("TNT_INFO "):
            return json.loads(line[len("TNT_INFO "):])
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"importing TensorFlow failed: {tail}"}


def describe(answer=None):
    answer = probe() if answer is None else answer
    lines = ["TensorFlow frontend (TNT_TF_OPS):"]
    if "error" in answer:
        lines.append(f"  compiled ops  not available: {answer['error']}")
        return "\n".join(lines)
    ok, why = answer["ops"]
    lines.append(f"  TensorFlow    {answer['tf']}")
    lines.append(f"  compiled ops  {'available' if ok else 'not available (tf.numpy_function is used)'}: {why}")
    gpus = answer["gpus"]
    lines.append(
        f"  GPUs          {gpus} visible to TensorFlow" + (
            "; the ops have CPU kernels only: TensorFlow copies GPU gradients to the host and back "
            "(no CUDA kernel, no NCCL yet)" if gpus else
            "" if answer["cuda"] else " (this TensorFlow is built without CUDA)"))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
