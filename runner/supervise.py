"""Start a job's processes and supervise them until the job ends.

Used for local ranks (one process per rank) and for an engine's launcher
(mpirun/srun/gaspi_run: one process that owns the remote ranks) alike.

How the job ends:
- every process exits 0: exit 0, unless a rank's error file says that a collective of its
  failed and its program went on (caught the error, or Python ignored it in an atexit
  handler): that rank failed all the same (failed()), and the exit code is 1;
- the first process to exit non-zero (or by a signal) on its own is the root cause: every
  other process group gets SIGTERM, then SIGKILL after a grace period (at once for a stopped
  process, which would not act on SIGTERM), and the job's exit code is that process's code
  (128 + signal for a signal, as srun and shells report it). A process that failed because
  another one did (a rank raising PeerLostError after a peer aborted) is not: the others get
  the grace period to end on their own first, so that the rank that failed first (it aborted
  the others, then exits) is named and not stopped while it reports its error;
- SIGINT/SIGTERM/SIGHUP/SIGQUIT to tntrun stops every process the same way (a second one
  kills at once) and the exit code is 128 + that signal;
- SIGUSR1/SIGUSR2 to tntrun are passed on to every rank (or to the engine, which passes
  them on to its ranks), and the job goes on;
- SIGTSTP (Ctrl+Z) stops every rank's process group (SIGSTOP), then tntrun itself, as the
  shell expects of a job (SIGTTOU and SIGTTIN too: a background tntrun that writes to the
  terminal under `stty tostop`); once tntrun is continued (fg, bg, SIGCONT) so are the ranks. The
  core does not count the pause against TNT_TIMEOUT_S. Across hosts tntrun cannot stop the
  ranks: it says so and goes on (the job too).

Each process runs in its own session (so its process group holds everything it starts,
and Ctrl+C in a terminal reaches only tntrun, which then stops the ranks in order). One
thread per process blocks in waitpid and posts the exit to a queue.SimpleQueue, whose
put() is reentrant and therefore safe from a signal handler; the main thread blocks on
that queue. Nothing polls.

A process must not outlive a tntrun that was killed (SIGKILL cannot be caught, so tntrun
cannot stop anything then): each one is started with a parent-death signal (see
die_with_launcher), which the kernel sends when the thread that started it exits. So
Supervisor.run must run on a thread that lives as long as the job: tntrun's main thread.
"""
import ctypes
import dataclasses
import errno
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from tarantella.common.startup_log import mark
from tarantella.runner import jobs
from tarantella.runner import lines as whole_lines

TAIL_BYTES = 64 * 1024  # what is kept of each process's stderr for the failure report
# SIGQUIT (Ctrl+\) too: by default it would end tntrun alone, leaving its temporary folder
# and job record, and its ranks killed by the parent-death signal with no report
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
GRACE_S = 3.0  # between a stop signal and SIGKILL, for a stopped process to end by itself
# passed on to the job, which goes on (see Supervisor._forward): by default they would end
# tntrun as SIGQUIT would
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# Ctrl+Z and the continuation (fg, bg, kill -CONT): the whole job pauses and goes on
# (Supervisor._pause, _resume); by default Ctrl+Z stopped tntrun alone. SIGTTOU and SIGTTIN
# stop a background job that writes to the terminal (stty tostop) or reads it: the same
STOPPING_SIGNALS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
PAUSE_SIGNALS = STOPPING_SIGNALS + (signal.SIGCONT,)
# The rank wrapper's (rank.py) parent-death signal, which it handles too (SCRIPT_GONE there): the
# helper threads block it as well. tntrun does not handle it; blocked in its helpers, it still
# reaches its main thread.
_SCRIPT_GONE = (signal.SIGRTMIN,) if hasattr(signal, "SIGRTMIN") else ()


@dataclasses.dataclass
class ProcSpec:
    """One process to start: a rank, or an engine launcher owning many ranks."""
    argv: list
    env: dict
    label: str                    # "0", "1", ... or "mpirun"
    rank: object = None           # int for a rank, None for an engine launcher
    local_rank: object = None
    host: str = ""
    show_stdout: bool = True
    show_stderr: bool = True
    prefix: bool = False          # prefix every forwarded line with "[label] "
    stdin: bool = False           # inherit tntrun's stdin (rank 0 only), else /dev/null
    error_file: object = None     # TNT_ERROR_FILE of this process, read for the report
    cwd: object = None
    stderr_filter: object = None  # feed(bytes) -> bytes to show, flush() -> bytes: takes
                                  # the ranks' failure records out of an engine's stderr
    stdout_filter: object = None  # the same for its stdout (gaspi_run's ssh commands end
                                  # in 2>&1, which gaspi_ssh.py takes off: a safeguard)
    stop_signal: int = signal.SIGTERM  # the first signal when the job is stopped (srun: SIGINT,
                                       # which it passes on; on SIGTERM it SIGKILLs its tasks)
    on_this_host: bool = False    # an engine launcher whose ranks all run on this host
                                  # (--transport mpi, -H localhost:N): Ctrl+Z pauses them


@dataclasses.dataclass
class ProcResult:
    spec: ProcSpec
    pid: int
    returncode: object = None     # Popen convention: -N for signal N
    ended_at: float = 0.0
    stopped: bool = False         # ended by a signal that tntrun sent
    stderr_tail: bytes = b""
    error: object = None          # the rank's error record, when it came another way than
                                  # spec.error_file (from a rank on another host)


@dataclasses.dataclass
class JobResult:
    results: list
    root_cause: object = None     # the ProcResult that failed first on its own, if any
    interrupted_by: object = None  # signal number that stopped tntrun, if any
    started_at: float = 0.0
    engine: object = None         # across hosts: the engine's ProcResult, when `results`
                                  # are the ranks it ran (their records, from their hosts)
    stopped_by: str = "tntrun"    # who stopped the ranks that are marked `stopped`
    stalled: object = None        # why tntrun stopped processes that had not failed (an
                                  # engine that did not end the job after a rank failed)

    @property
    def exit_code(self):
        if self.root_cause is not None:
            # 1 for a rank that exited 0 after a collective of its failed (see failed())
            return exit_code_of(self.root_cause.returncode) or 1
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return 0


class LaunchError(Exception):
    """A process could not be started (program or interpreter not found, not executable)."""


PR_SET_PDEATHSIG = 1  # prctl(2)
PR_SET_CHILD_SUBREAPER = 36


def death_signal(spec):
    """The signal a process gets when tntrun dies. A rank gets SIGKILL: with tntrun gone no
    one would send SIGKILL after a grace period, so a rank that ignores or handles SIGTERM, or
    that is stopped, would otherwise live on. An engine launcher (mpirun, srun, gaspi_run)
    gets SIGTERM: it then stops its ranks on every host, which it cannot do when killed."""
    return signal.SIGKILL if spec.rank is not None else signal.SIGTERM


def die_with_launcher(sig, launcher_pid=None):
    """A Popen preexec_fn (it runs in the child, between fork and exec) that makes the kernel
    send `sig` to the child when its parent thread exits (prctl PR_SET_PDEATHSIG, Linux).
    If the launcher died before prctl took effect, the child has a new parent already and no
    signal would ever come: it sends `sig` to itself. None where prctl is not available."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    launcher_pid = os.getpid() if launcher_pid is None else launcher_pid

    def preexec():
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != launcher_pid:
            os.kill(os.getpid(), sig)

    return preexec


def adopt_orphans():
    """Make this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux): a process
    below it whose parent exits is re-parented to it, not to init. A rank's process group
    does not hold what the rank started in a session or group of its own (setsid, a daemon,
    `start_new_session=True`), and once that process's parent has exited nothing else
    leads to it: as tntrun's child it can be found and ended with the job. True if set."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                          ctypes.c_ulong]
        return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_code_of(returncode):
    return 128 - returncode if returncode < 0 else returncode


def leave_signals_to_the_main_thread():
    """Called first in each helper thread: the signals tntrun handles are blocked in it, so
    that the kernel delivers them to the main thread. Python runs a handler in the main
    thread only, when that thread runs; a signal delivered to a helper (the kernel picks any
    thread that does not block it, e.g. when the main thread already has one pending: a
    terminal that closes sends SIGHUP and SIGCONT at once) left the main thread asleep in
    its wait for the next event, and tntrun did not act on it: the job ran on with its
    terminal gone, about one time in three."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS + FORWARDED_SIGNALS + PAUSE_SIGNALS
                               + _SCRIPT_GONE)
    except (AttributeError, OSError, ValueError):
        pass


def tell(text):
    """One message of tntrun's own on its stderr. When that is gone (the terminal closed:
    a write to a hung-up terminal fails with EIO; a reader of a pipe that went away), the
    message is dropped and stderr pointed at /dev/null: the SIGHUP of a closed terminal made
    tntrun's "received SIGHUP: stopping every process" raise in the middle of stopping the
    job, and tntrun died with exit code 1 (a traceback nobody saw), its ranks SIGKILLed by
    their parent-death signal without their grace period, instead of stopping them and
    exiting 129."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


class _Writer:
    """Serialises whole writes of forwarded output onto tntrun's own stdout/stderr."""

    def __init__(self):
        self._lock = threading.Lock()
        self.broken = set()
        self.reader_gone = set()  # fds whose reader went away (EPIPE): `tntrun -l ... | head`
        self._mid_line = set()  # fds whose last write did not end a line

    def write(self, fd, data):
        with self._lock:
            self._write(fd, data)

    def write_lines(self, fd, lines):
        """Whole lines (bytes ending in a newline), each written at once, the first at the
        start of a line: a line the others left unfinished is ended first."""
        with self._lock:
            if fd in self._mid_line:
                self._write(fd, b"\n")
            for line in lines:
                self._write(fd, line)

    def _write(self, fd, data):
        if fd in self.broken or not data:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:  # a terminal hung up, or our reader went away (`| head`): stop writing
            self.broken.add(fd)
            if e.errno == errno.EPIPE:
                self.reader_gone.add(fd)
            return
        if data.endswith(b"\n"):
            self._mid_line.discard(fd)
        else:
            self._mid_line.add(fd)


class _Forwarder(threading.Thread):
    """Drains one pipe of one process (blocking reads): forwards it when shown, with a
    "[label] " prefix per line when asked, and keeps its tail for the failure report.
    A hidden process's pipe is drained all the same, or it would block when the pipe fills."""

    def __init__(self, pipe, out_fd, show, prefix, writer, keep_tail, filt=None, whole=False):
        super().__init__(daemon=True)
        self.pipe, self.out_fd, self.show, self.writer = pipe, out_fd, show, writer
        self.prefix = prefix
        # without a prefix: whole lines, a line begun waiting for its end a moment (lines.py)
        self.whole = whole
        self.keep_tail = keep_tail
        self.filter = filt
        self.tail = bytearray()

    def _labelled(self, line):
        """`line` (without its newline) with the prefix, also after every carriage return in
        it: a progress bar (tqdm, a Keras progress bar on a terminal) redraws its line after
        a \\r, and a terminal then showed the last drawing over the prefix, so that the line
        read "step 9/10" without its rank. A \\r that ends the line (\\r\\n) stays as it is."""
        body, end = (line[:-1], b"\r") if line.endswith(b"\r") else (line, b"")
        return self.prefix + body.replace(b"\r", b"\r" + self.prefix) + end

    def run(self):
        leave_signals_to_the_main_thread()
        fd = self.pipe.fileno()
        pending = bytearray()
        pieces = whole_lines.whole_lines(fd) if self.whole and not self.prefix else None
        while True:
            if pieces is not None:
                chunk = next(pieces, b"")
            else:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    chunk = b""
            if not chunk and self.filter is not None:
                chunk, self.filter = self.filter.flush(), None  # what it held back
                if not chunk:
                    break
            elif not chunk:
                break
            elif self.filter is not None:
                chunk = self.filter.feed(chunk)
                if not chunk:
                    continue
            if self.keep_tail:
                self.tail += chunk
                del self.tail[:-TAIL_BYTES]
            if not self.show:
                continue
            if self.prefix:
                # whole lines only, so that lines of different ranks never mix
                # the start of a line is kept in a bytearray, to which a chunk without a
                # newline is appended in place: `pending + chunk` copied the whole line for
                # every 64 KiB read, so a line without its end (a tqdm bar redrawn after \r
                # for a whole training, binary output) cost time quadratic in its length:
                # 32 MiB took 8 s, 256 MiB over 2 minutes, and the rank blocked on its pipe
                cut = chunk.rfind(b"\n")
                if cut < 0:
                    pending += chunk
                    continue
                lines = (bytes(pending) + chunk[:cut]).split(b"\n")
                pending = bytearray(chunk[cut + 1:])
                if lines:
                    self.writer.write(self.out_fd, b"".join(self._labelled(ln) + b"\n" for ln in lines))
            else:
                self.writer.write(self.out_fd, chunk)
            if self.out_fd in self.writer.reader_gone:
                # what the process writes has no reader any more: nor has its pipe from now on,
                # so that its next write fails as it would on our stdout itself (a program
                # piped into `head` ends with EPIPE or SIGPIPE), instead of the job running to
                # its end unread and tntrun exiting 0
                break
        if self.show and pending:
            self.writer.write(self.out_fd, self._labelled(bytes(pending)) + b"\n")
        self.pipe.close()


def _cannot_start(program, exc, cwd=None):
    """What went wrong when `program` could not be executed, and what to do: every OSError of
    exec(2) is a LaunchError (exit 127 with one line), not a traceback of tntrun's own."""
    where = os.path.join(cwd or os.getcwd(), program)
    if exc.errno == errno.ENOENT:
        if os.sep not in program and os.path.isfile(where):
            # exec searches PATH only, as a shell does: a file in the current directory
            # is not found under its bare name
            return (f"cannot start {program!r}: no such command on PATH; the current directory "
                    f"has a file of that name: write ./{program}")
        return (f"cannot start {program!r}: no such file or command. Check the program name, "
                "or --python-interpreter (use --python-interpreter \"\" to run PROGRAM as an executable)")
    if exc.errno == errno.EACCES and os.path.isdir(where):
        return f"cannot start {program!r}: it is a directory, not a program"
    if exc.errno == errno.EACCES:
        return (f"cannot start {program!r}: permission denied. Make it executable "
                f"(chmod +x {program}) or run it through an interpreter with --python-interpreter")
    if exc.errno == errno.ENOEXEC:
        # a script without a `#!` line: a shell would run it with itself, exec(2) cannot
        return (f"cannot start {program!r}: not a format this system can execute (Exec format "
                "error). A script needs a first line such as #!/bin/bash, or run it through its "
                "interpreter: --python-interpreter bash")
    return f"cannot start {program!r}: {exc.strerror or exc}"


def _no_error_file(res):
    return False, None


class Supervisor:
    """Runs `specs` until the job ends (see the module's docstring).

    error_of(result) -> (lost_peer, raised_at, ...) tells, after a process failed, whether its
    failure was caused by another process's (a rank that raised PeerLostError because a peer
    died or aborted) and when it raised (None if unknown); report.error_of reads the error
    files, and its fifth answer says that a process that exited 0 failed (see failed()). It
    decides the root cause."""

    def __init__(self, specs, grace_s=GRACE_S, on_started=None, on_stopping=None, on_ended=None,
                 error_of=_no_error_file, adopt=False):
        self.specs = specs
        # end what the processes started and left behind outside their process groups
        # (adopt_orphans); only for a process that is tntrun, not one that runs a
        # Supervisor among other work (a test), whose other children it would take for them
        self.adopt = adopt
        self._own_children = set()  # this process's children from before the job
        self.grace_s = grace_s
        self.error_of = error_of
        self._stopped_at = None  # when tntrun began to stop processes
        self.on_started = on_started      # called with the list of Popen objects
        self.on_stopping = on_stopping    # called with a reason string (and routine=) when the job is ended early
        self.on_ended = on_ended          # called with (spec, returncode) as each process ends
        self._events = queue.SimpleQueue()
        self._signalled = False  # a stop signal arrived: start no more processes
        # a process is being started (_start_one): its pid is not known until Popen returns,
        # so Ctrl+Z then waits for it (_pause_due) rather than leave it running alone
        self._starting = False
        self._pause_due = None  # the stop signal to act on
        self._procs = []
        self._forwarders = []
        self._writer = _Writer()

    # -- starting ---------------------------------------------------------------------------
    def _start_one(self, index, spec):
        stdout = None
        if spec.prefix or not spec.show_stdout or spec.stdout_filter is not None:
            stdout = subprocess.PIPE if spec.show_stdout or spec.stdout_filter is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                spec.argv, env=spec.env, cwd=spec.cwd,
                stdin=None if spec.stdin else subprocess.DEVNULL,
                stdout=stdout, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True,
                preexec_fn=die_with_launcher(death_signal(spec)),
            )
        except OSError as exc:
            raise LaunchError(_cannot_start(spec.argv[0], exc, spec.cwd)) from exc
        mark(f"tntrun: started rank {spec.label}", label="tntrun")
        label = spec.label.encode()
        prefix = b"[" + label + b"] " if spec.prefix else b""
        if proc.stdout is not None:
            self._forwarders.append(_Forwarder(proc.stdout, 1, spec.show_stdout, prefix, self._writer, False,
                                               spec.stdout_filter))
        err = _Forwarder(proc.stderr, 2, spec.show_stderr, prefix, self._writer, True,
                         spec.stderr_filter)
        self._forwarders.append(err)
        proc._tnt_stderr = err
        waiter = threading.Thread(target=self._wait, args=(index, proc), daemon=True)
        self._procs.append(proc)
        for thread in self._forwarders[-2 if proc.stdout is not None else -1:]:
            thread.start()
        waiter.start()
        return proc

    def _wait(self, index, proc):
        leave_signals_to_the_main_thread()
        proc.wait()  # blocking waitpid, no polling
        if self.on_ended:
            self.on_ended(self.specs[index], proc.returncode)  # here: at once, not after the loop's turn
        self._events.put(("exit", index, time.time()))

    def _on_signal(self, signum, frame):
        self._signalled = True
        self._events.put(("signal", signum, time.time()))

    def _forward(self, signum, frame):
        """SIGUSR1/SIGUSR2 are for the program, as mpirun and srun treat them: Slurm sends one
        before a job's time limit (sbatch --signal=USR1@120, scancel --signal=USR1) so that
        the ranks checkpoint. Each rank gets it, its main process only (not its group: a
        worker process without a handler would die of it), or the engine does (mpirun,
        srun and Hydra pass them on to their ranks; gaspi_run, a shell script, would die of
        it). Python runs this handler in the main thread, between bytecodes: kill is safe."""
        for proc, spec in zip(list(self._procs), self.specs):
            if proc.returncode is not None:
                continue  # reaped: its pid may be another process's now
            if spec.rank is None and spec.label == "gaspi_run":
                tell(f"tntrun: WARNING: {signal.Signals(signum).name} not passed on: gaspi_run "
                     "does not forward signals to its ranks")
                continue
            try:
                os.kill(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _pause(self, signum, frame):
        """Ctrl+Z: the job pauses, as a job of the shell does. The ranks run in sessions of
        their own, where the terminal's SIGTSTP does not reach them: each running rank's
        process group (the rank and what it started) gets SIGSTOP, then tntrun stops itself
        with SIGTSTP's default action, so that the shell sees the job stopped. When tntrun
        goes on (fg, bg, kill -CONT), so do the ranks. Before, tntrun alone stopped: the ranks
        went on, their output unread, and failed once a pipe filled."""
        if any(spec.rank is None and not spec.on_this_host for spec in self.specs):
            if signum != signal.SIGTSTP:
                # the kernel stops a background tntrun that writes to the terminal (stty
                # tostop) with SIGTTOU, and sends it again at each write until it is stopped
                self._stop_self(signum)
                return
            # mpirun, srun, gaspi_run: tntrun cannot reach the ranks on the other hosts, and a
            # stopped tntrun would leave the engine's output unread until the ranks block on it
            tell("tntrun: Ctrl+Z (SIGTSTP) does not pause a job across hosts: it goes on, and so does "
                 "tntrun (Ctrl+C stops it)")
            return
        if self._stopped_at is not None:
            return  # the job is being ended: its ranks get no SIGSTOP, which only SIGKILL would end
        if self._starting:
            # a rank is being started, its pid not yet known (this handler runs in the main
            # thread, inside its Popen): the start loop pauses once it is (run)
            self._pause_due = signum
            return
        paused = [i for i, proc in enumerate(self._procs) if proc.returncode is None]
        for i in paused:
            self._signal_group(i, signal.SIGSTOP)
            self._signal_below(i, signal.SIGSTOP)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            self._stop_self(signum)
        finally:
            self._resume(signal.SIGCONT, None)

    def _stop_self(self, signum=signal.SIGTSTP):
        """Stop tntrun as `signum` stops a program (its default action, so that the shell says
        "Stopped"); returns once it is continued (at once where the kernel discards the
        signal: a process group without a shell to continue it)."""
        previous = signal.signal(signum, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signum)
        finally:
            signal.signal(signum, previous)

    def _resume(self, signum, frame):
        """SIGCONT to tntrun (the shell's fg or bg, kill -CONT): every rank's process group
        goes on, those that Ctrl+Z stopped and those stopped by hand alike."""
        for i, proc in enumerate(list(self._procs)):
            if proc.returncode is None:  # reaped: its pid may be another process's now
                self._signal_below(i, signal.SIGCONT)
                self._signal_group(i, signal.SIGCONT)

    def _signal_below(self, index, sig):
        """An engine on this host (mpirun -H localhost:N): its ranks run in process groups of
        their own (Open MPI's setpgid), which its group's signal does not reach."""
        if self.specs[index].rank is None and self.specs[index].on_this_host:
            for pid, start in jobs.descendants(self._procs[index].pid):
                if jobs.same_process(pid, start):
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass

    def stall_after(self, reason, seconds):
        """Stop the job if it has not ended `seconds` from now (any thread): across hosts a
        rank reported its failure, and the engine must end the job, but may not (mpirun
        waits for a daemon on a host that was cut off, gaspi_run for ranks that hang).
        `reason` says why, in tntrun's message and the report."""
        self._events.put(("stall", (reason, seconds), time.time()))

    # -- running ----------------------------------------------------------------------------
    def run(self):
        started_at = time.time()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS + FORWARDED_SIGNALS + PAUSE_SIGNALS:
                if signal.getsignal(sig) == signal.SIG_IGN:
                    # ignored by whoever started tntrun (`nohup tntrun ...` for SIGHUP, a
                    # shell's background job for SIGINT and SIGQUIT): that holds for the job,
                    # as for any program; the ranks inherit it
                    continue
                handler = (self._on_signal if sig in STOP_SIGNALS else self._forward if sig in FORWARDED_SIGNALS
                           else self._pause if sig in STOPPING_SIGNALS else self._resume)
                previous[sig] = signal.signal(sig, handler)
        results = []
        job = JobResult(results=results, started_at=started_at)
        sys.stdout.flush()
        sys.stderr.flush()
        if self.adopt:
            self.adopt = adopt_orphans()
            self._own_children = {pid for pid, _ in _children(os.getpid())}
        try:
            for index, spec in enumerate(self.specs):
                if self._signalled:
                    # Ctrl+C or SIGTERM while ranks are still being started (many ranks, a
                    # slow machine): the main loop below stops those started so far, now;
                    # before, every rank was started first (-n 100000: minutes)
                    break
                self._starting = True
                try:
                    self._start_one(index, spec)
                except LaunchError:
                    self._starting, self._pause_due = False, None
                    self._stop(set(range(len(self._procs))), results_by_index={})
                    raise
                finally:
                    self._starting = False
                if self._pause_due is not None:
                    # Ctrl+Z came while this rank was being started (the Popen's fork and
                    # exec): the pause is taken now that its pid is known. Before, the rank
                    # went on while the others were stopped, and failed at TNT_TIMEOUT_S
                    # waiting for them in its set-up
                    signum, self._pause_due = self._pause_due, None
                    self._pause(signum, None)
            # only the processes started (fewer than specs after a stop signal)
            results.extend(ProcResult(spec, p.pid) for spec, p in zip(self.specs, self._procs))
            if self.on_started:
                self.on_started(self._procs)
            running = set(range(len(self._procs)))
            settle_until = None  # set by a failure caused by a peer: wait for that peer
            stall = None  # (reason, monotonic deadline) of stall_after
            while running:
                ends = [t for t in (settle_until, stall and stall[1]) if t is not None]
                timeout = max(min(ends) - time.monotonic(), 0) if ends else None
                try:
                    kind, value, when = self._events.get(timeout=timeout)
                except queue.Empty:
                    if stall and time.monotonic() >= stall[1] and (settle_until is None or settle_until > stall[1]):
                        job.stalled = stall[0]
                    break  # no process failed on its own in time: stop the rest
                if kind == "signal":
                    job.interrupted_by = value
                    break
                if kind == "stall":
                    deadline = time.monotonic() + value[1]
                    if stall is None or deadline < stall[1]:  # the most urgent one
                        stall = (value[0], deadline)
                    continue
                running.discard(value)
                res = results[value]
                res.returncode, res.ended_at = self._procs[value].returncode, when
                if res.returncode == 0:
                    # (even one that failed(): it caught its collective's error, and others
                    # may still be saving what they can; it counts at the end)
                    continue
                if not self.error_of(res)[0]:
                    break  # failed on its own: the job ends now
                # it failed because another process did (that one aborted, then exits):
                # give the others a grace period to end on their own, so that the one that
                # failed first is not stopped before it has written its error
                if settle_until is None:
                    settle_until = time.monotonic() + self.grace_s
            job.root_cause = self._root_cause(results)
            if running:
                reason = (f"received {signal.Signals(job.interrupted_by).name}: stopping every process"
                          if job.interrupted_by else f"{job.stalled}: stopping it" if job.stalled else
                          f"{_who(job.root_cause.spec)} failed: stopping the other processes")
                if self.on_stopping:
                    # routine: a rank failed (the report follows), not a signal or a stalled engine
                    self.on_stopping(reason, routine=not (job.interrupted_by or job.stalled))
                self._stop(running, {i: results[i] for i in running})
                job.root_cause = self._root_cause(results)
        finally:
            self._kill_leftovers()
            self._kill_orphans()
            for thread in self._forwarders:
                thread.join(timeout=2.0)  # a grandchild that escaped its group may hold a pipe
            for proc, res in zip(self._procs, results):
                res.stderr_tail = bytes(proc._tnt_stderr.tail)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return job

    def _root_cause(self, results):
        return root_cause(results, self.error_of, lambda res: self._stopped_at)

    def _signal_group(self, index, sig):
        try:
            os.killpg(self._procs[index].pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop(self, running, results_by_index):
        """SIGTERM every running process group, SIGKILL what is left after the grace period
        (at once on a second interrupt), and record how each one ended. A stopped process
        (SIGSTOP, a debugger) would only act on SIGTERM once continued, that is after the
        grace period: its group gets SIGKILL at once."""
        self._stopped_at = time.time()
        # an engine stopped while its job hangs (mpirun waiting for a host that was cut off)
        # leaves its ssh children behind, in groups of their own: they are ended with it
        below = [p for i in running if self.specs[i].rank is None for p in jobs.descendants(self._procs[i].pid)]
        for i in running:
            frozen = jobs.is_stopped(self._procs[i].pid)
            self._signal_group(i, signal.SIGKILL if frozen else self.specs[i].stop_signal)
            if i in results_by_index:
                results_by_index[i].stopped = True
        deadline = time.monotonic() + self.grace_s
        killed = False
        while running:
            timeout = deadline - time.monotonic()
            if timeout <= 0 and not killed:
                for i in running:
                    self._signal_group(i, signal.SIGKILL)
                killed = True
                deadline = time.monotonic() + 10.0  # SIGKILL cannot be ignored: this is a backstop
                continue
            try:
                kind, value, when = self._events.get(timeout=max(timeout, 0.01))
            except queue.Empty:
                if killed:
                    break  # uninterruptible sleep (D state): give up waiting, do not hang
                continue
            if kind == "signal":
                deadline = time.monotonic()  # second Ctrl+C: kill now
                continue
            running.discard(value)
            if value in results_by_index:
                res = results_by_index[value]
                res.returncode, res.ended_at = self._procs[value].returncode, when
        _kill_each(below)

    def _kill_leftovers(self):
        """Anything still alive in a rank's process group (a child the rank started and left
        behind) is killed: a job leaves no process behind. Groups that are empty are skipped
        by the kernel (ESRCH)."""
        for i in range(len(self._procs)):
            self._signal_group(i, signal.SIGKILL)

    def _kill_orphans(self):
        """With `adopt`: every process that was re-parented to tntrun during the job (a
        process a rank started in a session of its own, whose parent has exited), and all
        below it, is killed and reaped. Those still below a living parent were in a rank's
        group (killed by _kill_leftovers) or below an engine (killed by _stop); killing an
        orphan re-parents its own children to tntrun in turn, hence a few rounds."""
        if not self.adopt:
            return
        started = {p.pid for p in self._procs}
        for _ in range(5):
            adopted = [(pid, start) for pid, start in _children(os.getpid())
                       if pid not in started and pid not in self._own_children]
            strays = adopted + [d for pid, _ in adopted for d in jobs.descendants(pid)]
            alive = [(pid, start) for pid, start in strays if not jobs.is_zombie(pid)]
            _kill_each(alive)
            for pid, _ in adopted:
                if jobs.state_of(pid) == b"D":
                    continue  # uninterruptible: never wait for it (init reaps it after us)
                try:
                    os.waitpid(pid, 0)  # ours now: reap it (SIGKILLed, it ends at once)
                except ChildProcessError:
                    pass
            if not alive:
                break


def _kill_each(processes):
    """SIGKILL each (pid, start time) that is still that process (a pid reused since is left alone)."""
    for pid, start in processes:
        if jobs.same_process(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _children(pid):
    """[(pid, start time)] of the direct children of `pid`."""
    return [(child, start) for child, start in jobs.descendants(pid)
            if jobs.parent_of(child) == pid]


def root_cause(results, error_of, stopped_at):
    """The process that failed first on its own: not because another one did (see
    error_of), earliest by the time of its error (else of its exit). A process that was
    stopped (by tntrun or, across hosts, by the engine: stopped_at(res) is when) counts if it
    had raised already (its error record says so). If every failure was caused by another
    process: the process they blame (a TimeoutError names the stuck rank, which may have had
    to be killed) unless it exited cleanly, else the first one observed."""
    failures, blamed, finished = [], [], {}
    for res in results:
        if not failed(res, error_of):
            continue
        lost_peer, raised_at, *rest = error_of(res)
        if rest and rest[0] is not None:
            blamed.append(rest[0])
            # every failure that blames it says it shut down: it finished its program
            finished[rest[0]] = finished.get(rest[0], True) and len(rest) > 1 and bool(rest[1])
        if res.stopped:
            when = stopped_at(res)
            if raised_at is None or when is None or raised_at >= when:
                continue  # ended by whoever stopped it, not by its own failure
        failures.append((lost_peer, raised_at if raised_at is not None else res.ended_at, res))
    if not failures:
        return None
    own = [(at, res) for lost_peer, at, res in failures if not lost_peer]
    if own:
        root = min(own, key=lambda item: item[0])[1]
        root.stopped = False  # it had failed: the stop only hurried its end
        return root
    # a blamed rank that exited cleanly did not fail: it finished its program while a peer
    # still made a collective call (every failure then says so); the root cause is the
    # first rank that failed, and tntrun exits with its status, never 0. Across hosts such a
    # rank may still be in its shutdown when the engine ends the job (mpirun's SIGTERM): it
    # was stopped, with no error of its own, and the same holds
    by_rank = {res.spec.rank: res for res in results
               if getattr(res.spec, "rank", None) is not None and failed(res, error_of)}
    # a blamed rank that exited 0 after a thread of its died of an uncaught exception (the
    # program went on, leaving its peers waiting for what that thread would have done): that
    # exception is the root cause
    for rank in blamed:
        res = next((res for res in results if getattr(res.spec, "rank", None) == rank), None)
        if res is not None and res.returncode == 0 and _thread_died(res, error_of):
            return res
    for rank in blamed:
        res = by_rank.get(rank)
        if res is None or (res.stopped and finished.get(rank) and error_of(res)[1] is None):
            continue
        return res
    return min((res for _, _, res in failures), key=lambda res: res.ended_at)


def _thread_died(res, error_of):
    answer = error_of(res)
    return len(answer) > 5 and answer[5] is not None


def failed(res, error_of):
    """Whether a process that ended failed: a non-zero exit or a signal, or an exit 0 after a
    collective of its failed, which its program caught or Python ignored (an atexit handler):
    error_of's fifth answer. Such a job failed (its ranks did not make the same calls), and
    a job in which a rank failed never exits 0."""
    if res.returncode is None:
        return False
    if res.returncode != 0:
        return True
    answer = error_of(res)
    return len(answer) > 4 and bool(answer[4])


def _who(spec):
    return f"rank {spec.rank}" if spec.rank is not None else spec.label
