"""Local jobs: ranks started by tntrun itself, their environment, output and failure."""
import glob
import os
import re
import subprocess
import sys

import pytest

from tntrun_helpers import TNTRUN, import_runner, run_tntrun, runner_env


def test_ranks_get_the_environment_contract(script):
    path = script("""
        keys = ["TNT_RANK", "TNT_SIZE", "TNT_LOCAL_RANK", "TNT_LOCAL_SIZE", "TNT_JOB_ID",
                "TNT_ERROR_FILE", "TNT_LAUNCHER_DIR", "PYTHONUNBUFFERED"]
        print("ENV", " ".join(f"{k}={os.environ.get(k)}" for k in keys), sys.argv[1:], flush=True)
    """)
    # a TNT_LAUNCHER_DIR of another job's tntrun (this one started from its rank) is not this job's
    res = run_tntrun(["-n", "3", "--output-on-all-devices", "--", path, "a", "--b=1"],
                     env=runner_env(TNT_LAUNCHER_DIR="/outer-job"))
    assert res.returncode == 0, res.stderr
    lines = sorted(ln for ln in res.stdout.splitlines() if " ENV " in ln)
    assert len(lines) == 3
    job_ids = set()
    for r, line in enumerate(lines):
        assert line.startswith(f"[{r}] ENV TNT_RANK={r} TNT_SIZE=3 TNT_LOCAL_RANK={r} TNT_LOCAL_SIZE=3")
        assert "PYTHONUNBUFFERED=1" in line and "['a', '--b=1']" in line
        job_ids.add(re.search(r"TNT_JOB_ID=(\w+)", line).group(1))
        assert re.search(r"TNT_ERROR_FILE=/\S+rank%d\.json" % r, line)
        # where tntrun notes each rank's end for the ranks that wait for it (test_failures.py)
        error_dir = os.path.dirname(re.search(r"TNT_ERROR_FILE=(\S+)", line).group(1))
        assert f"TNT_LAUNCHER_DIR={error_dir} " in line
    (job_id,) = job_ids
    assert re.fullmatch(r"[0-9a-f]{32}", job_id)


def test_failing_rank_ends_the_job_with_its_code(script):
    path = script("""
        if os.environ["TNT_RANK"] == "1":
            print("something broke on rank 1", file=sys.stderr)
            sys.exit(7)
        time.sleep(60)
    """)
    res = run_tntrun(["-n", "3", "--", path], timeout=30)
    assert res.returncode == 7
    assert "Root cause" in res.stderr and "1 (local_rank 1)" in res.stderr
    assert "exit code 7" in res.stderr
    assert "something broke on rank 1" in res.stderr  # hidden rank's stderr shown in the report


def test_shm_of_the_job_is_removed(script):
    path = script("""
        job = os.environ["TNT_JOB_ID"]
        with open(f"/dev/shm/tnt-{job}-rank{os.environ['TNT_RANK']}", "w") as f:
            f.write("x")
        print("JOB", job)
    """)
    res = run_tntrun(["-n", "2", "--", path])
    assert res.returncode == 0, res.stderr
    job = re.search(r"JOB (\w+)", res.stdout).group(1)
    assert glob.glob(f"/dev/shm/tnt-{job}*") == []


def test_error_file_message_in_the_report(script):
    # a rank that raises writes TNT_ERROR_FILE (tarantella.common does it on import; the
    # test rank writes the same JSON by hand so that it needs no built core)
    path = script("""
        import json
        if os.environ["TNT_RANK"] == "0":
            with open(os.environ["TNT_ERROR_FILE"], "w") as f:
                json.dump({"message": "ValueError: the root cause", "traceback": "Traceback...",
                           "timestamp": time.time(), "pid": os.getpid(), "rank": 0}, f)
            raise SystemExit(1)
        time.sleep(60)
    """)
    res = run_tntrun(["-n", "2", "--", path], timeout=30)
    assert res.returncode == 1
    assert "error:   ValueError: the root cause" in res.stderr
    assert "Stopped by tntrun after the failure: 1" in res.stderr


@pytest.mark.parametrize("rank0_error", ["PeerLostError", "RuntimeError"])
def test_rank_that_raised_first_is_the_root_cause_even_if_stopped(script, rank0_error):
    # rank 1 raises first but is slow to exit; rank 0 fails later (because of rank 1, or on
    # its own) and exits first. tntrun stops rank 1, and still names it: it failed first.
    path = script(f"""
        import json
        def record(message):
            with open(os.environ["TNT_ERROR_FILE"], "w") as f:
                json.dump({{"message": message, "traceback": "Traceback...\\n" + message,
                           "timestamp": time.time(), "pid": os.getpid(),
                           "rank": os.environ["TNT_RANK"]}}, f)
        if os.environ["TNT_RANK"] == "1":
            record("ValueError: raised first")
            time.sleep(60)  # a slow exit
        other = os.environ["TNT_ERROR_FILE"].replace("rank0.json", "rank1.json")
        while not os.path.exists(other):
            time.sleep(0.05)
        time.sleep(0.1)
        record("{rank0_error}: raised second")
        sys.exit(1)
    """)
    res = run_tntrun(["-n", "2", "--", path], timeout=60)
    root = res.stderr.split("Root cause", 1)[1].split("-" * 72, 1)[0]
    assert "rank:    1 (local_rank 1)" in root and "ValueError: raised first" in root, res.stderr
    assert res.returncode == 128 + 15  # stopped by tntrun's SIGTERM
    assert "Stopped by tntrun" not in res.stderr


def test_rank_killed_by_a_signal(script):
    path = script("""
        import signal
        if os.environ["TNT_RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    res = run_tntrun(["-n", "2", "--", path], timeout=30)
    assert res.returncode == 128 + 9
    assert "signal 9 (SIGKILL)" in res.stderr


def test_all_ranks_succeed_gives_zero(script):
    path = script("sys.exit(0)\n")
    res = run_tntrun(["-n", "2", "--", path])
    assert res.returncode == 0, res.stderr
    assert "FAILED" not in res.stderr


def test_log_level_error_gives_one_line(script):
    # rank 0 still runs when rank 1 fails, so tntrun stops it: the notice it prints then
    # ("tntrun: rank 1 failed: stopping the other processes") is no error, and the report
    # that cli.md promises in one line came in two
    path = script("""
        if os.environ["TNT_RANK"] == "1":
            sys.exit(5)
        time.sleep(60)
    """)
    res = run_tntrun(["-n", "2", "--log-level", "ERROR", "--", path], timeout=30)
    assert res.returncode == 5
    assert re.fullmatch(r"tntrun: error: \S+: rank 1: Exit code 5\n", res.stderr), res.stderr


def test_output_only_from_rank_zero_by_default(script):
    path = script("""
        print(f"out of {os.environ['TNT_RANK']}")
        print(f"err of {os.environ['TNT_RANK']}", file=sys.stderr)
    """)
    res = run_tntrun(["-n", "3", "--", path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["out of 0"]
    assert "err of 0" in res.stderr and "err of 1" not in res.stderr and "err of 2" not in res.stderr


def test_output_on_all_devices_prefixes_every_line(script):
    path = script("""
        print(f"out of {os.environ['TNT_RANK']}")
        print(f"err of {os.environ['TNT_RANK']}", file=sys.stderr)
        print("TNT_OUTPUT_ON_ALL_DEVICES=" + os.environ.get("TNT_OUTPUT_ON_ALL_DEVICES", ""))
        print("stdin: " + repr(sys.stdin.read()))
        sys.stderr.write("\\rbar 1/2\\rbar 2/2\\n")  # a progress bar (tqdm's, on stderr)
        sys.stderr.write("crlf\\r\\n")
    """)
    res = run_tntrun(["-n", "3", "--output-on-all-devices", "--", path], input="typed\n")
    assert res.returncode == 0, res.stderr
    out = set(res.stdout.splitlines())
    # (text mode: each \r reads as a line end) every redrawing of a progress bar has the
    # prefix: a terminal showed the last one over the prefix, "bar 2/2" without its rank
    err = res.stderr.splitlines()
    assert "bar 2/2" not in err and "crlf" not in err, res.stderr
    for r in range(3):
        assert f"[{r}] bar 1/2" in err and f"[{r}] bar 2/2" in err and f"[{r}] crlf" in err
        assert f"[{r}] out of {r}" in out and f"[{r}] err of {r}" in res.stderr
        assert f"[{r}] TNT_OUTPUT_ON_ALL_DEVICES=true" in out
        # tntrun's stdin reaches rank 0 alone; the others read an empty one (cli.md)
        assert f"[{r}] stdin: " + repr("typed\n" if r == 0 else "") in out, res.stdout


def test_output_and_log_settings_from_the_environment_are_the_flags(script):
    # "a flag that is not given leaves the variable as it is in your environment" (cli.md):
    # the ranks read TNT_OUTPUT_ON_ALL_DEVICES / TNT_LOG_LEVEL from there (or from -x), so
    # tntrun must act on them as on the flags. Before, TNT_OUTPUT_ON_ALL_DEVICES=true made
    # every rank print (Keras' progress, callbacks) and tntrun hid all but rank 0's, and
    # TNT_LOG_LEVEL=ERROR kept the full report
    # every rank prints, and exits 0 (a rank that fails early would have tntrun stop the others,
    # perhaps before they print)
    prints = script("print(f\"out of {os.environ['TNT_RANK']}\")\n")
    for env, extra in ((runner_env(TNT_OUTPUT_ON_ALL_DEVICES="true"), []),
                       (runner_env(), ["-x", "TNT_OUTPUT_ON_ALL_DEVICES=1"])):
        res = run_tntrun(["-n", "3", *extra, "--", prints], env=env)
        out = set(res.stdout.splitlines())
        assert {"[0] out of 0", "[1] out of 1", "[2] out of 2"} <= out, res.stdout + res.stderr
    res = run_tntrun(["-n", "2", "-l", "-x", "TNT_OUTPUT_ON_ALL_DEVICES=false", "--", prints])
    assert res.stdout.splitlines() == ["out of 0"], res.stdout + res.stderr  # -x wins, as for the ranks
    path = script("sys.exit(int(os.environ['TNT_RANK']) * 5)\n")
    res = run_tntrun(["-n", "2", "--", path], env=runner_env(TNT_LOG_LEVEL="error"))
    assert res.returncode == 5 and "rank 1: Exit code 5" in res.stderr and "Root cause" not in res.stderr
    res = run_tntrun(["-n", "2", "--", path], env=runner_env(TNT_OUTPUT_ON_ALL_DEVICES="maybe"))
    assert res.returncode == 2 and "TNT_OUTPUT_ON_ALL_DEVICES=maybe" in res.stderr, res.stderr


def test_log_on_all_devices_shows_every_ranks_log(script):
    # the other ranks' logs go to their stderr, which tntrun hid: --log-on-all-devices (the
    # original tarantella's flag, or TNT_LOG_ON_ALL_DEVICES) alone showed rank 0's log only
    path = script("""
        print(f"out of {os.environ['TNT_RANK']}")
        print(f"log of {os.environ['TNT_RANK']}", file=sys.stderr)
    """)
    for extra, env in ((["--log-on-all-devices"], runner_env()),
                       ([], runner_env(TNT_LOG_ON_ALL_DEVICES="true"))):
        res = run_tntrun(["-n", "2", *extra, "--", path], env=env)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == ["out of 0"], res.stdout  # the output stays rank 0's
        assert "log of 0" in res.stderr and "log of 1" in res.stderr, res.stderr


def _on_one_core():
    """preexec_fn: run tntrun (and so its ranks) on one core of this machine, whatever its size."""
    core = min(os.sched_getaffinity(0))
    return lambda: os.sched_setaffinity(0, {core})


def test_more_ranks_than_cores_set_omp_num_threads_once(script):
    path = script("print(os.environ['TNT_RANK'], os.environ.get('OMP_NUM_THREADS'))\n")
    res = run_tntrun(["-n", "2", "--output-on-all-devices", "--", path], timeout=60,
                     preexec_fn=_on_one_core())
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[0] 0 1", "[1] 1 1"]
    assert res.stderr.count("OMP_NUM_THREADS=1") == 1
    assert "2 ranks on 1 cores" in res.stderr


def test_omp_num_threads_of_the_user_is_kept(script):
    path = script("print(os.environ.get('OMP_NUM_THREADS'))\n")
    res = run_tntrun(["-n", "2", "-x", "OMP_NUM_THREADS=3", "--", path], timeout=60,
                     preexec_fn=_on_one_core())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "3" and "OMP_NUM_THREADS" not in res.stderr


def test_exports_in_order_later_wins(script):
    path = script("print(os.environ['A'], os.environ['B'], os.environ['C'], os.environ['HOME_COPY'])\n")
    res = run_tntrun(["-n", "1", "-x", "A=1", "-x", "B=x=y z", "-x", "A=2", "-x", "C=",
                      "-x", "HOME_COPY=$HOME", "--", path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "2 x=y z  $HOME"
    # as written, as mpirun passes it: but the original tarantella's script expanded a -x value
    # on every rank (`-x 'OUT=/logs/$GASPI_RANK'`, a file per rank), so a job script of the
    # original now silently gave every rank one value: a WARNING names the reference
    assert ("WARNING: -x HOME_COPY ($HOME): tntrun passes -x values to every rank as written"
            in res.stderr), res.stderr
    assert "-x A" not in res.stderr and "-x B" not in res.stderr


def test_an_export_with_a_shell_reference_warns_once_and_names_no_value(script):
    path = script("print(os.environ['OUT'], os.environ['PW'], os.environ['FWD'])\n")
    res = run_tntrun(["-n", "2", "-x", "OUT=/logs/${GASPI_RANK}.log", "-x", "PW=pa$$word$",
                      "-x", "FWD", "--", path], env=runner_env(FWD="x$FROM_ENV"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "/logs/${GASPI_RANK}.log pa$$word$ x$FROM_ENV"
    assert res.stderr.count("WARNING: -x OUT (${GASPI_RANK}):") == 1, res.stderr
    # `$$` and a trailing `$` are no reference; -x NAME forwards a value no shell expands
    assert "-x PW" not in res.stderr and "-x FWD" not in res.stderr, res.stderr


def test_export_takes_one_variable_and_the_program_follows(script):
    # like mpirun's -x: one NAME=VALUE per -x, so the program after it is not swallowed
    path = script("print('ran', os.environ['A'], sys.argv[1:])\n")
    res = run_tntrun(["-n", "2", "-x", "A=1", path, "--epochs", "3"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ran 1 ['--epochs', '3']"


def test_seed_style_export_list_is_refused_with_a_hint():
    res = run_tntrun(["-n", "2", "-x", "A=1", "B=2", "--", "train.py"])
    assert res.returncode == 2
    assert "-x takes one NAME=VALUE: write -x B=2" in res.stderr


def test_no_gpu_without_n_runs_one_cpu_rank(script):
    path = script("print(os.environ['TNT_RANK'], os.environ['TNT_SIZE'], "
                  "repr(os.environ['CUDA_VISIBLE_DEVICES']))\n")
    res = run_tntrun(["--no-gpu", "--", path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0 1 ''"
    assert "WARNING" not in res.stderr  # --no-gpu asked for the CPU: nothing to warn about


def test_export_without_value_forwards_the_current_one(script):
    path = script("print(os.environ['MY_FORWARDED'])\n")
    env = runner_env(MY_FORWARDED="from-runner")
    res = run_tntrun(["-n", "1", "-x", "MY_FORWARDED", "--", path], env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "from-runner"


def test_flags_set_the_tnt_variables(script, tmp_path):
    names = ["TNT_LOG_LEVEL", "TNT_LOG_ON_ALL_DEVICES", "TNT_FUSION_THRESHOLD_KB", "TNT_TIMEOUT_S",
             "TNT_TRANSPORT", "TNT_TIMELINE"]
    path = script(f"print(' '.join(f'{{k}}={{os.environ.get(k)}}' for k in {names!r}))\n")
    res = run_tntrun(["-n", "1", "--log-level", "warn", "--log-on-all-devices", "--fusion-threshold",
                      "0", "--timeout", "12.5", "--transport", "shm", "--timeline", "tl.json", "--",
                      path], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        "TNT_LOG_LEVEL=WARNING", "TNT_LOG_ON_ALL_DEVICES=true", "TNT_FUSION_THRESHOLD_KB=0",
        "TNT_TIMEOUT_S=12.5", "TNT_TRANSPORT=shm", f"TNT_TIMELINE={tmp_path / 'tl.json'}"]


def test_fusion_threshold_mb_and_verbose(script):
    path = script("print(os.environ['TNT_FUSION_THRESHOLD_KB'], os.environ['TNT_LOG_LEVEL'])\n")
    res = run_tntrun(["-n", "1", "--fusion-threshold-mb", "2", "--verbose", "--", path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["2048", "INFO"]


def test_python_interpreter_empty_runs_an_executable(tmp_path):
    sh = tmp_path / "job.sh"
    sh.write_text('#!/bin/sh\necho "shell rank $TNT_RANK of $TNT_SIZE: $1"\n')
    sh.chmod(0o755)
    res = run_tntrun(["-n", "2", "--output-on-all-devices", "--python-interpreter", "", "--",
                      str(sh), "arg"])
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[0] shell rank 0 of 2: arg", "[1] shell rank 1 of 2: arg"]
    res = run_tntrun(["-n", "1", "--no-python", "--", str(sh), "x"])
    assert res.stdout.strip() == "shell rank 0 of 1: x"


def test_python_interpreter_with_arguments(script):
    path = script("print('flag', sys.flags.optimize, os.environ.get('WRAPPED'))\n")
    res = run_tntrun(["-n", "1", "--python-interpreter", f"env WRAPPED=yes {sys.executable} -O",
                      "--", path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "flag 1 yes"


def test_explicit_python_is_not_doubled(script):
    path = script("print('ran', sys.argv[1:])\n")
    res = run_tntrun(["-n", "1", "--", sys.executable, path, "z"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ran ['z']"
    res = run_tntrun(["--dry-run", "-n", "1", "--", "python3", path])
    assert f"python3 {path}" in res.stdout and "python python3" not in res.stdout


def test_module_flag(tmp_path):
    (tmp_path / "tnt_demo_mod.py").write_text("import os\nprint('module rank', os.environ['TNT_RANK'])\n")
    res = run_tntrun(["-n", "1", "-m", "--", "tnt_demo_mod"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "module rank 0"


def test_first_positional_starts_the_command(script):
    path = script("print('args', sys.argv[1:])\n")
    # a `--` after PROGRAM is the program's, as every word after it (it was refused as
    # "unexpected argument(s) before --")
    res = run_tntrun(["-n", "1", path, "--epochs", "3", "-n", "9", "--", "x"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "args ['--epochs', '3', '-n', '9', '--', 'x']"


def test_dry_run_prints_every_rank_and_starts_nothing(script, tmp_path):
    marker = tmp_path / "ran"
    path = script(f"open({str(marker)!r}, 'w').close()\n")
    res = run_tntrun(["--dry-run", "-n", "2", "-x", "FOO=bar", "--", path])
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    assert "# rank 0" in res.stdout and "# rank 1" in res.stdout
    assert "TNT_RANK=1" in res.stdout and "FOO=bar" in res.stdout and path in res.stdout


def test_program_not_found(tmp_path):
    res = run_tntrun(["-n", "2", "--python-interpreter", "", "--", str(tmp_path / "nope")])
    assert res.returncode == 127
    assert "no such file" in res.stderr


@pytest.mark.parametrize("what, message", [
    ("no-shebang", "not a format this system can execute (Exec format error). A script needs a "
                   "first line such as #!/bin/bash"),
    ("directory", "it is a directory, not a program"),
    ("bare-name", "no such command on PATH; the current directory has a file of that name: "
                  "write ./run.sh"),
])
def test_program_that_cannot_be_executed_is_named_with_what_to_do(tmp_path, what, message):
    # each used to be a traceback of tntrun (Exec format error), or a wrong hint (a directory
    # "permission denied. Make it executable", a script of the current directory "no such file")
    program = "run.sh"
    if what == "directory":
        (tmp_path / program).mkdir()
    else:
        (tmp_path / program).write_text("echo hi\n")
        (tmp_path / program).chmod(0o755)
    argv = ["-n", "2", "--no-python", "--", program if what == "bare-name" else "./" + program]
    res = run_tntrun(argv, cwd=str(tmp_path))
    assert res.returncode == 127, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("program, message", [
    ("missing.py", "cannot start 'missing.py': no such file ("),
    ("sh", "no such file here; /"),  # a command on PATH, not a file of this directory
    ("/bin/sh", "it is a compiled executable, not a Python script: to run it, write --no-python "
                "(tntrun --no-python -- /bin/sh ...)"),
    ("run.sh", "it is a script for /bin/sh, not a Python script: to run it, write --no-python "
               "(tntrun --no-python -- ./run.sh ...)"),    ("adir", "it is a directory without a __main__.py, not a Python script"),
])
@pytest.mark.parametrize("python", [[], ["python"]])
def test_a_python_script_that_cannot_run_is_named_once(tmp_path, program, message, python):
    # PROGRAM runs with Python: each rank failed on its own, with a report of Python's words
    # (`can't open file`, for a binary `SyntaxError: source code cannot contain null bytes`).
    # So too after an interpreter written out, as mpirun's users do (`-- python missing.py`):
    # that one still failed on every rank, exit 2, in a report named "python"
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "adir").mkdir()
    res = run_tntrun(["-n", "2", "--"] + python + [program], cwd=str(tmp_path))
    assert res.returncode == 127, res.stderr
    assert message in res.stderr, res.stderr
    assert ("--no-python" in res.stderr) == (program not in ("missing.py", "adir")), res.stderr
    assert "FAILED" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_report_names_the_script_after_an_interpreter_written_out(script):
    # `tntrun -- python train.py` reported "tntrun: python FAILED"
    path = script("sys.exit(3)\n", name="exits_three.py")
    res = run_tntrun(["-n", "1", "--", "python", path])
    assert res.returncode == 3 and f"tntrun: {path} FAILED" in res.stderr, res.stderr
    import_runner()
    from tarantella.runner.command import program_name
    assert program_name(["python3", "-m", "pkg.train", "--x"]) == "pkg.train"
    assert program_name(["pkg.train"], module=True) == "pkg.train"
    assert program_name(["python", "-c", "print(1)"]) == "python"
    assert program_name(["train.py", "--epochs", "3"]) == "train.py"


def test_a_long_line_without_its_end_is_passed_on_in_linear_time(script, tmp_path):
    # under --output-on-all-devices tntrun holds a line until its newline (so that ranks'
    # lines never mix), and re-copied all it held for every 64 KiB read: a line of 32 MiB
    # (a tqdm bar redrawn after \r for a whole training, binary output) took 8 s here, one of
    # 128 MiB minutes, with the rank blocked on its pipe meanwhile. Now a second or two; the
    # bound below is far from both
    path = script("""
        chunk = b"x" * (1 << 20)
        for _ in range(128):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.write(b"\\n")
    """)
    out = tmp_path / "out"
    with open(out, "wb") as f:
        proc = subprocess.run(TNTRUN + ["-n", "1", "-l", "--", path], stdout=f, stderr=subprocess.PIPE,
                              env=runner_env(), timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size == len(b"[0] ") + (128 << 20) + 1


def test_labelled_output_whose_reader_goes_away_ends_the_job_as_unlabelled_output_does(script):
    # `tntrun -l -- train.py | head` ran the whole job unread and exited 0, where without -l
    # (and with plain python) the program's next write fails and the job ends. Now the rank's
    # pipe loses its reader too: its next write fails (BrokenPipeError), and tntrun reports it.
    # The program prints for ever: were the job kept going, wait() below would time out
    path = script("""
        i = 0
        while True:
            print("line", i, flush=True)
            i += 1
            time.sleep(0.01)
    """)
    proc = subprocess.Popen(TNTRUN + ["-n", "2", "-l", "--", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=runner_env())
    first = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # what `head -3` does after its third line
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert all(re.match(rb"\[[01]\] line \d+\n", line) for line in first), first
    assert proc.returncode == 1, err.decode()[-3000:]
    assert b"BrokenPipeError" in err and b"Root cause" in err, err.decode()[-3000:]
