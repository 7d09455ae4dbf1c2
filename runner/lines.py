"""A rank's output passed on in whole lines, for the streams that carry several ranks' lines.

tntrun runs the ranks with PYTHONUNBUFFERED=1 (environment.py: the last lines before a crash
must reach it), under which print() makes two writes, the text and then its newline. An
engine (mpirun, gaspi_run's ssh, srun) passes on what it reads as it comes, and the lines of
ranks writing at the same moment ran together: "READY 2READY 3", then two empty lines. What
passes through the rank wrapper (rank.py) and gaspi_run's ssh (gaspi_ssh.py) is therefore
written a line at a time (or several whole lines at once): the end of a line is waited for,
but for HOLD_S at most, so that a prompt or a progress bar without a newline still shows.
"""
import os
import select
import time

# how long the start of a line waits for its end: print()'s two writes follow each other
# within microseconds; a progress bar is redrawn without a newline and must still show
HOLD_S = 0.1


def whole_lines(fd, hold_s=None, size=65536):
    """What is read from `fd` until its end, in pieces that end with a newline, except a
    line begun more than `hold_s` (HOLD_S) ago, and the last piece."""
    hold_s = HOLD_S if hold_s is None else hold_s
    pending, since = b"", 0.0
    while True:
        if pending:
            wait = since + hold_s - time.monotonic()
            try:
                ready = wait > 0 and select.select([fd], [], [], wait)[0]
            except (OSError, ValueError):
                ready = True  # let the read below tell
            if not ready:  # its end did not come in time: as it is
                yield pending
                pending = b""
                continue
        try:
            chunk = os.read(fd, size)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                yield pending
            return
        had = bool(pending)
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut:
            yield data[:cut]
        pending = data[cut:]
        if pending and (cut or not had):  # a line begins now
            since = time.monotonic()
