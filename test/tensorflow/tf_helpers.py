"""Helpers of the TensorFlow frontend tests: run a script on N real ranks
through `tntrun`, or serially with plain `python`, with a clean environment."""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_serial(script, *args, env=None, timeout=300):
    """`python script args` (no launcher: rank 0 of 1)."""
    result = subprocess.run([sys.executable, os.path.join(HERE, script), *map(str, args)],
                            env=clean_env(**(env or {})), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


_serial_runs = {}


def serial_reference(tmp_path_factory, script="scenarios.py"):
    """The folder of `python script --out DIR --reference`, run once per test session:
    test_serial_equivalence.py and test/multihost/test_keras_multihost.py compare against the
    same serial Keras run (about 30 s of CPU each time it is made)."""
    if script not in _serial_runs:
        out = tmp_path_factory.mktemp("reference")
        run_serial(script, "--out", out, "--reference")
        _serial_runs[script] = str(out)
    return _serial_runs[script]


def run_ranks(n, script, *args, env=None, timeout=400, runner_args=(), check=True):
    """`tntrun -n N -- script args`; the CompletedProcess."""
    exe = shutil.which("tntrun")
    assert exe, "tntrun is not installed: pip install -e . --no-build-isolation"
    cmd = [exe, "-n", str(n), "--no-gpu", *runner_args, "--", sys.executable,
           os.path.join(HERE, script), *map(str, args)]
    result = subprocess.run(cmd, env=clean_env(**(env or {})), capture_output=True, text=True,
                            timeout=timeout)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def timeline(path, prefix=""):
    """{tensor name: {phase: [(start_us, duration_us, detail) per execution]}}
    from a core trace (TNT_TIMELINE), for the tensors whose name starts with
    `prefix`. `detail` is e.g. "4 tensors, 1234 bytes fused", or None."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    out = {}
    for e in events:
        if e.get("ph") == "X" and rows[e["tid"]].startswith(prefix):
            out.setdefault(rows[e["tid"]], {}).setdefault(e["name"], []).append(
                (e["ts"], e["dur"], e.get("args", {}).get("detail")))
    return out
