"""What the launcher costs before the ranks run, and TNT_STARTUP_LOG (the
record bench/startup.py reads): behaviours, never timings."""
import subprocess
import sys

from tntrun_helpers import TNTRUN, make_script_factory, run_tntrun, runner_env


def test_the_launcher_imports_neither_numpy_nor_the_core_nor_tensorflow():
    # tntrun runs before any rank starts: a module it imports is paid by every job
    # (NumPy and the compiled core were 0.1-0.15 s of each start). Checked after a dry run's
    # whole start (the options parsed, TNT_* settings read, the ranks planned): building the
    # parser loaded the core for two defaults in its help, and reading any setting loaded it
    # for the core's table
    boot = TNTRUN[-1] if TNTRUN[0] == sys.executable else "from tarantella.runner.cli import main"
    # (from the source tree, TNTRUN's boot ends in "main; sys.exit(main())": the "; " went
    # into the code as "main; ;", a SyntaxError)
    code = boot.split("sys.exit(main())")[0].strip().rstrip(";") + (
        "\nimport contextlib, io, sys\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--dry-run', '-n', '2', '--no-python', '--', 'true'])\n"
        "print(sorted(m for m in ('numpy', 'tarantella._core', 'tensorflow', 'keras', "
        "'cffi') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], env=runner_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_package_serves_the_common_api_on_first_access():
    # import tarantella no longer imports tarantella.common's modules eagerly: the
    # names must still all be there, as attributes and through `import *`
    code = ("import sys, tarantella as tnt\n"
            "assert 'tarantella.common.collectives' not in sys.modules\n"
            "from tarantella.common import __all__ as common\n"
            "missing = [n for n in common if not hasattr(tnt, n) or n not in dir(tnt)]\n"
            "assert not missing, missing\n"
            "ns = {}; exec('from tarantella.common import *', ns)\n"
            "assert set(common) <= set(ns), set(common) - set(ns)\n"
            "assert tnt.allreduce is tnt.common.collectives.allreduce\n"
            "assert issubclass(tnt.PeerLostError, tnt.TarantellaError)\n"
            "try:\n    tnt.no_such_name\nexcept AttributeError as e:\n    print('ok', e)\n")
    res = subprocess.run([sys.executable, "-c", code], env=runner_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("ok") and "no_such_name" in res.stdout, \
        res.stdout + res.stderr


def test_startup_log_records_the_launcher_and_every_rank(tmp_path):
    log = tmp_path / "startup.log"
    script = make_script_factory(tmp_path)("import tarantella as tnt\ntnt.init()\n")
    res = run_tntrun(["-n", "2", "--", script], env=runner_env(TNT_STARTUP_LOG=str(log)))
    assert res.returncode == 0, res.stderr
    from tarantella.common.startup_log import read

    events = {(label, event) for label, _, event in read(str(log))}
    expected = {("tntrun", "tntrun: main"), ("tntrun", "tntrun: started rank 0"),
                ("tntrun", "tntrun: started rank 1")}
    for rank in "01":
        expected |= {(rank, "import tarantella"), (rank, "tnt.init: begin"), (rank, "tnt.init: connected")}
    assert expected <= events, sorted(events)
    times = {(label, event): when for label, when, event in read(str(log))}
    for rank in "01":  # in the order they happen
        assert times[("tntrun", "tntrun: main")] <= times[("tntrun", f"tntrun: started rank {rank}")] \
            <= times[(rank, "import tarantella")] <= times[(rank, "tnt.init: connected")]


def test_without_startup_log_nothing_is_written(tmp_path, monkeypatch):
    from tarantella.common import startup_log

    monkeypatch.delenv("TNT_STARTUP_LOG", raising=False)
    monkeypatch.delenv("TNT_RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    startup_log.mark("an event")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("TNT_STARTUP_LOG", str(tmp_path / "log"))
    startup_log.mark("an event")
    assert [(label, e) for label, _, e in startup_log.read(str(tmp_path / "log"))] == \
        [("serial", "an event")]  # a process outside a job
