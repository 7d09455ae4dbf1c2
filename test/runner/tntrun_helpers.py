"""Helpers for the runner tests: run `tntrun` as a user would.

The installed console script is used when there is one (CI installs the package);
otherwise (a source tree whose core is not built) a shim maps the package
tarantella.runner to the folder runner/, as setup.py's package_dir does.
"""
import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def _shim_dir():
    """One folder per test process, removed at its exit (one per call left hundreds in /tmp)."""
    d = tempfile.mkdtemp(prefix="tnt-runner-shim-")
    os.symlink(os.path.join(REPO, "runner"), os.path.join(d, "runner"))
    atexit.register(shutil.rmtree, d, True)
    return d


def tntrun_argv(name="tntrun"):
    """The command `name` (tntrun, or its alias tarantella, the original's name)."""
    exe = shutil.which(name)
    if exe and not os.environ.get("TNT_TEST_RUNNER_FROM_SOURCE"):
        return [exe]
    shim = _shim_dir()
    boot = (f"import sys; sys.argv[0] = {name!r}; import tarantella; "
            f"tarantella.__path__.append({shim!r}); "
            "from tarantella.runner.cli import main; sys.exit(main())")
    return [sys.executable, "-c", boot]


TNTRUN = tntrun_argv()
TARANTELLA = tntrun_argv("tarantella")


def runner_env(**extra):
    env = dict(os.environ)
    if TNTRUN[0] == sys.executable:
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    # a private job registry per test run, so tests never see a user's real jobs
    env.setdefault("TNT_STATE_DIR", _STATE_DIR)
    # no GPU unless a test hands out a fake listing: the same results on any machine
    env["TNT_GPU_LISTING"] = _NO_GPUS
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for name in [k for k in env if k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_"))]:
        if name not in ("TNT_STATE_DIR", "TNT_GPU_LISTING", "TNT_TEST_RUNNER_FROM_SOURCE"):
            del env[name]
    env.update(extra)
    return env


_STATE_DIR = tempfile.mkdtemp(prefix="tnt-runner-state-")
_NO_GPUS = os.path.join(_STATE_DIR, "no-gpus.txt")
open(_NO_GPUS, "w").close()


def import_runner():
    """Make `tarantella.runner` importable in the test process (for unit tests)."""
    import tarantella

    if os.environ.get("TNT_TEST_RUNNER_FROM_SOURCE"):
        # this tree's runner, as tntrun_argv() runs it: an editable install elsewhere (another
        # checkout) maps tarantella.runner to its own folder, and the unit tests tested that one
        tarantella.__path__.append(_shim_dir())
    try:
        import tarantella.runner  # noqa: F401 - installed
    except ImportError:
        tarantella.__path__.append(_shim_dir())
        import tarantella.runner  # noqa: F401


def fake_bin(tmp_path, **programs):
    """A directory with tiny executables (name -> shell body), for PATH."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    for name, body in programs.items():
        path = d / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return str(d)


def run_tntrun(args, timeout=60, env=None, command=None, **kwargs):
    """Run tntrun (or `command`, e.g. TARANTELLA) to completion; returns the
    CompletedProcess (text mode)."""
    return subprocess.run((command or TNTRUN) + list(args), capture_output=True, text=True,
                          timeout=timeout, env=env or runner_env(), **kwargs)


def start_tntrun(args, env=None, **kwargs):
    return subprocess.Popen(TNTRUN + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or runner_env(), **kwargs)


def make_script_factory(tmp_path):
    """script(body) -> path of a Python file that the ranks run (plain Python: no core)."""
    counter = [0]

    def make(body, name=None):
        counter[0] += 1
        path = tmp_path / (name or f"rank_script_{counter[0]}.py")
        path.write_text("import os, sys, time\n" + textwrap.dedent(body))
        return str(path)

    return make


def rank_wrapper_argv():
    """How to run `python -m tarantella.runner.rank` (the rank wrapper that engines start),
    installed or from this source tree."""
    return runner_module_argv("rank")


def runner_module_argv(module, prelude=""):
    """How to run `python -m tarantella.runner.MODULE`, installed or from this source tree;
    `prelude`: Python statements run first (a test's settings)."""
    if TNTRUN[0] != sys.executable and not prelude:
        return [sys.executable, "-m", f"tarantella.runner.{module}"]
    shim = "" if TNTRUN[0] != sys.executable else f"tarantella.__path__.append({_shim_dir()!r}); "
    boot = (f"import sys; import tarantella; {shim}\n{prelude}\n"
            f"from tarantella.runner.{module} import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-c", boot]
