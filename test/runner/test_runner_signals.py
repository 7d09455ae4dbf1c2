"""Ctrl+C / SIGTERM to tntrun, and --cleanup after tntrun itself was SIGKILLed."""
import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from tntrun_helpers import fake_bin, import_runner, run_tntrun, runner_env, start_tntrun

RANK = """
job = os.environ["TNT_JOB_ID"]
open(f"/dev/shm/tnt-{job}-test-rank{os.environ['TNT_RANK']}", "w").close()
print("UP", job, os.getpid(), flush=True)
time.sleep(120)
"""
# a rank that outlives a killed tntrun (as ranks of an older tntrun did, or a rank's own
# children): it clears the parent-death signal that tntrun gave it
OUTLIVE = "import ctypes\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none\n"


def _wait_up(proc, ranks):
    """Read "[r] UP job pid" lines until every rank is up; returns (job, pids)."""
    pids, job = [], None
    deadline = time.monotonic() + 30
    while len(pids) < ranks and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break  # tntrun ended
        match = re.search(r"UP (\w+) (\d+)", line)
        if match:
            job, pid = match.group(1), int(match.group(2))
            pids.append(pid)
    assert len(pids) == ranks, "ranks did not start"
    return job, pids


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGQUIT])
def test_signal_to_runner_stops_every_rank(script, sig):
    # SIGQUIT (Ctrl+\) used to end tntrun alone (its default action), leaving its temporary
    # folder and job record, its ranks SIGKILLed by the parent-death signal
    path = script(RANK + "\n")
    proc = start_tntrun(["-n", "3", "--output-on-all-devices", "--", path])
    try:
        job, pids = _wait_up(proc, 3)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert {c.pid for c in children} >= set(pids)
        proc.send_signal(sig)
        proc.wait(timeout=15)
        assert proc.returncode == 128 + sig
        gone, alive = psutil.wait_procs(children, timeout=5)
        assert alive == []
        assert glob.glob(f"/dev/shm/tnt-{job}*") == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("how", ["rank-fails", "ctrl-c", "all-succeed"])
def test_processes_a_rank_started_in_a_session_of_their_own_end_with_the_job(script, how):
    # a rank starts a daemon (a session of its own, as setsid, nohup-style daemons and
    # start_new_session=True make) and one more through a shell that exits at once: neither
    # is in the rank's process group, and both outlived every way a job ends
    path = script("""
        import subprocess
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                  start_new_session=True)
        subprocess.run(["bash", "-c", "setsid sleep 121 & echo SHELLDAEMON $!"])
        print("DAEMON", daemon.pid, flush=True)
        print("UP", os.environ["TNT_JOB_ID"], os.getpid(), flush=True)
        if os.environ["TNT_RANK"] == "1" and sys.argv[1] == "rank-fails":
            sys.exit(5)
        if sys.argv[1] != "all-succeed":
            time.sleep(120)
    """)
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path, how])
    try:
        seen = ""
        if how == "ctrl-c":
            while seen.count(" UP ") < 2:  # "[r] UP ..." once every rank has started its strays
                line = proc.stdout.readline()
                assert line, "tntrun ended before the ranks were up"
                seen += line
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        out = seen + out
        assert proc.returncode == {"rank-fails": 5, "ctrl-c": 130, "all-succeed": 0}[how]
        strays = [int(p) for p in re.findall(r"(?:SHELLDAEMON|DAEMON) (\d+)", out)]
        assert len(strays) == 4, out
        # reaped by tntrun: gone, not zombies
        assert [p for p in strays if psutil.pid_exists(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("nohup", [False, True])
def test_sigusr_is_passed_on_to_every_rank_and_nohup_is_kept(script, nohup):
    # SIGUSR1 (Slurm's warning before the time limit: sbatch --signal=USR1@120) ended tntrun
    # (its default action) and with it the ranks, which never saw it; mpirun and srun pass
    # it on. Under nohup (SIGHUP ignored), tntrun's handler made a hangup stop the job.
    path = script("""
        import signal
        def on_usr1(sig, frame):
            print("GOT USR1", os.environ["TNT_RANK"], flush=True)
            sys.exit(0)
        signal.signal(signal.SIGUSR1, on_usr1)
        print("UP", os.environ["TNT_JOB_ID"], os.getpid(), flush=True)
        time.sleep(120)
        sys.exit(4)
    """)
    ignore_hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], preexec_fn=ignore_hup)
    try:
        _wait_up(proc, 2)
        if nohup:
            proc.send_signal(signal.SIGHUP)  # ignored: the job goes on to get SIGUSR1
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert sorted(re.findall(r"GOT USR1 (\d)", out)) == ["0", "1"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _until_stopped(pids, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_state(pid) != "T" for pid in pids):
        time.sleep(0.05)
    return {pid: _state(pid) for pid in pids}


def _until_continued(pids, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_state(pid) == "T" for pid in pids):
        time.sleep(0.05)
    return {pid: _state(pid) for pid in pids}


def test_ctrl_z_pauses_every_rank_and_fg_resumes_the_job(script, tmp_path):
    # Ctrl+Z (SIGTSTP) stopped tntrun alone: the ranks, in sessions of their own, went on with
    # their output unread. Now every rank stops, then tntrun; SIGCONT to tntrun (fg, bg)
    # continues them, and the job goes on although it was paused for longer than
    # TNT_TIMEOUT_S: rank 0, waiting for rank 1 (computing: it waits for the go file) when
    # both stopped, does not count the pause (the core's waits, pause.c)
    go = tmp_path / "go"
    path = script(f"""
        import numpy as np
        import tarantella as tnt
        x = np.ones(4, np.float32)
        tnt.allreduce(x, name="warm-up")
        print("UP", os.environ["TNT_JOB_ID"], os.getpid(), flush=True)
        if tnt.get_rank() == 1:
            while not os.path.exists({str(go)!r}):
                time.sleep(0.02)
        print("DONE", tnt.get_rank(), tnt.allreduce(x, name="across-the-pause").tolist(), flush=True)
    """)
    # a process group of its own, whose parent (this test) is in another group of the session,
    # as a shell's job: the kernel discards SIGTSTP's stop in an orphaned process group
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], env=runner_env(TNT_TIMEOUT_S="3"),
                        process_group=0)
    try:
        job, pids = _wait_up(proc, 2)
        time.sleep(0.5)  # rank 0 waits in 'across-the-pause'
        proc.send_signal(signal.SIGTSTP)
        states = _until_stopped([proc.pid] + pids)
        assert set(states.values()) == {"T"}, states
        time.sleep(6)  # twice TNT_TIMEOUT_S
        assert {_state(pid) for pid in [proc.pid] + pids} == {"T"}
        proc.send_signal(signal.SIGCONT)
        go.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert sorted(re.findall(r"DONE (\d) \[2.0, 2.0, 2.0, 2.0\]", out)) == ["0", "1"], out
        assert glob.glob(f"/dev/shm/tnt-{job}*") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTTOU, signal.SIGTTIN])
def test_a_background_tntrun_stopped_by_the_terminal_stops_its_ranks(script, sig):
    # `bg` under `stty tostop`: the kernel stops a background job that writes to the terminal
    # with SIGTTOU (one that reads it with SIGTTIN). It stopped tntrun alone, as Ctrl+Z did:
    # the ranks went on, their output unread, until a pipe filled and the others failed at
    # TNT_TIMEOUT_S. They are stopped with it, as by Ctrl+Z, and continued with it
    path = script("""
        print("UP", os.environ["TNT_JOB_ID"], os.getpid(), flush=True)
        time.sleep(60)
    """)
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], env=runner_env(), process_group=0)
    try:
        job, pids = _wait_up(proc, 2)
        proc.send_signal(sig)
        states = _until_stopped([proc.pid] + pids)
        assert set(states.values()) == {"T"}, states
        proc.send_signal(signal.SIGCONT)
        assert "T" not in _until_continued([proc.pid] + pids).values()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ctrl_z_while_a_rank_is_being_started_stops_it_too(monkeypatch):
    # Ctrl+Z handled inside a rank's Popen (tntrun's handler runs in the main thread, which
    # waits there for the child's exec) stopped the ranks whose pids tntrun knew: that rank
    # went on alone while the others and tntrun were stopped, and failed at TNT_TIMEOUT_S
    # waiting for them in its set-up (8 of 30 Ctrl+Z during a start of -n 8). It is stopped
    # too: the pause is taken once its Popen has returned. Here SIGTSTP arrives as the second
    # rank's Popen returns, and tntrun's own stop notes the ranks' states instead
    import_runner()
    from tarantella.runner import supervise

    specs = [supervise.ProcSpec(argv=["sleep", "2"], env=dict(os.environ), label=str(r), rank=r)
             for r in range(3)]
    supervisor = supervise.Supervisor(specs, grace_s=5)
    real_popen, started, seen = supervise.subprocess.Popen, [], {}

    def popen_then_ctrl_z(argv, *args, **kwargs):
        proc = real_popen(argv, *args, **kwargs)
        if argv == ["sleep", "2"]:
            started.append(proc.pid)
            if len(started) == 2:
                os.kill(os.getpid(), signal.SIGTSTP)  # the Supervisor's handler, on this thread
                for _ in range(1000):  # a few bytecodes: the handler runs here
                    pass
        return proc

    def stop_self(signum=None):
        seen["stopped"] = _until_stopped(list(started), timeout=5)

    monkeypatch.setattr(supervise.subprocess, "Popen", popen_then_ctrl_z)
    monkeypatch.setattr(supervisor, "_stop_self", stop_self)
    job = supervisor.run()
    assert len(seen["stopped"]) == 2 and set(seen["stopped"].values()) == {"T"}, seen
    assert job.exit_code == 0 and len(job.results) == 3  # continued, the job goes on


def test_ctrl_z_across_hosts_leaves_the_job_and_tntrun_running(tmp_path):
    # tntrun cannot stop the ranks on other hosts: stopped alone, it left the engine's output
    # unread until the ranks blocked on it. It says so and goes on.
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2\n")
    engine = 'case "$1" in --version) echo "mpirun (Open MPI) 4.1.4";; *) echo ENGINE UP; exec sleep 60;; esac'
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=engine) + os.pathsep + os.environ["PATH"])
    proc = start_tntrun(["--hostfile", str(hosts), "--transport", "mpi", "--", "t.py"], env=env, process_group=0)
    try:
        assert "ENGINE UP" in proc.stdout.readline()
        proc.send_signal(signal.SIGTSTP)
        time.sleep(1.0)
        assert _state(proc.pid) != "T"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGINT, err
        assert "Ctrl+Z (SIGTSTP) does not pause a job across hosts" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ctrl_z_pauses_the_ranks_of_mpirun_on_this_host(tmp_path):
    # --transport mpi on one host (-H localhost:2): mpirun starts the ranks here, in process
    # groups of their own. Ctrl+Z said "does not pause a job across hosts" and the job went
    # on; now mpirun and every process below it stop with tntrun, and go on with it
    engine = ('case "$1" in --version) echo "mpirun (Open MPI) 4.1.4";; *) '
              'for r in 0 1; do setsid sleep 60 & done; echo ENGINE UP; wait;; esac')
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=engine) + os.pathsep + os.environ["PATH"])
    proc = start_tntrun(["-H", "localhost:2", "--transport", "mpi", "--", "t.py"], env=env, process_group=0)
    try:
        assert "ENGINE UP" in proc.stdout.readline()
        below = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(below) >= 3  # mpirun and its two "ranks"
        proc.send_signal(signal.SIGTSTP)
        states = _until_stopped([proc.pid] + below, timeout=10)
        assert set(states.values()) == {"T"}, states
        proc.send_signal(signal.SIGCONT)
        assert "T" not in _until_continued([proc.pid] + below).values()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert "does not pause a job across hosts" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_rank_ignoring_sigterm_is_killed_after_the_grace_period(script):
    path = script("""
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.environ["TNT_RANK"] == "0":
            time.sleep(0.5)
            sys.exit(4)
        time.sleep(120)
    """)
    start = time.monotonic()
    res = run_tntrun(["-n", "2", "--", path], timeout=30)
    assert res.returncode == 4
    assert time.monotonic() - start < 15


def test_stopped_rank_is_killed_at_once_not_after_the_grace_period(tmp_path):
    # a SIGSTOPped rank acts on no SIGTERM: before, the job ended only when the grace period
    # ran out. A long grace period makes "at once" and "after the grace" far apart.
    import_runner()
    from tarantella.runner.supervise import ProcSpec, Supervisor

    pid_file = tmp_path / "frozen.pid"
    frozen = (f"import os, signal; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "os.kill(os.getpid(), signal.SIGSTOP)")
    failing = textwrap.dedent(f"""
        import sys, time
        while True:  # fail once the other rank is frozen
            try:
                pid = int(open({str(pid_file)!r}).read())
                if open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0] == "T":
                    sys.exit(4)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
    """)
    specs = [ProcSpec(argv=[sys.executable, "-c", code], env=dict(os.environ), label=str(r), rank=r)
             for r, code in enumerate([failing, frozen])]
    grace_s = 60
    start = time.monotonic()
    job = Supervisor(specs, grace_s=grace_s).run()
    assert job.exit_code == 4 and job.root_cause is job.results[0]
    assert job.results[1].stopped and job.results[1].returncode == -signal.SIGKILL
    assert time.monotonic() - start < grace_s / 2, "the stopped rank waited for the grace period"


def test_sigcont_to_tntrun_continues_ranks_stopped_by_hand(tmp_path):
    # `kill -CONT` of tntrun (as fg and bg send it) continues every rank: here ranks that were
    # stopped by hand (kill -STOP), which tntrun's continuation left stopped before
    import threading

    import_runner()
    from tarantella.runner.supervise import ProcSpec, Supervisor

    go = tmp_path / "go"
    code = textwrap.dedent(f"""
        import os, time
        open({str(tmp_path)!r} + f"/up-{{os.getpid()}}", "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
    """)
    specs = [ProcSpec(argv=[sys.executable, "-c", code], env=dict(os.environ), label=str(r), rank=r)
             for r in range(2)]
    seen = {}

    def by_hand():
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("up-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [int(p.name[3:]) for p in tmp_path.glob("up-*")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        seen["stopped"] = _until_stopped(pids)
        os.kill(os.getpid(), signal.SIGCONT)  # to tntrun: this process runs the Supervisor
        seen["continued"] = _until_continued(pids)
        for pid in pids:  # whatever happened: the job must end
            os.kill(pid, signal.SIGCONT)
        go.touch()

    helper = threading.Thread(target=by_hand, daemon=True)
    helper.start()
    job = Supervisor(specs, grace_s=1).run()
    helper.join(timeout=30)
    assert set(seen["stopped"].values()) == {"T"}, seen
    assert "T" not in set(seen["continued"].values()), seen
    assert job.exit_code == 0


def test_stop_signal_while_ranks_are_being_started_starts_no_more(monkeypatch):
    # SIGTERM (`timeout 60 tntrun -n 100000 ...`, Ctrl+C) while ranks were still being
    # started was acted on only once every rank had started: for minutes with a large -n.
    # The signal arrives here as the second rank has started
    import_runner()
    from tarantella.runner.supervise import ProcSpec, Supervisor

    specs = [ProcSpec(argv=["sleep", "60"], env=dict(os.environ), label=str(r), rank=r)
             for r in range(6)]
    supervisor = Supervisor(specs, grace_s=30)
    start_one = supervisor._start_one

    def start_then_signal(index, spec):
        proc = start_one(index, spec)
        if index == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the Supervisor, on this thread
        return proc

    monkeypatch.setattr(supervisor, "_start_one", start_then_signal)
    job = supervisor.run()
    assert job.interrupted_by == signal.SIGTERM and job.exit_code == 128 + signal.SIGTERM
    assert [res.spec.rank for res in job.results] == [0, 1], "ranks were started after the signal"
    assert all(res.stopped and res.returncode == -signal.SIGTERM for res in job.results)


def test_the_job_is_recorded_before_its_first_rank_starts(monkeypatch, tmp_path):
    # the record --cleanup reads was written once every rank had started: a tntrun
    # SIGKILLed during a long start-up (many ranks) left its private folder (tnt-run-*) and
    # the shared memory of the ranks it had started, with nothing to find them by. It is now
    # written before the first rank starts, and again with the ranks once they have
    import_runner()
    from tarantella.runner import jobs, local
    from tarantella.runner.supervise import ProcSpec, Supervisor

    monkeypatch.setenv("TNT_STATE_DIR", str(tmp_path / "state"))
    job_id = "5eed" * 8
    private = local.private_tempdir(job_id)
    seen = []
    start_one = Supervisor._start_one

    def start_after_looking(self, index, spec):
        seen.append([(r["job_id"], r["private_dir"], r["ranks"]) for r in jobs.load_all()])
        return start_one(self, index, spec)

    monkeypatch.setattr(Supervisor, "_start_one", start_after_looking)
    specs = [ProcSpec(argv=["true"], env=dict(os.environ), label=str(r), rank=r) for r in range(2)]
    assert local.run(specs, job_id, program="true", command=["true"], private_dir=private) == 0
    assert seen == [[(job_id, private, [])]] * 2  # recorded before rank 0 and rank 1 started
    assert jobs.load_all() == [] and not os.path.exists(private)  # and gone with the job


def test_ranks_end_when_tntrun_is_killed(script):
    path = script(RANK + "\n")
    env = runner_env()
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], env=env)
    job, pids = _wait_up(proc, 2)
    ranks = [psutil.Process(p) for p in pids]
    proc.kill()  # SIGKILL: tntrun cannot stop them; the kernel does (parent-death signal)
    proc.communicate()
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert alive == [], "ranks outlived their tntrun"
    run_tntrun(["--cleanup", "--", path], env=env)  # the job's shared memory and record


def test_parent_death_signal_when_the_launcher_died_before_prctl():
    # the child checks its parent after prctl: if it is no longer the launcher, the launcher
    # died first and no signal would ever come, so the child signals itself
    import_runner()
    from tarantella.runner.supervise import die_with_launcher

    not_the_parent = os.getppid()
    preexec = die_with_launcher(signal.SIGKILL, launcher_pid=not_the_parent)
    child = subprocess.Popen(["sleep", "60"], preexec_fn=preexec)
    try:
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_cleanup_removes_the_temporary_folder_of_ended_jobs_only(script, tmp_path):
    path = script(OUTLIVE + RANK.replace(
        'print("UP"', 'print("DIR", os.path.dirname(os.environ["TNT_ERROR_FILE"]))\nprint("UP"'))
    env = runner_env(TNT_STATE_DIR=str(tmp_path / "state"))  # --cleanup sees these jobs only
    # (--output-on-all-devices: the rank writes into tntrun's pipe, not into ours, so that
    # reading our pipe to its end does not wait for a rank that outlives its tntrun)
    killed = start_tntrun(["-n", "1", "--output-on-all-devices", "--", path], env=env)
    running = start_tntrun(["-n", "1", "--output-on-all-devices", "--", path], env=env)
    try:
        dirs = []
        for proc in (killed, running):
            dirs.append(re.search(r"DIR (\S+)", proc.stdout.readline()).group(1))
            _wait_up(proc, 1)
        assert all(os.path.basename(d).startswith("tnt-run-") and os.path.isdir(d) for d in dirs)
        killed.kill()
        killed.communicate()
        res = run_tntrun(["--cleanup"], env=env, timeout=30)  # every job whose tntrun is gone
        assert res.returncode == 0, res.stderr
        assert not os.path.exists(dirs[0])
        assert f"removed 1 temporary file(s) and folder(s): {dirs[0]}" in res.stdout
        assert os.path.isdir(dirs[1])  # its tntrun still runs
    finally:
        running.kill()
        running.communicate()
        run_tntrun(["--cleanup", "--", path], env=env, timeout=30)
    assert not os.path.exists(dirs[1])


def test_cleanup_kills_a_stopped_leftover(script):
    path = script(OUTLIVE + RANK.replace("time.sleep(120)", "os.kill(os.getpid(), signal.SIGSTOP)")
                  .replace("job = ", "import signal\njob = "), name="frozen_job.py")
    env = runner_env()
    proc = start_tntrun(["-n", "1", "--output-on-all-devices", "--", path], env=env)
    job, pids = _wait_up(proc, 1)
    rank = psutil.Process(pids[0])
    proc.kill()
    proc.communicate()
    res = run_tntrun(["--cleanup", "--", path], env=env, timeout=30)  # no --force
    assert "still running after" not in res.stdout, res.stdout
    gone, alive = psutil.wait_procs([rank], timeout=5)
    assert alive == []


def test_cleanup_after_runner_was_killed(script, tmp_path):
    path = script(OUTLIVE + RANK + "\n", name="leftover_job.py")
    env = runner_env()
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], env=env)
    job, pids = _wait_up(proc, 2)
    proc.kill()  # SIGKILL: tntrun cannot clean up
    proc.communicate()
    assert all(psutil.pid_exists(p) for p in pids)
    assert len(glob.glob(f"/dev/shm/tnt-{job}*")) == 2
    other = run_tntrun(["--cleanup", "--", str(tmp_path / "another.py")], env=env)
    assert "no job of" in other.stdout and all(psutil.pid_exists(p) for p in pids)
    res = run_tntrun(["--cleanup", "--", path], env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    assert job in res.stdout and "2 of 2 process(es) still running" in res.stdout
    assert "sent SIGTERM" in res.stdout and "removed 2 shared-memory" in res.stdout
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=5)
    assert alive == []
    assert glob.glob(f"/dev/shm/tnt-{job}*") == []
    again = run_tntrun(["--cleanup", "--", path], env=env)
    assert "nothing to do" in again.stdout


def test_cleanup_force_kills(script):
    path = script(OUTLIVE + "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + RANK,
                  name="stubborn_job.py")
    env = runner_env()
    proc = start_tntrun(["-n", "1", "--output-on-all-devices", "--", path], env=env)
    job, pids = _wait_up(proc, 1)
    proc.kill()
    proc.communicate()
    res = run_tntrun(["--cleanup", "--force", "--", path], env=env, timeout=30)
    assert "sent SIGKILL" in res.stdout
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE


def test_cleanup_counts_a_dead_rank_that_is_not_reaped_yet_as_gone(tmp_path):
    # what troubleshooting.md's session shows: ranks killed with their tntrun (parent-death
    # signal) are zombies until init reaps them, which a container's init may be slow to
    # do; --cleanup said "2 of 2 process(es) still running" and "sent SIGTERM" to the dead
    import_runner()
    from tarantella.runner import jobs

    zombie = subprocess.Popen(["true"])  # ours, not reaped: a zombie until we wait for it
    try:
        deadline = time.monotonic() + 10
        while not jobs.is_zombie(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jobs.is_zombie(zombie.pid)
        env = runner_env(TNT_STATE_DIR=str(tmp_path / "state"))
        job_id = "0123456789abcdef0123456789abcdef"
        jobs.write({"job_id": job_id, "program": "/nowhere/dead_job.py", "command": ["dead_job.py"],
                    "runner_pid": zombie.pid, "runner_start": jobs.process_start_time(zombie.pid),
                    "ranks": [{"label": "rank 0", "pid": zombie.pid,
                               "start": jobs.process_start_time(zombie.pid)}]},
                   jobs.state_dir(env))
        res = run_tntrun(["--cleanup"], env=env, timeout=30)
        assert res.returncode == 0, res.stderr
        assert f"job {job_id} (dead_job.py, started by tntrun pid {zombie.pid}, gone): " \
               "0 of 1 process(es) still running" in res.stdout, res.stdout
        assert "sent SIG" not in res.stdout, res.stdout
        assert jobs.load_all(jobs.state_dir(env)) == []  # nothing runs: the record is gone
    finally:
        zombie.wait()


def test_cleanup_of_a_running_job_stops_it_through_its_tntrun(script, tmp_path):
    # `tntrun --cleanup -- PROGRAM` while that job still runs signalled its ranks and its
    # tntrun together: a rank's death often reached tntrun first, and the job's terminal read
    # "rank 0 failed: stopping the other processes ... Root cause: ... signal 15 (SIGTERM)",
    # a failure of the program that never was. Its tntrun is signalled first now, and stops
    # the job as on SIGTERM; ranks still running after it are signalled then
    path = script(RANK + "\n", name="running_job.py")
    env = runner_env(TNT_STATE_DIR=str(tmp_path / "state"))
    proc = start_tntrun(["-n", "2", "--output-on-all-devices", "--", path], env=env)
    try:
        job, pids = _wait_up(proc, 2)
        res = run_tntrun(["--cleanup", "--", path], env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "received SIGTERM: stopping every process" in err, err
        assert "failed" not in err and "Root cause" not in err, err
        assert f"sent SIGTERM to its tntrun (pid {proc.pid})" in res.stdout, res.stdout
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                       for p in pids)
        assert glob.glob(f"/dev/shm/tnt-{job}*") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_closed_terminal_stops_the_job_and_tntrun_exits_129(script, tmp_path):
    # tntrun in a terminal that goes away (an ssh session dropped, a closed window) gets
    # SIGHUP. Its message "received SIGHUP: stopping every process" then went to a hung-up
    # terminal (EIO) and raised: tntrun died with exit code 1, its ranks SIGKILLed by their
    # parent-death signal with no grace. And now and then the SIGHUP (sent with a SIGCONT)
    # reached a helper thread of tntrun, whose main thread slept on: the job ran on. Now the
    # ranks are stopped as on SIGTERM, and tntrun exits 129, every time
    import pty

    path = script(RANK + "\n")
    env = runner_env(TNT_STATE_DIR=str(tmp_path / "state"), TMPDIR=str(tmp_path))
    from tntrun_helpers import TNTRUN
    for attempt in range(3):  # the thread that got the signal was a matter of chance
        pid, fd = pty.fork()
        if pid == 0:  # tntrun, the session leader of the terminal, as a login shell's job is
            try:
                os.execve(TNTRUN[0], TNTRUN + ["-n", "2", "--", path], env)
            finally:
                os._exit(127)
        seen, deadline = b"", time.monotonic() + 30
        while not re.search(rb"UP \w+ \d+", seen) and time.monotonic() < deadline:
            try:
                seen += os.read(fd, 1024)  # rank 0's output, on the terminal
            except OSError:
                break
        assert re.search(rb"UP \w+ \d+", seen), seen
        job = re.search(rb"UP (\w+)", seen).group(1).decode()
        time.sleep(0.5)  # rank 1 up too
        os.close(fd)  # the terminal goes away: SIGHUP (and SIGCONT) to tntrun
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done, f"attempt {attempt}: tntrun did not act on the SIGHUP"
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP, attempt
        assert glob.glob(f"/dev/shm/tnt-{job}*") == []
        assert os.listdir(tmp_path / "state" / "jobs") == []
