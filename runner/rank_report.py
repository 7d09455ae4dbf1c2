"""How a rank on another host tells tntrun why it failed, through the engine's stderr.

Across hosts tntrun supervises only the engine (mpirun, srun, gaspi_run); the ranks, their
error files (TNT_ERROR_FILE) and their stderr live on the other hosts. The rank wrapper
(rank.py) runs the program as its child; when the program ends it writes one record (rank,
host, pid, exit status, when, whether the engine had stopped it, the error file's content,
the last lines of its stderr, the tnt.init() calls it began) to its stderr, which every
engine forwards to tntrun, and a short note as the program begins each tnt.init(). The
record travels as short lines, each written with one write(2), so that lines of different
ranks never mix and an engine's line prefix (mpirun --tag-output "[1,3]<stderr>:", srun
--label "3: ") does no harm:

    \\x1etntrun-rank-report JOB RANK I/N CHUNK

JOB is the first 12 digits of TNT_JOB_ID (records of another job are forwarded as text),
CHUNK a piece of the record (JSON, zlib, base64). tntrun removes these lines from what it
shows (MarkerFilter) and rebuilds the records (Collector).
"""
import base64
import json
import os
import shlex
import threading
import zlib

from tarantella.common.engine_ranks import ENGINE_VARIABLES

MARK = b"\x1e"  # ASCII record separator: never in ordinary output
WORD = b"tntrun-rank-report"
CHUNK = 512


def encode(record, job_id):
    """The lines (bytes) that carry `record`."""
    data = base64.b64encode(zlib.compress(json.dumps(record).encode(), 6))
    rank = int(record.get("rank", -1))
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    return [MARK + WORD + b" %s %d %d/%d %s\n" % (job_id[:12].encode(), rank, i + 1, len(pieces), p)
            for i, p in enumerate(pieces)]


def write(record, job_id, fd=2):
    for line in encode(record, job_id):
        try:
            os.write(fd, line)
        except OSError:
            return


class Collector:
    """Rebuilds the records of one job from marker lines (any thread): `records` holds how
    ranks ended; notes (records with a "note": a rank began tnt.init()) go to on_record only."""

    def __init__(self, job_id, on_record=None):
        self.job = job_id[:12].encode()
        self._parts = {}
        self.records = []
        self._lock = threading.Lock()
        self.on_record = on_record  # called with each record once it is whole

    def take(self, text):
        """`text` starts at MARK (one line); True if it was a record line of this job."""
        words = text.rstrip(b"\r\n").split(b" ")
        if len(words) != 5 or words[0] != MARK + WORD or words[1] != self.job:
            return False
        try:
            rank = int(words[2])
            index, count = (int(x) for x in words[3].split(b"/"))
        except ValueError:
            return False
        record = None
        with self._lock:
            parts = self._parts.setdefault(rank, {})
            parts[index] = words[4]
            if len(parts) == count and all(i in parts for i in range(1, count + 1)):
                del self._parts[rank]
                try:
                    data = base64.b64decode(b"".join(parts[i] for i in range(1, count + 1)))
                    # JSON itself where a shell wrote the record (shell_not_started)
                    record = json.loads(data if data[:1] == b"{" else zlib.decompress(data))
                except (ValueError, zlib.error):
                    return True
                if not isinstance(record, dict):
                    record = None
                elif "note" not in record:  # a note (a tnt.init() begun) is for on_record only
                    self.records.append(record)
        if record is not None and self.on_record is not None:
            self.on_record(record)
        return True


class MarkerFilter:
    """Takes the marker lines out of a byte stream (an engine's stderr) and passes the rest
    on at once: a partial line is held back only while it holds MARK."""

    def __init__(self, collector):
        self.collector = collector
        self.held = b""          # the current line, held back because it holds MARK
        self.passed = False      # part of the current line has been passed on already

    def feed(self, chunk):
        out = []
        data = self.held + chunk
        self.held = b""
        pos = 0  # (an index: slicing off each line copied the rest, quadratic in a chunk's lines)
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:  # a partial line
                rest = data[pos:]
                if MARK in rest:
                    self.held = rest
                else:
                    out.append(rest)
                    self.passed = True
                break
            line, pos = data[pos:end + 1], end + 1
            at = line.find(MARK)
            if at >= 0 and self.collector.take(line[at:]):
                if self.passed:
                    out.append(b"\n")  # end what was shown of this line
            else:
                out.append(line)
            self.passed = False
        return b"".join(out)

    def flush(self):
        rest, self.held = self.held, b""
        return rest


def bootstrap():
    """Python source for `python -c SOURCE ARGS...`, in place of `python -m
    tarantella.runner.rank ARGS...` where only the ranks can tell that they did not start:
    it runs the rank wrapper, and where the wrapper cannot serve this tntrun it writes the
    record of a rank that was not started, saying why, as the wrapper would have, and exits
    127:
    - the wrapper cannot be imported (Tarantella not installed for that Python on that host,
      another version without it, one that this Python cannot import: a SyntaxError);
    - it cannot read tntrun's arguments (another release of Tarantella on that host, whose
      wrapper lacks an option: argparse's error, which exited 2 with its usage).
    gaspi_run notices no such rank: the others waited in gaspi_proc_init until TNT_TIMEOUT_S
    (5 minutes), and the report blamed rank 0's TimeoutError; under mpirun, mpiexec and srun
    the report named the engine alone, with Python's message. Only the standard library is
    used there; the records are written by this module's own encode()."""
    import inspect
    import textwrap

    source = textwrap.dedent(f"""\
        import sys
        def not_started(why):
            import base64, json, os, socket, time, zlib
            MARK, WORD, CHUNK = {MARK!r}, {WORD!r}, {CHUNK!r}
            {{encode}}
            def first(names, default):  # the engine's own variables, as tarantella.common.engine_ranks
                return next((int(os.environ[n]) for n in names if n and os.environ.get(n, "").isdigit()), default)
            rank = first({{ranks}}, -1)
            local = first({{locals}}, 0)
            host = socket.gethostname()
            message = f"NotStartedError: rank {{rank}} could not start on {{host}}: {{why}}"
            record = {{"rank": rank, "local_rank": local, "host": host, "pid": None, "returncode": 127,
                      "ended_at": time.time(), "stopped": False, "not_started": True,
                      "error": {{"message": message, "timestamp": time.time()}}, "stderr_tail": ""}}
            sys.stderr.write(message + "\\n")
            sys.stderr.flush()
            for line in encode(record, os.environ.get("TNT_JOB_ID", "")):
                os.write(2, line)
            sys.exit(127)
        try:
            from tarantella.runner.rank import main
        except Exception as exc:  # not only ImportError: a SyntaxError of a release this Python cannot run
            said = exc if isinstance(exc, ImportError) else f"{{type(exc).__name__}}: {{exc}}"
            not_started(f"{{sys.executable}} cannot import tarantella.runner.rank ({{said}}): "
                        f"Tarantella must be installed for the same Python, at the same path, on every host")
        import argparse
        def unreadable(parser, message):  # the wrapper's options are not this tntrun's
            not_started(f"its rank wrapper (tarantella.runner.rank) cannot read tntrun's arguments ({{message}}): "
                        f"every host must have the same release of Tarantella as tntrun's")
        argparse.ArgumentParser.error = unreadable  # (the program runs in a process of its own)
        sys.exit(main())
        """)
    # GASPI_SOCKET: gaspi_run's index of the rank on its host (it sets no local rank)
    return (source.replace("{encode}", textwrap.indent(inspect.getsource(encode), "    ").lstrip())
            .replace("{ranks}", repr([v[0] for v in ENGINE_VARIABLES]))
            .replace("{locals}", repr(["GASPI_SOCKET"] + [v[2] for v in ENGINE_VARIABLES if v[2]])))


def shell_not_started(python, job_id):
    """Shell lines (for gaspi_run's script, before it runs `python`): where `python` is not
    there (no Python at that path on this host), the record of a rank that did not start,
    written by the shell itself (JSON, base64, uncompressed: Collector takes both), and exit
    127. The shell ran on with "No such file or directory", gaspi_run's spawner exited 0
    whatever its ranks did, and the other ranks waited in gaspi_proc_init until TNT_TIMEOUT_S
    (5 minutes); the report blamed rank 0's TimeoutError."""
    why = (f"{python} is not there: tntrun runs the ranks of every host with its own Python, which "
           f"must be at the same path on every host (install it there, or use one on a shared file system)")
    said = '"NotStartedError: rank $GASPI_RANK could not start on $host: "'
    fields = ('{"rank": %d, "local_rank": %d, "host": "%s", "pid": null, "returncode": 127, "ended_at": %s, '
              '"stopped": false, "not_started": true, "error": {"message": "%s", "timestamp": %s}, '
              '"stderr_tail": ""}')
    return "\n".join([
        f"if [ ! -x {shlex.quote(python)} ]; then",
        "    host=$(uname -n); now=$(date +%s)",
        f"    printf '%s\\n' {said}{shlex.quote(why)} >&2",
        f"    message={said}{shlex.quote(json.dumps(why)[1:-1])}",
        f"    record=$(printf {shlex.quote(fields)} \"$GASPI_RANK\" \"${{GASPI_SOCKET:-0}}\" \"$host\" \"$now\" "
        f"\"$message\" \"$now\" | base64 | tr -d '\\n')",
        f"    printf '\\036{WORD.decode()} {job_id[:12]} %d 1/1 %s\\n' \"$GASPI_RANK\" \"$record\" >&2",
        "    exit 127",
        "fi"]) + "\n"
