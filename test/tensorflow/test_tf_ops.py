"""The compiled TensorFlow ops: built at first use into the plugin cache (once,
with several ranks starting together), reused by later processes, and the
fallback to tf.numpy_function when they cannot be built (TNT_TF_OPS).

test_serial_equivalence trains on both paths; this file covers the build."""
import json
import os
import shutil
import stat

import pytest

from tf_helpers import run_ranks, run_serial

tf = pytest.importorskip("tensorflow")

from tarantella.common import errors  # noqa: E402
from tarantella.tensorflow import ops  # noqa: E402
from tarantella.tensorflow.ops import build  # noqa: E402


def _load(out, rank):
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        return json.load(f)


def test_built_once_at_first_use_then_reused(tmp_path):
    cache, calls, cxx = tmp_path / "cache", tmp_path / "calls", tmp_path / "counting-c++"
    real = shutil.which("c++") or shutil.which("g++")
    if real is None:
        pytest.skip("no C++ compiler here")
    cxx.write_text(f'#!/bin/sh\necho x >> {calls}\nexec {real} "$@"\n')
    cxx.chmod(0o755)
    env = {"XDG_CACHE_HOME": cache, "TNT_TF_OPS": "compiled", "CXX": cxx}
    first = tmp_path / "first"
    first.mkdir()
    run_ranks(2, "tf_ops_probe.py", "--out", first, env=env)
    results = [_load(first, r) for r in (0, 1)]
    library = results[0]["library"]
    assert library and library == results[1]["library"] and library.startswith(str(cache))
    folder = os.path.dirname(library)
    assert os.path.basename(folder).startswith(f"tfops-tf{tf.__version__}-cxx11abi")
    assert calls.read_text() == "x\n"  # one compile, though both ranks wanted the library
    for r, result in enumerate(results):
        assert result["summed"] == [3.0] * 3 and result["broadcast"] == [2.0] * 3
        assert result["gathered"] == [1.0, 2.0]
        assert "TntCollectiveStart" in result["op_types"] and "PyFunc" not in result["op_types"], result

    built = os.stat(library)
    second = tmp_path / "second"
    second.mkdir()
    run_serial("tf_ops_probe.py", "--out", second, env=env)
    again = _load(second, 0)
    assert again["library"] == library and again["summed"] == [1.0] * 3
    assert os.stat(library).st_mtime_ns == built.st_mtime_ns and calls.read_text() == "x\n"  # not rebuilt
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_numpy_mode_uses_numpy_function(tmp_path):
    run_serial("tf_ops_probe.py", "--out", tmp_path, env={"TNT_TF_OPS": "numpy"})
    result = _load(tmp_path, 0)
    assert result["library"] is None and "PyFunc" in result["op_types"]
    assert "TntCollectiveStart" not in result["op_types"]


def test_a_lost_peer_fails_the_op_with_its_rank(tmp_path):
    """A TensorFlow error naming the rank, and collective_errors() (fit's)
    raises it as the PeerLostError itself, as on the numpy_function path.
    Rank 2 catches the TensorFlow error itself (a custom training loop) and
    exits 0: nothing converted it, so nothing wrote the job's error at exit
    and tntrun did not count the rank as failed; the core now says so."""
    result = run_ranks(3, "tf_ops_peer_lost.py", env={"TNT_TF_OPS": "compiled", "TNT_TIMEOUT_S": 20},
                       check=False, runner_args=("--output-on-all-devices",), timeout=180)
    said = result.stdout[-2000:] + result.stderr[-4000:]
    caught = [line for line in result.stdout.splitlines() if "CAUGHT" in line]
    assert caught and caught[0].startswith("[0] CAUGHT PeerLostError rank=1: rank 1 aborted (rank 1 fails on purpose)")
    assert "FROM InternalError: " in caught[0] and "[TNT_ERR_PEER_LOST, rank 1]" in caught[0], said
    assert "[2] RAW InternalError" in result.stdout, said
    rank2 = result.stderr.split("rank:    2 (local_rank 2)", 1)[-1].split("\n  rank:", 1)[0]
    assert "exit code 0" in rank2 and "error:   PeerLostError: " in rank2, said
    assert "rank 1 aborted (rank 1 fails on purpose)" in rank2, said
    assert "the program went on after this error" in rank2, said



def test_ranks_agree_on_the_fallback_when_one_rank_cannot_build(tmp_path):
    """Rank 1's compiler fails (a host without one), rank 0 has the ops: both
    take tf.numpy_function, whose requests are named otherwise than the
    compiled ops' (a mix waited until TNT_TIMEOUT_S), and rank 0's WARNING
    names rank 1 and why."""
    result = run_ranks(2, "tf_ops_probe.py", "--out", tmp_path, "--broken-rank", 1,
                       "--broken-cache", tmp_path / "cache", env={"TNT_TIMEOUT_S": 30}, timeout=200)
    for r in (0, 1):
        got = _load(tmp_path, r)
        assert got["library"] is None and "PyFunc" in got["op_types"], got
        assert "TntCollectiveStart" not in got["op_types"], got
        assert got["summed"] == [3.0] * 3 and got["gathered"] == [1.0, 2.0] and got["pair"] == [[3.0], [6.0, 6.0]]
    output = result.stdout + result.stderr
    assert output.count("compiled TensorFlow ops cannot be used") == 1, output[-3000:]
    assert "rank 1: building Tarantella's TensorFlow ops with false failed" in output, output[-3000:]


def test_a_built_library_is_used_from_a_cache_that_cannot_be_written(tmp_path):
    """A read-only cache (a shared home mounted so on compute nodes) still
    serves what is built in it, and an unbuilt one says what to do. (The lock
    file is a folder here: root, who runs CI, may write anywhere.)"""
    from tarantella.common import build_cache

    folder = tmp_path / "tfops"
    folder.mkdir()
    (folder / ".lock").mkdir()  # cannot be opened for writing, as in a read-only cache
    cmd = ["sh", "-c", 'echo built > "$0"', "{out}"]
    with pytest.raises(errors.SystemError, match="cannot write into the build cache .*tfops .*XDG_CACHE_HOME"):
        build_cache.build_once(str(folder), "lib.so", cmd, "building failed")
    (folder / "lib.so").write_text("built")
    assert build_cache.build_once(str(folder), "lib.so", cmd, "building failed") == str(folder / "lib.so")


def test_a_cache_on_a_file_system_without_locks_still_builds(tmp_path, monkeypatch):
    """Lustre mounted without -o flock answers flock() with ENOSYS: the build
    goes on without the lock (each rank may then build, into its own temporary
    file, renamed whole into place)."""
    import errno

    from tarantella.common import build_cache

    def no_locks(*_):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(build_cache.fcntl, "flock", no_locks)
    cmd = ["sh", "-c", 'echo built > "$0"', "{out}"]
    path = build_cache.build_once(str(tmp_path), "lib.so", cmd, "building failed")
    assert open(path).read() == "built\n"

def test_a_build_that_fails_or_is_interrupted_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The compiler writes into a temporary file renamed into place: a failed
    build, or one interrupted (Ctrl+C while the compiler runs), removes it;
    they were left in the cache folder for good."""
    from tarantella.common import build_cache

    failing = ["sh", "-c", 'echo half > "$0"; exit 1', "{out}"]
    with pytest.raises(errors.SystemError, match="building failed"):
        build_cache.build_once(str(tmp_path), "lib.so", failing, "building failed")

    def interrupted(cmd, what, **kw):
        open(cmd[-1], "w").write("half")  # the compiler had begun writing
        raise KeyboardInterrupt

    monkeypatch.setattr(build_cache, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_cache.build_once(str(tmp_path), "lib.so", ["cc", "{out}"], "building failed")
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".so")) == [], os.listdir(tmp_path)


@pytest.fixture
def failing_compiler(tmp_path, monkeypatch):
    """A C++ compiler that counts its calls and fails, and a fresh cache."""
    calls = tmp_path / "calls"
    cxx = tmp_path / "broken-c++"
    cxx.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'fatal error: tensorflow/core/framework/op.h: "
                   "No such file or directory' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return calls


def test_build_error_is_remembered_and_compiled_mode_refuses(failing_compiler):
    with pytest.raises(errors.SystemError, match="(?s)TNT_TF_OPS=compiled, but .*broken-c\\+\\+ failed "
                                                 "\\(exit status 1\\).*No such file or directory"):
        ops._load("compiled")
    assert failing_compiler.read_text().count("x") == 1
    compiled, why = ops._load("auto")  # the fallback, without compiling again
    assert compiled is None and "op.h: No such file or directory" in why and "delete" in why
    assert failing_compiler.read_text().count("x") == 1
    available, detail = ops.status()
    assert not available and "broken-c++ failed" in detail



def test_a_fresh_cache_is_private_under_a_group_writable_umask(failing_compiler, tmp_path):
    """With umask 002 (Debian's and Ubuntu's for users), the cache folders
    Tarantella makes are still its own alone: it gets as far as compiling
    instead of refusing the cache it has just made."""
    old = os.umask(0o002)
    try:
        compiled, why = ops._load("auto")
    finally:
        os.umask(old)
    assert compiled is None and "broken-c++ failed" in why, why
    for folder in (tmp_path / "cache" / "tarantella", tmp_path / "cache" / "tarantella" / "plugins"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700

def test_auto_mode_warns_once_and_falls_back(failing_compiler):
    import logging

    from tarantella.common.logging import get_logger

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = get_logger()
    logger.addHandler(handler)
    try:
        assert ops._load("auto")[0] is None
    finally:
        logger.removeHandler(handler)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "compiled TensorFlow ops cannot be used" in warnings[0]
    assert "broken-c++ failed (exit status 1)" in warnings[0]


def test_no_compiler_and_numpy_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(errors.SystemError, match="no C\\+\\+ compiler found"):
        build.compiler()
    assert ops._load("numpy") == (None, "TNT_TF_OPS=numpy")
    monkeypatch.setenv("TNT_TF_OPS", "numpy")
    assert ops.status() == (False, "not used: TNT_TF_OPS=numpy")



def test_a_host_without_a_compiler_uses_what_another_built(tmp_path, monkeypatch):
    """A login node built the ops into the shared home; a compute node without
    a compiler finds them for the same TensorFlow and source instead of
    falling back."""
    cxx = tmp_path / "fake-c++"  # "compiles" by writing its output file
    cxx.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && echo lib > "$2"; shift; done\n')
    cxx.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    built = build.library()
    assert built.startswith(str(tmp_path / "cache"))
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(errors.SystemError, match="no C\\+\\+ compiler found"):
        build.compiler()
    assert build.library() == built and build.cached() == built
    assert ops.status() == (True, f"built for TensorFlow {tf.__version__}: {built}")

def test_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("TNT_TF_OPS", "fast")
    with pytest.raises(errors.InvalidArgumentError, match="TNT_TF_OPS must be auto \\| compiled \\| numpy"):
        ops.mode()


def test_a_core_error_surfaces_as_a_tensorflow_error():
    """The kernel maps the core's result to a TF status with the core's message."""
    compiled = ops.get()
    if compiled is None:
        pytest.skip("the compiled ops cannot be built here (see the WARNING)")
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tarantella allreduce of x{300}: .*name"):
        compiled.run("allreduce", [tf.constant([1.0])], ["x" * 300])


def test_the_requests_of_a_start_whose_wait_never_runs_are_released():
    """A Start's requests whose Wait never runs: an op between the two fails (TensorFlow drops
    the rest of the step), or the Start itself fails half-way through its list (a name the core
    refuses). They stayed registered for good (handles, inputs and outputs: a leak at every such
    failure); they are now released once the core is done with their buffers."""
    import time

    import numpy as np

    compiled = ops.get()
    if compiled is None:
        pytest.skip("the compiled ops cannot be built here (see the WARNING)")

    @tf.function(autograph=False)
    def interrupted(n, bad):
        x = tf.fill([n], 2.0)  # made here: only the requests hold it once the step fails
        token = compiled.start("allreduce", [x], ["interrupted"])
        with tf.control_dependencies([token]):
            checked = tf.debugging.check_numerics(bad, "a NaN between the start and its wait")
        with tf.control_dependencies([checked]):
            return compiled.wait([token], [x])[0]

    assert interrupted(4, tf.constant(1.0)).numpy().tolist() == [2.0] * 4
    assert compiled.unreleased() == 0
    for _ in range(3):
        with pytest.raises(tf.errors.InvalidArgumentError, match="a NaN between the start"):
            interrupted(1 << 20, tf.constant(np.nan))
    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tarantella allreduce of x{300}"):
        compiled.run("allreduce", [x, x], ["half-way", "x" * 300])  # the first is submitted
    deadline = time.monotonic() + 60
    while compiled.unreleased() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert compiled.unreleased() == 0
    # the names are free again: their requests were released, not left in flight
    assert compiled.run("allreduce", [x, x], ["interrupted", "half-way"])[1].numpy().tolist() == [1.0, 2.0]


def test_a_bad_prescale_is_refused_as_the_numpy_api_refuses_it():
    """Inside a tf.function, tnt.allreduce's prescale is checked as the NumPy API checks it
    eagerly: a prescale of 2 (or 0) elements aborted the whole process (a failed CHECK in
    Tensor::scalar()), an int beyond 2**53 on int64 tensors multiplied by 2**53 without a
    word, and a string failed at run time with an UnimplementedError."""
    import numpy as np

    import tarantella.tensorflow as tnt

    if ops.get() is None:
        pytest.skip("the compiled ops cannot be built here (see the WARNING)")
    ones, big = tf.constant([1.0, 2.0]), tf.constant([1, 1], tf.int64)
    for x, prescale, match in ((ones, np.array([2.0, 3.0]), "real number"),
                               (ones, tf.zeros([0], tf.float64), "must be a scalar|real number"),
                               (big, 2**53 + 1, r"2\*\*53"), (ones, "2", "real number"),
                               (ones, None, "real number")):
        with pytest.raises(errors.InvalidArgumentError, match=match):
            tf.function(lambda x: tnt.allreduce(x, prescale=prescale), autograph=False)(x)
        with pytest.raises(errors.InvalidArgumentError, match=match):  # eagerly: the NumPy API
            tnt.allreduce(x, prescale=prescale)
    for empty in ([], {"a": [], "b": ()}):  # an empty structure: refused at its trace too, not when it ran
        for prescale in ("2", None):
            with pytest.raises(errors.InvalidArgumentError, match="real number"):
                tf.function(lambda: tnt.allreduce(empty, prescale=prescale), autograph=False)()
            with pytest.raises(errors.InvalidArgumentError, match="real number"):
                tnt.allreduce(empty, prescale=prescale)
        assert tf.function(lambda: tnt.allreduce(empty, prescale=0.5), autograph=False)() == empty

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float64)], autograph=False)
    def unknown_shape(scale):
        return tnt.allreduce(ones, prescale=scale, name="unknown-shape")  # named: the compiled ops

    with pytest.raises(tf.errors.InvalidArgumentError, match="prescale must be a scalar"):
        unknown_shape(tf.constant([2.0, 3.0], tf.float64))  # the kernel's check, at run time
    assert unknown_shape(tf.constant(2.0, tf.float64)).numpy().tolist() == [2.0, 4.0]
    assert tf.function(lambda x: tnt.allreduce(x, prescale=2**53), autograph=False)(big).numpy().tolist() == [2**53] * 2


def test_a_prescale_tensor_is_taken_on_both_paths(monkeypatch):
    """A prescale given as a tensor inside a tf.function: the compiled ops take it, and so does
    the numpy_function path (TNT_TF_OPS=numpy, or auto on a host without a compiler), which
    refused it at run time ("prescale must be a real number. Received: prescale=<tf.Tensor
    ...>": the captured symbolic tensor reached the NumPy API)."""
    import tarantella.tensorflow as tnt
    from tarantella.tensorflow import tensor_collectives

    x = tf.constant([1.0, 2.0])
    paths = ["numpy"] + (["compiled"] if ops.get() is not None else [])
    for path in paths:
        if path == "numpy":
            monkeypatch.setattr(tensor_collectives.tf_ops, "get", lambda: None)

        @tf.function(autograph=False)  # traced afresh for each path
        def scaled(x, scale):  # a named tensor, and a structure (one flat request per dtype), on the compiled ops
            return tnt.allreduce(x, prescale=scale, name="scaled"), \
                tnt.allreduce({"x": x, "n": tf.constant(3, tf.int64)}, prescale=scale)

        assert (path == "compiled") == ("TntCollectiveStart" in str(scaled.get_concrete_function(
            x, tf.constant(1.0, tf.float64)).graph.as_graph_def())), path
        one, got = scaled(x, tf.constant(2.0, tf.float64))
        assert one.numpy().tolist() == [2.0, 4.0], (path, one)
        assert got["x"].numpy().tolist() == [2.0, 4.0] and int(got["n"]) == 6, (path, got)
        monkeypatch.undo()


def test_shapes_agree_with_the_numpy_path_and_differing_ones_fail(tmp_path):
    """A rank on the compiled ops and one on the NumPy API (a tf.function on
    one rank, an eager call on another) carry the same layout for one shape,
    and arrays of other shapes but as many elements fail with MismatchError on
    both: tnt_ops.cc passes tnt_shape_layout as the NumPy API does."""
    result = run_ranks(2, "tf_ops_shapes.py", env={"TNT_TF_OPS": "compiled", "TNT_TIMEOUT_S": 60},
                       runner_args=("--output-on-all-devices",), check=False, timeout=300)
    assert result.returncode == 0 and result.stdout.count("OK") == 2, result.stdout[-3000:] + result.stderr[-3000:]


def test_a_saved_model_of_structure_collectives_serves_or_says_why_not(tmp_path):
    """A model whose layer allreduces a structure inside call(), exported (a SavedModel): with
    leaves of known shapes the call is the compiled ops, which a fresh process (no tnt.init,
    the ops loaded by ops.get()) loads and serves; with a leaf of unknown shape it is a
    tf.numpy_function, whose Python code TensorFlow does not save: serving it elsewhere failed
    with "Could not find callback with key=pyfunc_<k> in the registry", naming no cause. The
    export now says so in a WARNING (keras_saving._warning_unservable)."""
    import logging
    import subprocess
    import sys

    import keras
    import numpy as np

    import tarantella as tnt
    import tarantella.tensorflow as ttf
    from tarantella.common.logging import get_logger
    from tarantella.tensorflow import keras_saving
    from tf_helpers import clean_env

    if ops.get() is None:
        pytest.skip("the compiled ops cannot be built here (see the WARNING)")

    class Centre(keras.layers.Layer):
        def __init__(self, unknown, **kw):
            super().__init__(**kw)
            self.unknown = unknown

        def call(self, x):
            if self.unknown:  # x: (None, 3), a leaf of unknown shape: the numpy_function path
                return ttf.allreduce({"x": x, "n": [1.0]}, name="saved-unknown")["x"]
            s = ttf.allreduce({"sum": tf.reduce_sum(x, 0), "n": [tf.cast(tf.shape(x)[0], tf.float32)]},
                              name="saved-centre")
            return x - s["sum"] / s["n"][0]

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    get_logger().addHandler(handler)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    try:
        for unknown in (False, True):
            inp = keras.Input((3,))
            model = tnt.Model(keras.Model(inp, Centre(unknown)(inp)))
            model.export(str(tmp_path / f"unknown{unknown}"), verbose=False)
    finally:
        get_logger().removeHandler(handler)
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING and "SavedModel" in r.getMessage()]
    assert len(warned) == 1 and "1 tnt collective call(s) made through tf.numpy_function" in warned[0], warned
    assert keras_saving.numpy_function_collectives(str(tmp_path / "unknownTrue"))
    assert keras_saving.numpy_function_collectives(str(tmp_path / "unknownFalse")) == []
    serve = ("import sys, numpy as np, tensorflow as tf\n"
             "import tarantella.tensorflow.ops as o\n"
             "o.get()\n"
             "m = tf.saved_model.load(sys.argv[1])\n"
             "print('SERVED', m.serve(np.arange(12, dtype=np.float32).reshape(4, 3)).numpy().tolist())\n")
    done = subprocess.run([sys.executable, "-c", serve, str(tmp_path / "unknownFalse")], env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"SERVED {(x - x.mean(0)).tolist()}" in done.stdout, done.stdout


def test_ragged_sparse_and_indexed_slices_leaves_are_refused_by_type():
    """A RaggedTensor, SparseTensor or IndexedSlices (an Embedding's gradient) given to
    tarantella.tensorflow's collectives, alone or in a structure, eagerly or traced, is the
    TypeError that names its type and what to pass instead. Before, a RaggedTensor in a
    structure was "dtype object is not supported" eagerly, and traced "a symbolic tensor ...
    cannot go through the NumPy collectives: ... use the framework frontend's collectives", the
    very ones called; alone eagerly, "allreduce expects a NumPy array" (InvalidArgumentError)."""
    import tarantella.tensorflow as tnt

    table = tf.Variable(tf.ones([4, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [1, 3]))
    sliced = tape.gradient(loss, table)
    assert isinstance(sliced, tf.IndexedSlices)
    for leaf, match in ((lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]), "RaggedTensor"),
                        (lambda: tf.sparse.from_dense([[1.0, 0.0]]), "SparseTensor"),
                        (lambda: sliced, "IndexedSlices")):
        for call in (lambda: tnt.allreduce(leaf()), lambda: tnt.allreduce({"a": leaf(), "b": tf.ones([2])}),
                     lambda: tnt.allgather([leaf()]), lambda: tnt.broadcast(leaf())):
            for run in (call, tf.function(call, autograph=False)):
                with pytest.raises(TypeError, match=f"pass .*Received: a leaf of type {match}"):
                    run()
