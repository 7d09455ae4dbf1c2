"""A per-user record of running jobs, so that `tntrun --cleanup` can find the ranks and
shared-memory objects of a job whose runner was killed, by job id and verified pid,
never by matching process names.

Records live in $XDG_RUNTIME_DIR/tarantella/jobs (or /tmp/tnt-<uid>/jobs), a directory
only the user can enter, one JSON file per job, removed when the job ends normally.
"""
import json
import os
import stat
import tempfile


class StateDirError(Exception):
    pass


def state_dir(environ=None):
    environ = os.environ if environ is None else environ
    override = environ.get("TNT_STATE_DIR")
    runtime = environ.get("XDG_RUNTIME_DIR")
    if override:
        base = override
    elif runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        base = os.path.join(runtime, "tarantella")
    else:
        base = os.path.join(tempfile.gettempdir(), f"tnt-{os.getuid()}")
    path = os.path.join(base, "jobs")
    os.makedirs(path, mode=0o700, exist_ok=True)
    # /tmp is shared: refuse a directory (or symlink) planted by another user
    for p in (base, path):
        st = os.lstat(p)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise StateDirError(f"{p} is not a directory owned by you: remove it or set TNT_STATE_DIR")
    return path


def _stat(pid):
    """The fields of /proc/<pid>/stat from field 3 (state) on, or None if there is no such
    process. The command name (field 2) may hold spaces and parentheses: split after the
    last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def process_start_time(pid):
    """Start time of a process in clock ticks since boot, or None if it does not exist: a
    pid plus its start time names one process, even after pid reuse."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # field 22 of stat(5)


def is_stopped(pid):
    """True for a process stopped by a signal (state T: SIGSTOP, Ctrl+Z) or by a tracer (t).
    It acts on no signal but SIGKILL until it is continued."""
    return state_of(pid) in (b"T", b"t")


def state_of(pid):
    """The state letter of a process (b"R", b"S", b"D", b"Z", ...), or None if there is none."""
    fields = _stat(pid)
    return fields[0] if fields else None


def is_zombie(pid):
    """True for a process that has exited and waits to be reaped (state Z)."""
    return state_of(pid) == b"Z"


def parent_of(pid):
    """The parent pid of a process, or None if there is no such process."""
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def same_process(pid, start):
    return pid is not None and start is not None and process_start_time(pid) == start


def running(pid, start):
    """That process, and not dead yet: a zombie has ended (ranks killed with their tntrun
    stay zombies until init reaps them, which a container's init may be slow to do)."""
    fields = _stat(pid) if pid is not None and start is not None else None
    return bool(fields) and int(fields[19]) == start and fields[0] not in (b"Z", b"X")


def descendants(pid):
    """[(pid, start time)] of every process below `pid` now, also those in other process
    groups (Open MPI's ssh children call setpgid, so killing mpirun's group misses them)."""
    children = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def program_key(command, cwd):
    """What identifies "the same PROGRAM": the absolute path of the script (after an
    interpreter the user may have written), or its name when it is not a file."""
    from tarantella.runner.command import is_python

    tokens = list(command)
    while tokens and (is_python(tokens[0]) or tokens[0].startswith("-")) and len(tokens) > 1:
        if tokens[0] == "-m":
            return "module:" + tokens[1]
        tokens = tokens[1:]
    if not tokens:
        return ""
    path = os.path.join(cwd, tokens[0])
    return os.path.realpath(path) if os.path.exists(path) else tokens[0]


def write(record, directory=None):
    directory = directory or state_dir()
    path = os.path.join(directory, f"{record['job_id']}.json")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return path


def remove(job_id, directory=None):
    try:
        os.unlink(os.path.join(directory or state_dir(), f"{job_id}.json"))
    except FileNotFoundError:
        pass


def load_all(directory=None):
    directory = directory or state_dir()
    records = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            continue
    return records
