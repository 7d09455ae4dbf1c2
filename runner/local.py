"""A job on this host: tntrun starts one process per rank itself and supervises them."""
import os
import platform
import shutil
import sys
import tempfile

from tarantella.runner import gpus, jobs, report, shm
from tarantella.runner.supervise import ProcSpec, Supervisor, tell


def rank_specs(argv_of, env, size, private_dir, output_on_all, gpu_of=None, pin_of=None,
               cwd=None, stderr_of_all=False):
    """One ProcSpec per rank. `argv_of(local_rank)` gives a rank's argv (after pinning),
    `gpu_of(local_rank)` its CUDA_VISIBLE_DEVICES (None: leave as is). `stderr_of_all`
    (TNT_LOG_ON_ALL_DEVICES): every rank's stderr is shown, where its logs go; before,
    --log-on-all-devices alone showed rank 0's log only."""
    host = platform.node()
    specs = []
    for rank in range(size):
        rank_env = dict(env)
        rank_env.update(TNT_RANK=str(rank), TNT_SIZE=str(size), TNT_LOCAL_RANK=str(rank),
                        TNT_LOCAL_SIZE=str(size))
        error_file = os.path.join(private_dir, f"error-rank{rank}.json") if private_dir else None
        if error_file:
            rank_env["TNT_ERROR_FILE"] = error_file
            # where tntrun notes each rank's end (ended_rank_noter): a rank that waits for one
            # that never joined reads it, rather than waiting until TNT_TIMEOUT_S
            rank_env["TNT_LAUNCHER_DIR"] = private_dir
        gpu = gpu_of(rank) if gpu_of else None
        if gpu is not None:
            gpus.rank_gpu_env(rank_env, gpu)
        shown = output_on_all or rank == 0
        specs.append(ProcSpec(
            argv=argv_of(rank), env=rank_env, label=str(rank), rank=rank, local_rank=rank,
            host=host, show_stdout=shown, show_stderr=shown or stderr_of_all, prefix=output_on_all,
            stdin=(rank == 0), error_file=error_file, cwd=cwd,
        ))
    return specs


def ended_rank_noter(private_dir):
    """on_ended for the Supervisor: write how a rank's process ended to
    `private_dir`/ended-rank<R>, whole (renamed into place), for the ranks still waiting for
    it to join (core/src/transport/launcher_ended.h)."""
    def note(spec, returncode):
        if not private_dir or getattr(spec, "rank", None) is None:
            return
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        path = os.path.join(private_dir, f"ended-rank{spec.rank}")
        try:
            with open(path + ".tmp", "w") as f:
                f.write(how + "\n")
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the ranks then wait until TNT_TIMEOUT_S, as without tntrun
    return note


def private_tempdir(job_id):
    """A directory only this user can read (mkdtemp: 0700) for the ranks' error files."""
    return tempfile.mkdtemp(prefix=f"tnt-run-{job_id[:8]}-")


def run(specs, job_id, program, command, one_line=False, grace_s=3.0, private_dir=None,
        files=(), translate=None, watch=None, adopt=False):
    """Run the ranks until the job ends, print the failure report (before the error files
    go away with `private_dir`), clean up, and return tntrun's exit code. `private_dir` and
    `files` (an engine's machinefile...) are recorded, so that --cleanup removes them if
    tntrun is killed. `translate(job)` may replace how the job ended before it is
    reported (across hosts: the ranks' own failures instead of the engine's). `watch(supervisor)`
    is called before the job starts (across hosts: to hear of the ranks' failures). `adopt`:
    this process is tntrun, and ends what the ranks left behind outside their process groups
    (Supervisor's adopt)."""
    cwd = os.getcwd()
    record = {
        "job_id": job_id, "runner_pid": os.getpid(),
        "runner_start": jobs.process_start_time(os.getpid()),
        "program": jobs.program_key(command, cwd), "command": list(command), "cwd": cwd,
        "host": platform.node(), "ranks": [], "private_dir": private_dir, "files": list(files),
    }
    try:
        state = jobs.state_dir()
    except (OSError, jobs.StateDirError) as exc:
        print(f"tntrun: WARNING: cannot record the job for --cleanup ({exc})", file=sys.stderr)
        state = None

    def on_started(procs):
        # the ranks, so that --cleanup can find them even if tntrun itself is SIGKILLed
        # from here on
        record["ranks"] = [{"label": s.label, "pid": p.pid, "start": jobs.process_start_time(p.pid)}
                           for s, p in zip(specs, procs)]
        if state:
            jobs.write(record, state)

    def on_stopping(reason, routine=False):
        # that a rank failed is a notice, not an error: --log-level ERROR promises the failure
        # in one line; a signal or a stalled engine is still said (the one line says neither)
        if not (one_line and routine):
            tell(f"tntrun: {reason}")

    supervisor = Supervisor(specs, grace_s=grace_s, on_started=on_started, on_stopping=on_stopping,
                            on_ended=ended_rank_noter(private_dir), error_of=report.error_of, adopt=adopt)
    if watch is not None:
        watch(supervisor)
    try:
        if state:
            # before the first rank starts: a tntrun SIGKILLed while it started many ranks
            # (whose parent-death signal then killed them) left its private folder, and the
            # shared memory of the ranks started, with no record for --cleanup to find them by
            jobs.write(record, state)
        job = supervisor.run()
        if translate is not None:
            job = translate(job)
        return report_and_code(job, program, one_line)
    finally:
        shm.remove(job_id)
        if state:
            jobs.remove(job_id, state)
        if private_dir:
            shutil.rmtree(private_dir, ignore_errors=True)


def report_and_code(job, program, one_line=False):
    """Print how the job ended; return tntrun's exit code."""
    if job.root_cause is not None:
        text = report.format_one_line(job) if one_line else report.format_failure(job, program)
        tell(text)
    elif job.interrupted_by is not None:
        tell("tntrun: interrupted: all processes were stopped")
    return job.exit_code
