"""The rank wrapper that engines start on every host (python -m tarantella.runner.rank).

It reads the placement the engine gives (OpenMPI, MPICH/Hydra, Slurm, GPI-2 variables),
exports it as the TNT_* contract, makes the choices that depend on the host the rank runs
on (its GPU, its NUMA node, whether its stdout is shown), then runs the user's program.

Without --report it replaces itself with the program (exec), so the engine supervises the
program directly. With --report (what tntrun passes) it stays as the program's parent, so
that tntrun, which sees only the engine, learns why a rank failed on whatever host it ran:
- the program's stderr passes through the wrapper (at once, chunk by chunk) and its last
  lines are kept; the program gets TNT_ERROR_FILE in a private folder on this host;
- signals that stop a job (SIGTERM, SIGINT, SIGHUP, SIGQUIT; also SIGCONT, SIGUSR1, SIGUSR2)
  are passed on to the program; a stop signal before the program ended marks the rank as
  stopped by the engine (not a failure of its own);
- when the program fails, one record (rank, host, pid, exit status, time, stopped, error
  file, stderr tail) goes to stderr as marker lines (rank_report.py), which the engine
  forwards to tntrun; then the wrapper ends as the program did: the same exit code, or the
  same signal (without a core dump of its own), so the engine sees what it would have seen;
- the program dies with the wrapper (parent-death signal SIGKILL).
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
from tarantella.runner import gpus, pinning, rank_report

TAIL_BYTES = 64 * 1024
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
    """The program, run as a child whose stderr passes through us (see the module's doc)."""

    def __init__(self, command, hide_stdout, env):
        self.stopped = False
        self.stopped_at = None
        self.proc = None
        self._pending = []
        self.tail = bytearray()
        self.at_line_start = True
        for sig in PASSED_SIGNALS:
            signal.signal(sig, self._on_signal)
        from tarantella.runner.supervise import die_with_launcher

        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL if hide_stdout else None,
            stderr=subprocess.PIPE, preexec_fn=die_with_launcher(signal.SIGKILL))
        for sig in self._pending:  # arrived while the program was being started
            self._pass(sig)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _on_signal(self, signum, frame):
        if signum in STOP_SIGNALS and (self.proc is None or self.proc.returncode is None):
            if not self.stopped:
                self.stopped, self.stopped_at = True, time.time()
        if self.proc is None:
            self._pending.append(signum)
        else:
            self._pass(signum)

    def _pass(self, signum):
        try:
            self.proc.send_signal(signum)
        except (ProcessLookupError, OSError):
            pass

    def _read(self):
        fd = self.proc.stderr.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.tail += chunk
            del self.tail[:-TAIL_BYTES]
            self.at_line_start = chunk.endswith(b"\n")
            view = memoryview(chunk)
            try:
                while view:
                    view = view[os.write(2, view):]
            except OSError:
                pass  # our stderr is gone: keep draining the pipe

    def wait(self):
        code = self.proc.wait()
        ended = time.time()
        self._reader.join(timeout=5.0)  # a grandchild may hold the pipe open: do not hang
        return code, ended


def _record(rank, local_rank, size, child, code, ended, error_file, started):
    from tarantella.runner import report

    return {
        "rank": rank, "local_rank": local_rank, "size": size, "host": socket.gethostname(),
        "pid": child.proc.pid if child else None, "returncode": code, "ended_at": ended,
        "started_at": started, "stopped": bool(child and child.stopped),
        "stopped_at": child.stopped_at if child else None,
        "error": report.read_error_file(error_file),
        "stderr_tail": "\n".join(report.tail_lines(bytes(child.tail))) if child else "",
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


def _supervised(command, rank, local_rank, size, hide_stdout, env):
    job_id = env.get("TNT_JOB_ID", "")
    private = tempfile.mkdtemp(prefix=f"tnt-rank-{job_id[:8]}-")
    error_file = os.path.join(private, f"error-rank{rank}.json")
    env["TNT_ERROR_FILE"] = error_file
    started = time.time()
    child = None
    try:
        try:
            child = _Child(command, hide_stdout, env)
        except OSError as exc:
            message = (f"tntrun (rank {rank} on {socket.gethostname()}): cannot start "
                       f"{command[0]!r}: {exc.strerror}")
            print(message, file=sys.stderr, flush=True)
            record = _record(rank, local_rank, size, None, 127, time.time(), None, started)
            record["stderr_tail"] = message
            rank_report.write(record, job_id)
            return 127
        code, ended = child.wait()
        if code != 0:
            if not child.at_line_start:
                os.write(2, b"\n")  # the record starts on a line of its own
            rank_report.write(_record(rank, local_rank, size, child, code, ended, error_file,
                                      started), job_id)
    finally:
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
        if ids:
            # one GPU per rank (or per --ranks-per-gpu ranks), or none for every rank when
            # ranks outnumber the places (a CPU run)
            gpus.rank_gpu_env(env, gpus.gpu_for(local_rank, local_size, ids, opts.ranks_per_gpu))
    if opts.pin_cpu or opts.pin_memory:
        command = pinning.pinned_argv_of(command, opts.pin_cpu, opts.pin_memory, local_size)(local_rank)
    # only the master's output is shown; stderr stays, so errors of any rank reach the engine
    hide_stdout = rank != 0 and not opts.output_all
    if opts.report:
        return _supervised(command, rank, local_rank, size, hide_stdout, dict(env))
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
