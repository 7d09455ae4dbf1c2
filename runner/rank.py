"""The rank wrapper that engines start on every host (python -m tarantella.runner.rank).

It reads the placement the engine gives (OpenMPI, MPICH/Hydra, Slurm, GPI-2 variables),
exports it as the TNT_* contract, makes the choices that depend on the host the rank runs
on (its GPU, its NUMA node, whether its stdout is shown), then runs the user's program.

Without --report it replaces itself with the program (exec), so the engine supervises the
program directly. With --report (what tntrun passes) it stays as the program's parent, so
that tntrun, which sees only the engine, learns why a rank failed on whatever host it ran:
- the program's stderr, and its stdout under --output-all, pass through the wrapper (a line
  at a time: lines.py) and the stderr's last lines are kept; the program gets TNT_ERROR_FILE in a private folder on this host;
- signals that stop a job (SIGTERM, SIGINT, SIGHUP, SIGQUIT; also SIGCONT, SIGUSR1, SIGUSR2)
  are passed on to the program; a stop signal before the program ended marks the rank as
  stopped by the engine (not a failure of its own);
- when the program ends, one record (rank, host, pid, exit status, time, stopped, error
  file, stderr tail, how many times it began tnt.init()) goes to stderr as marker lines
  (rank_report.py), which the engine forwards to tntrun; then the wrapper ends as the
  program did: the same exit code, or the same signal (without a core dump of its own), so
  the engine sees what it would have seen. An exit 0 is recorded too: it is a failure where
  a collective of its failed (its error file says "caught"), and a rank that ended before
  it joined the job leaves the others waiting for it in tnt.init() (below);
- the program notes each tnt.init() it begins in a named pipe of the wrapper's
  (TNT_JOIN_NOTES), which the wrapper passes on at once as a small record: tntrun, which
  sees every rank's notes and ends, knows when a rank waits in tnt.init() for one that
  ended without joining (on one host it tells the waiting rank, TNT_LAUNCHER_DIR; across
  hosts it has no way to, and ends the job itself, naming that rank);
- the program dies with the wrapper (parent-death signal SIGKILL);
- with --label (tntrun passes it under gaspi_run, which labels no output, when every rank's
  output is shown), its stdout passes through the wrapper too, and every line of both gets
  the prefix "[RANK] ", as mpirun and srun label their ranks' lines.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from tarantella.common.engine_ranks import ENGINE_VARIABLES, slurm_local_size
from tarantella.runner.engines import SCRIPT_PID
from tarantella.runner import gpus, pinning, rank_report

# --die-with-script: the parent-death signal of the wrapper when the script that started
# it dies (one no program sends), and how long the program may go on ending by itself
SCRIPT_GONE = getattr(signal, "SIGRTMIN", None)  # Linux (as the parent-death signal itself)
SCRIPT_GONE_GRACE_S = 2.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PASSED_SIGNALS = STOP_SIGNALS + (signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2)


def _in_blocks(rank, per_host):
    """(local rank, local size) of `rank` where the hosts hold per_host[0], per_host[1], ...
    ranks, in order (gaspi_run's machine file: rank r on line r)."""
    first = 0
    for count in per_host:
        if rank < first + count:
            return rank - first, count
        first += count
    return None


def placement(environ, per_node=None, size=None, per_host=None):
    """(rank, size, local_rank, local_size) from the engine's variables; a missing local
    rank is derived from `per_host` (the ranks of each host, in order: engines place ranks
    host by host) or `per_node`."""
    for rank_v, size_v, lrank_v, lsize_v in ENGINE_VARIABLES:
        if rank_v in environ:
            rank = int(environ[rank_v])
            total = int(environ.get(size_v) or size or 1)
            per = per_node or total
            # gaspi_run gives no local rank: with uneven hosts (-H a:3,b:1) rank % total made
            # rank 3 local rank 3 of 4 on b, alone there (its GPU, get_local_rank/size)
            blocks = _in_blocks(rank, per_host) if per_host and not (lrank_v and lrank_v in environ) else None
            if blocks:
                return rank, total, blocks[0], blocks[1]
            local_rank = int(environ[lrank_v]) if lrank_v and lrank_v in environ else rank % per
            if lsize_v and lsize_v in environ:
                local_size = int(environ[lsize_v])
            elif rank_v == "SLURM_PROCID" and slurm_local_size(environ):
                local_size = slurm_local_size(environ)
            else:
                local_size = per
            return rank, total, local_rank, local_size
    return 0, size or 1, 0, per_node or 1


class _Child:
    """The program, run as a child whose stderr passes through us (see the module's doc);
    with `label` (b"[3] "), its stdout too, every line of both labelled with it."""

    def __init__(self, command, hide_stdout, env, label=b"", script_pid=None, all_shown=False):
        self.stopped = False
        self.stopped_at = None
        self.proc = None
        self._pending = []
        self.label = label
        for sig in PASSED_SIGNALS:
            signal.signal(sig, self._on_signal)
        from tarantella.runner.supervise import _Forwarder, _Writer, die_with_launcher

        if script_pid is not None and SCRIPT_GONE is not None:  # told when the script that started us dies
            signal.signal(SCRIPT_GONE, self._on_script_gone)
            (die_with_launcher(SCRIPT_GONE, script_pid) or (lambda: None))()

        # stdout through us too when every rank's is shown (--output-all): its lines pass on
        # whole (lines.py), as the stderr's do, or the engine ran the lines of ranks writing
        # at once together. Rank 0's alone, the only one shown, stays the engine's (Open MPI
        # gives it a terminal, where a progress bar redraws itself)
        stdout = (subprocess.DEVNULL if hide_stdout else subprocess.PIPE if label or all_shown
                  else None)
        self.proc = subprocess.Popen(
            command, env=env, stdout=stdout, stderr=subprocess.PIPE,
            preexec_fn=die_with_launcher(signal.SIGKILL))
        for sig in self._pending:  # arrived while the program was being started
            self._pass(sig)
        # passed on in whole lines, labelled or not; the stderr's tail kept
        self.writer = writer = _Writer()
        self._stderr = _Forwarder(self.proc.stderr, 2, True, label, writer, True, whole=True)
        self._readers = [self._stderr]
        if self.proc.stdout is not None:
            self._readers.append(_Forwarder(self.proc.stdout, 1, True, label, writer, False, whole=True))
        for reader in self._readers:
            reader.start()

    @property
    def tail(self):
        return self._stderr.tail

    def _on_signal(self, signum, frame):
        if signum in STOP_SIGNALS and (self.proc is None or self.proc.returncode is None):
            if not self.stopped:
                self.stopped, self.stopped_at = True, time.time()
        if self.proc is None:
            self._pending.append(signum)
        else:
            self._pass(signum)

    def _on_script_gone(self, signum, frame):
        # gaspi_run's clean-up (killall -9 SCRIPT on every host, after a failure or when
        # stopped): the program is stopped with SIGTERM, its grace, as tntrun stops ranks,
        # but only after SCRIPT_GONE_GRACE_S: a program ending by itself at that moment (the
        # rank whose own exit made the others fail) ends with its own status, which the
        # report must name, not with the clean-up's signal
        threading.Thread(target=self._stop_after_grace, daemon=True).start()

    def _stop_after_grace(self):
        from tarantella.runner.supervise import leave_signals_to_the_main_thread

        leave_signals_to_the_main_thread()  # (a threading.Timer's thread did not: see _JoinNotes._read)
        time.sleep(SCRIPT_GONE_GRACE_S)
        self._on_signal(signal.SIGTERM, None)

    def _pass(self, signum):
        try:
            self.proc.send_signal(signum)
        except (ProcessLookupError, OSError):
            pass

    def write_record(self, record, job_id):
        """`record`'s lines to our stderr, each starting a line of its own, between the
        program's writes (what it wrote of a line is ended first)."""
        self.writer.write_lines(2, rank_report.encode(record, job_id))

    def wait(self):
        code = self.proc.wait()
        ended = time.time()
        deadline = time.monotonic() + 5.0  # a grandchild may hold the pipes open: do not hang
        for reader in self._readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
        return code, ended


class _JoinNotes:
    """A named pipe in the wrapper's folder (TNT_JOIN_NOTES) where the program writes one
    line at each tnt.init() it begins (tarantella.common.core). Each is passed on to tntrun
    at once, as a record {"rank", "host", "note": "joining", "joins": N}; `count` is how many
    came. The wrapper holds the pipe open for reading and writing, so that it never reads
    an end of file, and the program's open never fails for want of a reader."""

    END = b"end\n"  # written by the wrapper itself after the program ended: no more notes

    def __init__(self, folder):
        self.path = os.path.join(folder, "joins")
        self.count = 0
        self.fd = None
        self._thread = None
        try:
            os.mkfifo(self.path, 0o600)
            self.fd = os.open(self.path, os.O_RDWR)
        except OSError:  # no named pipes here: the notes are not taken (tntrun learns less)
            self.path = None

    def start(self, on_note):
        if self.fd is not None:
            self._thread = threading.Thread(target=self._read, args=(on_note,), daemon=True)
            self._thread.start()

    def _read(self, on_note):
        from tarantella.runner.supervise import leave_signals_to_the_main_thread

        # A stop signal the kernel handed to this thread (it picks any thread that does not
        # block it) ran the wrapper's handler only once the main thread, asleep in the
        # program's waitpid, next ran Python: when the program ended by itself
        leave_signals_to_the_main_thread()
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line + b"\n" == self.END:
                    return
                self.count += 1
                on_note(self.count)

    def finish(self):
        """Take every note written before the program ended (the pipe keeps their order)."""
        if self._thread is not None:
            try:
                os.write(self.fd, self.END)
            except OSError:
                pass
            self._thread.join(timeout=5.0)
        if self.fd is not None:
            os.close(self.fd)


def _record(rank, local_rank, size, child, code, ended, error_file, started, joins=0):
    from tarantella.runner import report

    return {
        "rank": rank, "local_rank": local_rank, "size": size, "host": socket.gethostname(),
        "pid": child.proc.pid if child else None, "returncode": code, "ended_at": ended,
        "started_at": started, "stopped": bool(child and child.stopped),
        "stopped_at": child.stopped_at if child else None,
        "error": report.read_error_file(error_file),
        "stderr_tail": "\n".join(report.tail_lines(bytes(child.tail))) if child else "",
        "joins": joins,  # the tnt.init() calls it began (_JoinNotes)
    }


def _end_like(code):
    """Exit as the program did: its code, or its signal (no core dump of the wrapper)."""
    if code < 0:
        sig = -code
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these have no handler to reset
            try:
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            except (OSError, ValueError):
                pass
        try:
            os.kill(os.getpid(), sig)
            time.sleep(1.0)  # the signal is delivered meanwhile; if it is ignored, exit
        except OSError:
            pass
        return 128 + sig
    return code


def _supervised(command, rank, local_rank, size, hide_stdout, env, label=False, script_pid=None,
                all_shown=False):
    job_id = env.get("TNT_JOB_ID", "")
    private = tempfile.mkdtemp(prefix=f"tnt-rank-{job_id[:8]}-")
    error_file = os.path.join(private, f"error-rank{rank}.json")
    env["TNT_ERROR_FILE"] = error_file
    notes = _JoinNotes(private)
    if notes.path:
        env["TNT_JOIN_NOTES"] = notes.path
    started = time.time()
    child = None
    try:
        try:
            child = _Child(command, hide_stdout, env, f"[{rank}] ".encode() if label else b"", script_pid,
                           all_shown)
            host = socket.gethostname()
            notes.start(lambda count: child.write_record(
                {"rank": rank, "host": host, "note": "joining", "joins": count}, job_id))
        except OSError as exc:
            message = (f"tntrun (rank {rank} on {socket.gethostname()}): cannot start "
                       f"{command[0]!r}: {exc.strerror}")
            print(message, file=sys.stderr, flush=True)
            record = _record(rank, local_rank, size, None, 127, time.time(), None, started)
            record["stderr_tail"] = message
            rank_report.write(record, job_id)
            return 127
        code, ended = child.wait()
        notes.finish()
        # every end, an exit 0 too: tntrun decides whether it failed (an exit 0 after a
        # collective failed, which the program caught or Python ignored in an atexit handler:
        # tarantella wrote it at exit, marked "caught"), and whether it ended before it joined
        # the job while others wait for it; its stderr's tail is then shown in the report
        child.write_record(_record(rank, local_rank, size, child, code, ended, error_file, started,
                                   notes.count), job_id)
    finally:
        if child is None:
            notes.finish()
        shutil.rmtree(private, ignore_errors=True)
    # only now: a program ended by a signal ends the wrapper by the same signal, and no
    # `finally` would run after that
    return _end_like(code)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="tarantella.runner.rank")
    p.add_argument("--per-node", type=int)
    p.add_argument("--per-host", type=lambda t: [int(x) for x in t.split(",")],
                   help="ranks on each host, in order (hosts that hold different numbers of ranks)")
    p.add_argument("--size", type=int)
    p.add_argument("--output-all", action="store_true")
    p.add_argument("--no-gpu", action="store_true")
    p.add_argument("--ranks-per-gpu", type=int, default=1)
    p.add_argument("--pin-cpu", action="store_true")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--report", action="store_true",
                   help="run the program as a child and report its failure to tntrun")
    p.add_argument("--label", action="store_true",
                   help="with --report: prefix each line of the program's stdout and stderr with "
                        "\"[RANK] \", for an engine that does not label them itself (gaspi_run)")
    p.add_argument("--die-with-script", action="store_true",
                   help="with --report: stop the program (SIGTERM, passed on) when the script that "
                        "started the wrapper dies (gaspi_run's clean-up on every host is `killall -9 "
                        "SCRIPT`); the script exports its pid as " + SCRIPT_PID)
    opts = p.parse_args(argv[:cut])
    command = argv[cut + 1:]
    env = os.environ
    rank, size, local_rank, local_size = placement(env, opts.per_node, opts.size, opts.per_host)
    env.update(TNT_RANK=str(rank), TNT_SIZE=str(size), TNT_LOCAL_RANK=str(local_rank),
               TNT_LOCAL_SIZE=str(local_size))
    if opts.no_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        ids = gpus.detect(env)
        crowded = gpus.crowded(local_size, ids, opts.ranks_per_gpu)
        if crowded and local_rank == 0:
            # tntrun counted the GPUs of its own host; this one may have fewer (or the engine
            # narrowed CUDA_VISIBLE_DEVICES): its ranks then run on CPUs, which is said once
            print(f"tntrun: WARNING: on {socket.gethostname()}, {local_size} ranks are more than "
                  f"{crowded[0]}: running them on CPUs (use --n-per-node "
                  f"{opts.ranks_per_gpu * len(ids)}, {crowded[1]})", file=sys.stderr, flush=True)
        none_named = gpus.none_named(env, ids)
        if none_named and local_rank == 0:  # forwarded from tntrun's host, or set here
            print(f"tntrun: WARNING: on {socket.gethostname()}, {none_named}", file=sys.stderr, flush=True)
        unmatched = gpus.unmatched(env, ids)
        if unmatched and local_rank == 0:
            print(f"tntrun: WARNING: on {socket.gethostname()}, {unmatched}", file=sys.stderr, flush=True)
        if ids:
            # one GPU per rank (or per --ranks-per-gpu ranks), or none for every rank when
            # ranks outnumber the places (a CPU run)
            gpus.rank_gpu_env(env, gpus.gpu_for(local_rank, local_size, ids, opts.ranks_per_gpu))
    if opts.pin_cpu or opts.pin_memory:
        command = pinning.pinned_argv_of(command, opts.pin_cpu, opts.pin_memory, local_size)(local_rank)
    # only the master's output is shown; stderr stays, so errors of any rank reach the engine
    hide_stdout = rank != 0 and not opts.output_all
    if opts.report:
        script_pid = env.pop(SCRIPT_PID, None)
        script_pid = int(script_pid) if opts.die_with_script and script_pid else None
        return _supervised(command, rank, local_rank, size, hide_stdout, dict(env), opts.label, script_pid,
                           opts.output_all)
    if hide_stdout:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"tntrun (rank {rank}): cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
