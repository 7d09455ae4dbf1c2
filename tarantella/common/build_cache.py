"""Libraries compiled at first use, cached per user (the mpi transport's plugin,
the TensorFlow ops).

Each library lives in its own folder of $XDG_CACHE_HOME/tarantella/plugins
(default ~/.cache), named by its caller after everything that went into the
build (a digest of the sources, the compiler and its flags), so a changed
input gets a fresh folder and an unchanged one is loaded at once. The cache
must be this user's alone: the libraries in it are loaded into every rank.

Several ranks start at once: the first takes the folder's lock and builds
into a temporary file, then renames it into place (atomic, also for a rank
on another host sharing the home); the others wait on the lock and find it.
Where the file system has no locks, each may build, and the rename still
puts one whole library in place.
"""
import errno
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile

from tarantella.common import errors

FAILED = "build.failed"  # next to the library: a build that failed, remembered
# next to the library: the digest of the sources it is built from (sources_digest), so that a
# reader that cannot compute the folder's whole name (tntrun --version: no TensorFlow
# imported, so not its flags) still tells this release's build from an older one's
SOURCES_STAMP = "sources.digest"


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tarantella", "plugins")  # made 0700 below ~/.cache


def compiler_from_environment(variables, complaint):
    """The command that the first of the environment `variables` set (not
    blank) names, as an argument list, or None when none is set; raise
    InvalidArgumentError(complaint.format(var=..., value=...)) (its program
    is not an executable on PATH), ending with what was received, as every error
    about the environment does."""
    for var in variables:
        value = os.environ.get(var, "").strip()
        if value:
            cmd = shlex.split(value)
            if not shutil.which(cmd[0]):
                raise errors.InvalidArgumentError(
                    complaint.format(var=var, value=value) + f". Received: {var}={value}")
            return cmd
    return None


def find_cxx():
    """The C++ compiler as an argument list ($CXX, else c++, g++ or clang++ on
    PATH), or raise saying why there is none."""
    cmd = compiler_from_environment(
        ("CXX",), "{var}={value} is not an executable C++ compiler: point CXX at g++ or clang++, or unset it")
    if cmd is not None:
        return cmd
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return [found]
    raise errors.SystemError(
        "no C++ compiler found (no $CXX, c++, g++ or clang++ on PATH): install one "
        "(Debian/Ubuntu: apt-get install g++), or set CXX")


def digest(*parts):
    """A short hex digest of byte or str parts (what names a build folder)."""
    h = hashlib.sha256()
    for part in parts:
        h.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return h.hexdigest()[:12]


def tf_ops_sources():
    """The files the TensorFlow ops are compiled from (tarantella/tensorflow/ops/build.py),
    found without importing TensorFlow."""
    from tarantella.common import plugins  # it imports this module

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (os.path.join(here, "tensorflow", "ops", "tnt_ops.cc"),
            os.path.join(plugins.source_dir(), "include", "tarantella.h"))


def sources_digest(paths):
    """digest() of the contents of the files `paths`."""
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            parts.append(f.read())
    return digest(*parts)


def stamp_sources(folder, value):
    """Write SOURCES_STAMP into `folder` unless it says `value` already (best effort: a
    read-only cache is used as it is)."""
    if stamped(folder, value):
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=".stamp-", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.replace(tmp, os.path.join(folder, SOURCES_STAMP))
    except OSError:
        pass


def stamped(folder, value):
    """True when `folder`'s SOURCES_STAMP says `value`."""
    try:
        with open(os.path.join(folder, SOURCES_STAMP)) as f:
            return f.read().strip() == value
    except OSError:
        return False


def private_dir(path, what, instead):
    """Make `path` and refuse it, or the cache above it, if others could write
    into it. `what` names the library for the messages, `instead` what the user
    can do when no cache can be had."""
    checked = (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path)))
    try:
        # each checked folder made 0700 itself: makedirs gives its mode to the last one only, and
        # under a umask of 002 (Debian's for users) the others came out group-writable, refused below
        for folder in reversed(checked):
            os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise errors.SystemError(
            f"{what} cannot be built: cannot create {path} ({exc.strerror}): set XDG_CACHE_HOME to a writable "
            f"folder of your own, or {instead}") from None
    for folder in checked:
        st = os.stat(folder)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise errors.InvalidUsageError(
                f"the plugin cache {folder} belongs to uid {st.st_uid} with mode {st.st_mode & 0o777:o}: Tarantella "
                "loads code from it, so it must be this user's and writable by nobody else; fix it or set "
                "XDG_CACHE_HOME")


def check_owned(lib):
    st = os.stat(lib)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise errors.InvalidUsageError(f"{lib} is not this user's own or others may write it: delete it")


def run(cmd, what, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise errors.SystemError(f"{what}: running {' '.join(map(str, cmd))} failed: {exc}") from None


def build_once(folder, lib, cmd, failure, log_note="", remember_failure=False):
    """Run the compile command `cmd` (whose output argument is the placeholder
    "{out}") into `folder`/`lib` unless another process did. On failure raise
    SystemError(failure + the compiler's output + the log's path); with
    `remember_failure`, later calls raise it again without compiling (delete
    the folder to try again)."""
    path = os.path.join(folder, lib)
    failed = os.path.join(folder, FAILED)
    if os.path.isfile(path):  # built: no lock needed (nor a writable cache: it is only read)
        return path
    try:
        lock = open(os.path.join(folder, ".lock"), "w")
    except OSError as exc:
        raise errors.SystemError(
            f"{failure}: cannot write into the build cache {folder} ({exc.strerror}): set XDG_CACHE_HOME to a "
            "writable folder of your own") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other ranks of this host wait for the first to build
        except OSError as exc:
            # a file system without locks (Lustre mounted without -o flock): each rank may then
            # build, into its own temporary file that the rename below puts into place whole
            if exc.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                raise
        if os.path.isfile(path):
            return path
        if remember_failure and os.path.isfile(failed):
            with open(failed) as f:
                raise errors.SystemError(f.read())
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
        os.close(fd)
        try:
            cmd = [tmp if c == "{out}" else c for c in cmd]
            res = run(cmd, failure)
            log = os.path.join(folder, "build.log")
            with open(log, "w") as f:
                f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n" + res.stdout + res.stderr)
                f.write(f"\nexit status {res.returncode}\n{log_note}\n")
            if res.returncode != 0:
                output = (res.stderr + res.stdout).strip()
                message = (f"{failure} (exit status {res.returncode}); the compiler said:\n{output[-3000:]}\n"
                           f"(full log: {log})")
                if remember_failure:
                    with open(failed, "w") as f:
                        f.write(message + f"\n(this failure is remembered: delete {folder} to try again)")
                raise errors.SystemError(message)
            os.chmod(tmp, 0o755)
            # on disk before its name: a machine that crashes right after the rename must not leave
            # a library that is named but truncated (loading it is a SIGBUS, not a fallback)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic: a rank on another host sharing this home sees all of it or nothing
        finally:
            if os.path.exists(tmp):  # a build that failed or was interrupted (Ctrl+C) leaves nothing behind
                os.unlink(tmp)
    return path
