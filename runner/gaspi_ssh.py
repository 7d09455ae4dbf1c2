"""The `ssh` that gaspi_run calls under tntrun: the real ssh, and a report when it fails.

gaspi_run starts the ranks of every host with `ssh HOST "nohup ssh.spawner ..." &` and never
looks at ssh's exit: when a host cannot be reached (a wrong name, a node that is down, no
key), its ranks never start, and the others wait for them in gaspi_proc_init until
TNT_TIMEOUT_S. tntrun puts this program first on gaspi_run's PATH (engines.gaspi_ssh_shim);
it runs the real ssh, passing everything through, and when a call that starts a host's ranks failed (ssh
exits 255 for its own errors, ssh(1); 127 where the remote spawner is missing), writes a failure record
(rank_report) for the first rank of that host, with ssh's own message, to its stderr, which
is gaspi_run's and so tntrun's. tntrun then ends the job at once, naming the host.

It also keeps the job alive until those ranks end. gaspi_run starts them in a subshell it
never waits for: it ends when rank 0 does, and tntrun then ended the job, ranks of other
hosts still running (one writing its results after the last collective lost them, and
tntrun said the job succeeded). Each starting call holds a shared lock on LOCK while its
ssh runs, and then says so with a line in LOCK.started; tntrun runs gaspi_run under
`--engine LOCK MACHINEFILE`, which, when gaspi_run succeeded, waits until every starting
call has said so (one per host: gaspi_run starts each host's ranks with one call), then for
the exclusive lock: until every host's ranks have ended. Without the first wait a rank 0
that ended at once (a program with no collective) let gaspi_run end before a starting call,
a Python process still starting, had taken its lock, and the job ended without the other
ranks' output.

    python -m tarantella.runner.gaspi_ssh REAL_SSH JOB_ID MACHINEFILE LOCK HOST COMMAND...
    python -m tarantella.runner.gaspi_ssh --engine LOCK MACHINEFILE GASPI_RUN_ARGV...
"""
import fcntl
import itertools
import os
import signal
import subprocess
import sys
import threading
import time

from tarantella.runner import lines, rank_report

SSH_FAILED = 255  # ssh(1): "ssh exits ... with 255 if an error occurred"
TAIL = 4096
# how long the engine waits, after gaspi_run, for starting calls that have not said they
# run: each is one Python start-up; one that never comes (it could not start) is not waited
# for longer
STARTING_CALLS_WAIT_S = 60.0
# how long the engine waits, after gaspi_run failed, for the ranks of the other hosts to end
# (they learn of the failure within a heartbeat or two, TNT_GPI2_HEARTBEAT_S, at their next
# collective); those still running then are stopped by tntrun
FAILED_RANKS_WAIT_S = 5.0


def _lines(machinefile):
    try:
        with open(machinefile) as f:
            return [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return []


def _ranks_on(machinefile, host):
    """The ranks gaspi_run places on `host`: one per line of its machine file, in order."""
    return [r for r, name in enumerate(_lines(machinefile)) if name == host]


def _starting_calls(machinefile):
    """How many ssh calls gaspi_run makes to start ranks: one per run of equal lines of its
    machine file (`uniq -c`), the master's host included."""
    return len([host for host, _ in itertools.groupby(_lines(machinefile))])


def _started(lock):
    try:
        with open(lock + ".started", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def _pass_on(source, fd, tail=None):
    """Copy `source` to `fd` as it comes, until its end (every writer closed it); the last
    TAIL bytes kept in `tail` (a bytearray) where one is given. In whole lines (lines.py):
    the calls of every host write into gaspi_run's same stdout and stderr, and ssh's reads
    cut its ranks' lines anywhere (a line's half, then another host's line)."""
    for chunk in lines.whole_lines(source):
        if tail is not None:
            tail += chunk
            del tail[:-TAIL]
        try:
            while chunk:  # a pipe may take part of it
                chunk = chunk[os.write(fd, chunk):]
        except OSError:
            pass


def _failed_start(code, command):
    """True when this ssh call left the host's ranks unstarted: a call of gaspi_run's
    spawner (ssh.spawner), which always exits 0 once it ran, that did not (255: ssh failed;
    127: no GPI-2 at the same path on that host). Not its other calls: the clean-up
    (`killall`, after a failure), or the start of rank 0 on another host, whose failure
    gaspi_run reports itself ("Failed to start ... on HOST") and whose status may be the
    program's own."""
    return code != 0 and "ssh.spawner" in command and "killall" not in command


def _lock_within(lock, seconds):
    """Wait until no starting call holds LOCK, for at most `seconds` (None: for ever)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    with open(lock, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.05)


def _run_gaspi_run(argv):
    """(exit status, stopped) of gaspi_run, run to its end also when a stop signal came.

    tntrun stops a job by signalling the engine's whole process group: gaspi_run, its rank 0
    and its ssh calls got the signal too. Dying at once (Python's default) ended the job in
    tntrun's eyes at once, and it killed what was left with SIGKILL: no grace for the ranks,
    whose wrappers left their /tmp/tnt-rank-* folders, nor for gaspi_run's own clean-up (its
    trap, after rank 0 ended). Where tntrun itself died (SIGKILL), its parent-death signal
    came to this process alone, which died, and gaspi_run and every rank on every host ran on,
    unseen: once re-parented (tntrun gone), this process stops the group itself, SIGKILL
    after tntrun's grace period (supervise.GRACE_S), as tntrun would have."""
    from tarantella.runner.supervise import GRACE_S, STOP_SIGNALS  # the engine's only: not every ssh call's

    launcher = os.getppid()
    stopping = []
    for sig in STOP_SIGNALS:
        # (the parent-death signal may come before the re-parenting: tntrun's other threads
        # outlive the one that started us by a moment; the loop below looks again)
        signal.signal(sig, lambda signum, frame: stopping.append(time.monotonic()))
    proc = subprocess.Popen(argv)
    orphaned = killed = False
    while True:
        try:
            code = proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        if not orphaned and os.getppid() != launcher:
            orphaned = True
            stopping.append(time.monotonic())
            os.killpg(os.getpgrp(), signal.SIGTERM)  # this process ignores it (the handler)
        elif orphaned and not killed and time.monotonic() - stopping[-1] > GRACE_S:
            killed = True
            os.killpg(os.getpgrp(), signal.SIGKILL)  # this process too: nothing to report to
    if orphaned:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # what the ranks left in the group, as tntrun does
    return code, bool(stopping)


def engine(lock, machinefile, argv):
    """Run gaspi_run; when it succeeded, wait until every starting call holds LOCK or has
    ended, then until none holds it. When it failed (rank 0 failed), wait up to
    FAILED_RANKS_WAIT_S for the ranks of the other hosts to end: a rank there that failed
    first (sys.exit(3) on hostB, whose shutdown made rank 0 fail) writes its record as it
    ends, and tntrun, the engine over, stopped it before: the report blamed rank 0, and
    tntrun exited with its 1."""
    code, stopped = _run_gaspi_run(argv)
    if stopped:
        pass  # tntrun stops the job (or this did, tntrun gone): what is left it kills
    elif code == 0:
        expected = _starting_calls(machinefile)
        deadline = time.monotonic() + STARTING_CALLS_WAIT_S
        while _started(lock) < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        _lock_within(lock, None)
    else:
        _lock_within(lock, FAILED_RANKS_WAIT_S)
    return 128 - code if code < 0 else code


def _streams_apart(words):
    """The remote command of a starting call without the ` 2>&1` that gaspi_run ends it with
    (`ssh HOST "... nohup ssh.spawner ... 2>&1" &`): the ranks' stderr came on ssh's stdout,
    so every rank but rank 0 (which gaspi_run starts itself) wrote its stderr to tntrun's
    stdout: `tntrun ... 2>/dev/null` still showed their tracebacks, and a user parsing stdout
    got them mixed in. Without it ssh keeps the two apart (ssh(1): the remote stderr is its
    stderr), as mpirun does and as on one host."""
    if words and words[-1].rstrip().endswith("2>&1"):
        return [*words[:-1], words[-1].rstrip()[:-len("2>&1")].rstrip()]
    return words


def main(argv):
    if argv[0] == "--engine":
        return engine(argv[1], argv[2], argv[3:])
    real_ssh, job_id, machinefile, lock, host = argv[:5]
    argv = [real_ssh, job_id, machinefile, host, *argv[5:]]
    command = " ".join(argv[4:])
    holder = None
    if "ssh.spawner" in command and "killall" not in command:  # it starts ranks: hold the job open
        holder = open(lock, "a")
        fcntl.flock(holder, fcntl.LOCK_SH)
        with open(lock + ".started", "ab") as said:  # one write (O_APPEND): lines never mix
            said.write(f"{host}\n".encode())
        argv = [*argv[:4], *_streams_apart(argv[4:])]
    try:
        proc = subprocess.Popen([real_ssh, host, *argv[4:]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        code, tail = 127, f"cannot run {real_ssh}: {exc.strerror}".encode()
    else:
        # the ranks' stdout, and their stderr with ssh's own (_streams_apart), passed on until every process
        # holding it has ended, as sshd keeps a session open while anything holds its output:
        # a rank wrapper whose script gaspi_run's clean-up killed is still ending (rank.py
        # --die-with-script), its record still to come, and the lock must be held until then
        ranks_output = threading.Thread(target=_pass_on, args=(proc.stdout.fileno(), 1), daemon=True)
        ranks_output.start()
        tail = bytearray()
        _pass_on(proc.stderr.fileno(), 2, tail)  # ssh's own messages and the ranks' stderr, the last ones kept
        ranks_output.join()
        code = proc.wait()
        code = 128 - code if code < 0 else code  # a signal: as a shell reports it
    if _failed_start(code, command):
        ranks = _ranks_on(machinefile, host)
        said = bytes(tail).decode("utf-8", "replace").strip()
        what = (f"ssh could not reach {host}" if code == SSH_FAILED
                else f"ssh {host} could not run GPI-2's spawner there (exit {code})")
        listed = ", ".join(map(str, ranks)) or "?"
        message = (f"NotStartedError: {what}: rank(s) {listed} were not started. "
                   f"gaspi_run starts the ranks of every host with ssh: check that `ssh {host} "
                   f"true` works without a password, and that GPI-2 is installed at the same "
                   f"path on {host}" + (f" (ssh said: {said.splitlines()[-1]})" if said else ""))
        rank_report.write({
            "rank": ranks[0] if ranks else -1, "local_rank": 0, "host": host, "pid": None,
            "returncode": code, "ended_at": time.time(), "stopped": False, "not_started": True,
            "error": {"message": message, "timestamp": time.time()},
            "stderr_tail": said}, job_id)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
