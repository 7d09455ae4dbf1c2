"""The failure report: a box like torchrun's, root cause first.

For the first process that failed: rank, host, pid, exit code or signal name, the
message of its TNT_ERROR_FILE (written by tarantella.common on an uncaught Python
exception), and the last lines of its stderr, shown even when its output was hidden.
"""
import json
import signal
import time

TAIL_LINES = 20
WIDTH = 72


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


def tail_lines(data, n=TAIL_LINES):
    text = data.decode("utf-8", "replace").replace("\r", "\n")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-n:]


def _when(ts):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def _entry(res):
    spec = res.spec
    who = (f"{spec.rank} (local_rank {spec.local_rank})" if spec.rank is not None
           else spec.label)
    lines = [
        f"  {'process:' if spec.rank is None else 'rank:':<9}{who}",
        f"  {'host:':<9}{spec.host or '?'}",
        f"  {'pid:':<9}{res.pid}",
        f"  {'exit:':<9}{describe_exit(res.returncode)}",
        f"  {'time:':<9}{_when(res.ended_at)}",
    ]
    record = read_error_file(spec.error_file)
    if record and record.get("message"):
        lines.append(f"  {'error:':<9}{record['message']}")
    tail = tail_lines(res.stderr_tail)
    if tail:
        lines.append(f"  stderr (last {len(tail)} lines):")
        lines.extend("    " + ln for ln in tail)
    elif record and record.get("traceback"):
        lines.append("  traceback:")
        lines.extend("    " + ln for ln in record["traceback"].rstrip().splitlines())
    return lines


def format_failure(job, program):
    """The report for a job that failed (job.root_cause set)."""
    root = job.root_cause
    others = [r for r in job.results
              if r is not root and r.returncode not in (None, 0) and not r.stopped]
    stopped = [r for r in job.results if r.stopped]
    out = ["=" * WIDTH, f"tntrun: {program} FAILED", "-" * WIDTH,
           "Root cause (first observed failure):"]
    out += _entry(root)
    if others:
        out += ["-" * WIDTH, "Other failures:"]
        for res in others:
            out += _entry(res)
    if stopped:
        labels = ", ".join(r.spec.label for r in stopped)
        out += ["-" * WIDTH, f"Stopped by tntrun after the failure: {labels}"]
    out.append("=" * WIDTH)
    return "\n".join(out)


def format_one_line(job):
    """srun-style single line, for --log-level ERROR."""
    root = job.root_cause
    spec = root.spec
    who = f"rank {spec.rank}" if spec.rank is not None else spec.label
    return f"tntrun: error: {spec.host}: {who}: {describe_exit(root.returncode).capitalize()}"
