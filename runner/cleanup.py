"""tntrun --cleanup [--force] [-- PROGRAM]: end what an aborted job left behind.

Jobs are found in the per-user job records (jobs.py), never by matching process names:
a process is signalled only if its pid still has the start time recorded for it, so a
recycled pid is never hit. With PROGRAM, the jobs of that program (same script path) are
ended, whether or not their tntrun still runs; without it, every job whose tntrun is gone.
Ranks get SIGTERM (SIGKILL with --force, and SIGKILL for a stopped process, which would
not act on SIGTERM) on their whole process group; then the job's /dev/shm/tnt-<jobid>*
objects are removed, and once none of its processes runs, its private temporary directory
(tnt-run-*), its engine files and its record.
"""
import glob
import os
import select
import shutil
import signal
import stat
import sys
import tempfile
import time

from tarantella.runner import engines, jobs, shm

WAIT_S = 5.0


def _wait_gone(procs, timeout):
    """Block until the (pid, start) processes are gone or the timeout passes. pidfds make
    this a real wait; without them (old kernels) check a few times a second."""
    deadline = time.monotonic() + timeout
    fds = {}
    if hasattr(os, "pidfd_open"):
        for pid, _ in procs:
            try:
                fds[os.pidfd_open(pid)] = pid
            except OSError:
                pass
    try:
        while True:
            alive = [(pid, st) for pid, st in procs if jobs.running(pid, st)]
            left = deadline - time.monotonic()
            if not alive or left <= 0:
                return alive
            if fds:
                ready, _, _ = select.select(list(fds), [], [], left)
                for fd in ready:
                    fds.pop(fd)
                    os.close(fd)
            else:
                time.sleep(min(0.2, left))
    finally:
        for fd in fds:
            os.close(fd)


def _signal(pid, start, sig, group=True):
    """`group`: the process group `pid` leads, if it leads one (a rank's); not for a tntrun,
    which leads its shell job's group: `tntrun ... | tee log` would lose its tee."""
    if not jobs.same_process(pid, start):
        return False
    if jobs.is_stopped(pid):
        sig = signal.SIGKILL
    try:
        if group and os.getpgid(pid) == pid:  # a rank leads its own group: reach what it started, too
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _leftover_paths(rec):
    """The job's private temporary directory and engine files, as its record names them (a
    record of an older tntrun names no directory: it is found by the job id in its name)."""
    private = rec.get("private_dir")
    job_id = rec.get("job_id", "")
    if private:
        dirs = [private]
    elif len(job_id) >= 8:
        name = f"tnt-run-{glob.escape(job_id[:8])}-*"  # as local.private_tempdir names it
        dirs = glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), name))
    else:
        dirs = []
    # (and the files the engine made elsewhere, that its private folder lists: gaspi_run's)
    return dirs, list(rec.get("files") or []) + [f for d in dirs for f in engines.engine_temp_files(d)]


def _remove_leftovers(rec):
    """Remove what `_leftover_paths` names, if it is still ours (owned by this user, not a
    symbolic link); returns the paths removed."""
    dirs, files = _leftover_paths(rec)
    removed = []
    for path, is_dir in [(d, True) for d in dirs] + [(f, False) for f in files]:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        ours = st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode)
        if not ours or stat.S_ISDIR(st.st_mode) != is_dir:
            continue
        try:
            if is_dir:
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def run(command, force=False, out=None):
    out = out or sys.stdout
    say = lambda text: print(f"tntrun --cleanup: {text}", file=out, flush=True)  # noqa: E731
    key = jobs.program_key(command, os.getcwd()) if command else None
    try:
        records = jobs.load_all()
    except (OSError, jobs.StateDirError) as exc:
        say(f"cannot read the job records: {exc}")
        return 1
    sig = signal.SIGKILL if force else signal.SIGTERM
    found = 0
    for rec in records:
        job_id = rec.get("job_id", "")
        runner_alive = jobs.running(rec.get("runner_pid"), rec.get("runner_start"))
        if key is not None and rec.get("program") != key:
            continue
        if key is None and runner_alive:
            continue  # a healthy job: only named programs are ended while tntrun runs
        found += 1
        ranks = [(r["pid"], r.get("start")) for r in rec.get("ranks", [])]
        alive = [(pid, st) for pid, st in ranks if jobs.running(pid, st)]
        say(f"job {job_id} ({' '.join(rec.get('command', []))}, started by tntrun pid "
            f"{rec.get('runner_pid')}, {'still running' if runner_alive else 'gone'}): "
            f"{len(alive)} of {len(ranks)} process(es) still running"
            + (f" (pids {', '.join(str(p) for p, _ in alive)})" if alive else ""))
        if runner_alive:
            # its tntrun first, and the ranks only once it is gone: tntrun stops them itself,
            # as on Ctrl+C ("received SIGTERM: stopping every process", exit 128 + signal).
            # Signalled together, a rank's death often reached tntrun before its own signal,
            # and the job's terminal read "rank 0 failed ... Root cause: signal 15 (SIGTERM)",
            # a failure of the program that never was
            runner = (rec["runner_pid"], rec.get("runner_start"))
            if _signal(*runner, sig, group=False):
                say(f"sent {sig.name} to its tntrun (pid {runner[0]}), which stops its ranks")
                _wait_gone([runner], WAIT_S)
            alive = [(pid, st) for pid, st in ranks if jobs.running(pid, st)]
        targets = list(alive)
        if targets:
            for pid, st in targets:
                _signal(pid, st, sig)
            say(f"sent {sig.name} to {len(targets)} process(es)")
            left = _wait_gone(targets, WAIT_S)
            if left:
                say(f"{len(left)} process(es) still running after {WAIT_S:g} s (pids "
                    f"{', '.join(str(p) for p, _ in left)}): run again with --force to SIGKILL them")
        removed = shm.remove(job_id)
        if removed:
            say(f"removed {len(removed)} shared-memory object(s): {', '.join(removed)}")
        if not [p for p in ranks + [(rec.get("runner_pid"), rec.get("runner_start"))]
                if jobs.running(*p)]:
            removed = _remove_leftovers(rec)
            if removed:
                say(f"removed {len(removed)} temporary file(s) and folder(s): {', '.join(removed)}")
            jobs.remove(job_id)
    if not found:
        what = f"of {command[0]}" if command else "whose tntrun is gone"
        say(f"no job {what} found; nothing to do")
    return 0
