"""The failure report: a box like torchrun's, root cause first.

The root cause is the first process that failed on its own, not because another one did
(supervise.py decides, with error_of below). For it: rank, host, pid, exit code or signal
name, the message and traceback of its TNT_ERROR_FILE (written by tarantella.common on an
uncaught Python exception) or else the last lines of its stderr, shown even when its output
was hidden. Processes that only lost a peer are listed after it in one line each.
"""
import json
import signal
import time

TAIL_LINES = 20
WIDTH = 72
PEER_LOST = "PeerLostError"  # tarantella.common.errors: raised by survivors of a failed rank


def describe_exit(returncode):
    """'exit code 3' or 'signal 9 (SIGKILL)'."""
    if returncode is None:
        return "still running (could not be stopped)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


def read_error_file(path):
    """The JSON record of an uncaught exception, or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def error_of(res):
    """(lost_peer, raised_at, blamed_rank, blamed_finished, caught) of a process, from its
    error file: lost_peer is True when its uncaught exception was a PeerLostError (what a
    rank raises when a peer died or aborted: the failure was another rank's) or an error
    that blames another rank (a TimeoutError naming the stuck rank), raised_at the time of
    the exception, blamed_rank the rank such an error names (None if none), blamed_finished
    True when the error says that rank shut down (it finished its program while this one
    still made collective calls: no failure of its own), caught True when the error was a
    collective's that the program went on after (caught, or ignored by Python in an atexit
    handler; tarantella writes it at exit): the rank failed even if it exited 0, thread the
    name of the thread (not the main one) whose uncaught exception it is, None if none.
    (False, None, None, False, False, None) without an error file."""
    record = _error_record(res)
    if record is None:
        return False, None, None, False, False, None
    message = str(record.get("message") or "")
    name = message.split(":", 1)[0].strip()
    raised_at = record.get("timestamp")
    if not isinstance(raised_at, (int, float)):
        raised_at = res.ended_at
    blamed = record.get("caused_by_rank")
    blamed = blamed if isinstance(blamed, int) else None
    finished = blamed is not None and f"rank {blamed} has shut down while" in message  # the core's words
    thread = record.get("thread")
    return (name.rsplit(".", 1)[-1] == PEER_LOST or blamed is not None, raised_at, blamed, finished,
            record.get("caught") is True, thread if isinstance(thread, str) else None)


def _error_record(res):
    """The error record of a process: forwarded from its host, or read from its error file."""
    record = getattr(res, "error", None)
    return record if isinstance(record, dict) else read_error_file(res.spec.error_file)


def tail_lines(data, n=TAIL_LINES):
    text = data.decode("utf-8", "replace").replace("\r", "\n")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-n:]


def _when(ts):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def _entry(res, brief=False):
    """The lines of one process; brief: without its traceback or stderr."""
    spec = res.spec
    who = (f"{spec.rank} (local_rank {spec.local_rank})" if spec.rank is not None
           else spec.label)
    lines = [
        f"  {'process:' if spec.rank is None else 'rank:':<9}{who}",
        f"  {'host:':<9}{spec.host or '?'}",
        # no pid: a rank whose program never ran (its host unreachable, its program not
        # found), whose record came from its host
        f"  {'pid:':<9}{'not started' if res.pid is None else res.pid}",
        f"  {'exit:':<9}{describe_exit(res.returncode)}",
        f"  {'time:':<9}{_when(res.ended_at)}",
    ]
    record = _error_record(res)
    if record and record.get("message"):
        lines.append(f"  {'error:':<9}{record['message']}")
        if record.get("caught") is True:
            lines.append(f"  {'':<9}(the program went on after this error: it caught it, or Python "
                         "ignored it in an atexit handler)")
        elif isinstance(record.get("thread"), str):
            lines.append(f"  {'':<9}(uncaught in thread {record['thread']!r}, which it ended; the "
                         "program went on without it)")
    if brief:
        return lines
    traceback = [ln for ln in str((record or {}).get("traceback") or "").splitlines() if ln.strip()]
    tail = tail_lines(res.stderr_tail)
    if traceback:  # the exception itself, whatever the rank printed after it
        shown = traceback[-TAIL_LINES:]
        cut = f" (last {len(shown)} lines)" if len(shown) < len(traceback) else ""
        lines.append(f"  traceback{cut}:")
        lines.extend("    " + ln for ln in shown)
    elif tail:
        lines.append(f"  stderr (last {len(tail)} lines):")
        lines.extend("    " + ln for ln in tail)
    return lines


def format_failure(job, program):
    """The report for a job that failed (job.root_cause set)."""
    root = job.root_cause
    from tarantella.runner.supervise import failed

    others = [r for r in job.results if r is not root and failed(r, error_of) and not r.stopped]
    stopped = [r for r in job.results if r.stopped]
    out = ["=" * WIDTH, f"tntrun: {program} FAILED", "-" * WIDTH,
           "Root cause (first failure not caused by another rank):"]
    out += _entry(root)
    out += _ended_first(job, root)
    if others:
        out += ["-" * WIDTH, "Other failures:"]
        for res in others:
            out += _entry(res, brief=error_of(res)[0])
    if stopped:
        labels = ", ".join(r.spec.label for r in stopped)
        by = getattr(job, "stopped_by", None) or "tntrun"
        out += ["-" * WIDTH, f"Stopped by {by} after the failure: {labels}"]
    engine = getattr(job, "engine", None)
    if engine is not None:
        out += ["-" * WIDTH, f"{engine.spec.label} (on {engine.spec.host or '?'}, pid {engine.pid}) "
                f"ended with {describe_exit(engine.returncode)}; tntrun exits with the "
                "root cause's status"]
        if getattr(job, "stalled", None):
            out.append(f"tntrun stopped {engine.spec.label}: {job.stalled}")
    out.append("=" * WIDTH)
    return "\n".join(out)


def _ended_first(job, root):
    """The rank the root cause's error says had shut down (it ended, exit 0, while the root
    still made collective calls: the other half of the story), with its stderr's last lines.
    Not a failure of its own, so listed nowhere else: where it ended early because its
    program caught an error and went on to its end (a fit in a try), what it printed of that
    error was hidden with its output (only the master's is shown), and the report said only
    that it "has shut down"."""
    _, _, blamed, finished, *_ = error_of(root)
    if not finished:
        return []
    res = next((r for r in job.results if getattr(r.spec, "rank", None) == blamed), None)
    if res is None:
        return []
    if res.returncode == 0:
        how = "had ended, exit code 0,"
    elif res.stopped and _error_record(res) is None:
        # across hosts: its program had ended, but the process was still in its exit (MPI_Finalize
        # waits for every rank) when the engine stopped the job; its record came from its host
        how = (f"had shut down (its process, still in its exit, was then stopped by "
               f"{getattr(job, 'stopped_by', None) or 'tntrun'}: {describe_exit(res.returncode)})")
    else:
        return []
    tail = tail_lines(res.stderr_tail)
    lines = ["-" * WIDTH,
             f"Rank {blamed} ({res.spec.host or '?'}, pid {res.pid}) {how} while the "
             "others still made collective calls: its program made fewer (it left a loop early, or "
             "caught an error and went on to its end)."]
    if tail:
        lines.append(f"  its stderr (last {len(tail)} lines):")
        lines.extend("    " + ln for ln in tail)
    else:
        lines.append("  Its stderr was empty: its output may say why (tntrun shows the master's; "
                     "--output-on-all-devices shows every rank's).")
    return lines


def format_one_line(job):
    """srun-style single line, for --log-level ERROR."""
    root = job.root_cause
    spec = root.spec
    who = f"rank {spec.rank}" if spec.rank is not None else spec.label
    text = describe_exit(root.returncode).capitalize()
    if root.returncode == 0:  # its program caught its collective's error (supervise.failed)
        error = str((_error_record(root) or {}).get("message") or "").split(":", 1)[0]
        text += f" after a collective failed ({error}, caught)"
    return f"tntrun: error: {spec.host}: {who}: {text}"
