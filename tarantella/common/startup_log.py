"""TNT_STARTUP_LOG: when each step of starting a job happened, to measure the
time from `tntrun` to the first training step (bench/startup.py reads it).

Unset (the default), `mark()` costs one dictionary lookup. Set to a path, the
launcher and every rank append one line per event to that file:
"<label>\\t<time.time()>\\t<event>", label being the rank ("tntrun" for the
launcher, "serial" for a process outside a job). The lines are short single
writes to a file opened for appending, so the ranks' lines do not interleave.
"""
import os
import time


def mark(event, label=None):
    """Record that `event` happens now (nothing when TNT_STARTUP_LOG is unset)."""
    path = os.environ.get("TNT_STARTUP_LOG")
    if not path:
        return
    now = time.time()
    label = label or os.environ.get("TNT_RANK", "serial")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{label}\t{now:.6f}\t{event}\n".encode())
        finally:
            os.close(fd)
    except OSError:  # a measurement aid must never fail a job
        pass


def read(path):
    """The events of a log as a list of (label, time, event)."""
    events = []
    with open(path) as f:
        for line in f:
            label, when, event = line.rstrip("\n").split("\t", 2)
            events.append((label, float(when), event))
    return events
