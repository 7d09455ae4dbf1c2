"""tf.train.Checkpoint's writes into one folder, one rank at a time.

A custom training loop that calls `checkpoint.save(prefix)`, or a
`tf.train.CheckpointManager`'s `save()`, on every rank (Horovod's guides guard
it with `rank == 0`; a serial script run as it is does not) had every rank
write the same files at once. TensorFlow writes `<prefix>_temp/part-...`,
merges it into `<prefix>.index` and `<prefix>.data-...`, and removes the
temporary folder: on 2 ranks one rank's merge found the folder gone
("MergeV2Checkpoints ... did not exist") and the job ended there, and a rank
that restored while another rewrote the index could read it half-written.

Every write of a tf.train.Checkpoint goes through `Checkpoint._write` (`save`,
`write` and a CheckpointManager's `save`; the `checkpoint` state file and the
manager's removal of old checkpoints run inside it, as its write callbacks),
and every read through `read` (`restore` calls it).
`install` wraps them: a write holds an exclusive lock on the checkpoint's
folder, a read a shared one. The ranks of a host then write one after the
other, each a whole checkpoint, and none reads what another is rewriting.
Their files are alike (so are the ranks' variables), so the folder holds what
serial training writes. Ranks that save into folders of their own do not wait
for each other. One process alone, or without an initialised Tarantella of
several ranks, takes no lock.

A write is a section of the rank's own (busy.py): the other ranks wait for a
master-only save in their next collective for as long as it takes (up to
TNT_BUSY_TIMEOUT_S), where a write longer than TNT_TIMEOUT_S ended the job.

The lock is a file in the host's /tmp named after the host and the
checkpoint's folder: a flock ends with its process, so a rank killed in a
write frees it. A job of several hosts also locks a file in the folder itself,
`.tnt-checkpoint.lock`, once the host's lock is held: ranks of several hosts
that share the folder (NFS, GPFS, Lustre mounted with flock) then write one
after the other too; before, two hosts' ranks saving at once failed as two
ranks of a host did ("MergeV2Checkpoints ... did not exist"). Where the folder's
file system has no locks (ENOLCK, ENOSYS, EOPNOTSUPP) a warning says so once per
folder, and its writes are ordered per host only: save on the master only
there (custom-training-loops.md). A folder that is not shared holds one lock
file per host, which orders that host's ranks again, and costs nothing more.
"""
import errno
import fcntl
import functools
import hashlib
import os
import socket
import tempfile
import time

_INSTALLED = "_tnt_checkpoint_lock"


def _lock_path(file_prefix):
    folder = _folder(file_prefix)
    digest = hashlib.sha1(os.fsencode(folder)).hexdigest()[:16]
    # /tmp, not $TMPDIR: a cluster may give each task a TMPDIR of its own, and the ranks of a
    # host must meet at one lock
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    # the host in the name: hosts that share /tmp (namespaces of one machine) still lock apart,
    # as hosts of a cluster do, each in its own /tmp
    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
    return os.path.join(base, f"tnt-checkpoint-{os.getuid()}-{host}-{digest}.lock")


# the lock in the checkpoint's folder, for the ranks of several hosts that share it
FOLDER_LOCK = ".tnt-checkpoint.lock"
# what flock raises where a file system has no locks (an NFS without lockd, Lustre without flock)
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_warned_unordered = set()


def _folder(file_prefix):
    return os.path.realpath(os.path.dirname(os.path.abspath(os.fspath(file_prefix))))


def _several_hosts():
    from tarantella.common import core

    return core.get_size() > core.get_local_size()


def _several_ranks():
    from tarantella.common import core

    return core.is_initialized() and core.get_size() > 1


def _local(file_prefix):
    """A path of this host's file systems (not gs://, s3://, ...): only those are ordered."""
    try:
        return "://" not in os.fspath(file_prefix)
    except TypeError:  # a tensor: a prefix computed in a graph
        return False


def _lock(fd, kind, path, holder="another process of this host"):
    """flock(fd, kind), waiting while another rank holds it, up to
    TNT_BUSY_TIMEOUT_S (a write of a large checkpoint may take long)."""
    from tarantella.common import config, core

    limit = float(config.get("TNT_BUSY_TIMEOUT_S"))
    # on the core's clock, as the core's bounds: the time the ranks were stopped together (Ctrl+Z,
    # kill -STOP) while another held the lock does not count (time.monotonic() counted it, and a
    # rank continued after a pause longer than the bound failed at once)
    deadline, pause = core.clock() + limit, 0.001
    while True:
        try:
            return fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            if core.clock() > deadline:
                raise TimeoutError(
                    f"tf.train.Checkpoint: {holder} has held {path}, the lock of "
                    f"this checkpoint's folder, for more than TNT_BUSY_TIMEOUT_S={limit:g} s (a rank "
                    "writing there): raise TNT_BUSY_TIMEOUT_S, or save on the master only") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _holding(kind, file_prefix, call):
    if not (_local(file_prefix) and _several_ranks()):
        return call()
    from tarantella.common import busy

    path = _lock_path(file_prefix)
    # A section of this rank's own: a master-only save of a large model keeps the ranks that
    # wait for it in their next collective from failing at TNT_TIMEOUT_S (busy.py)
    with busy.section():
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            _lock(fd, kind, path)
            shared = _folder_lock(kind, file_prefix) if _several_hosts() else None
            try:
                return call()
            finally:
                if shared is not None:
                    os.close(shared)
        finally:
            os.close(fd)  # and with it the lock


def _folder_lock(kind, file_prefix):
    """The lock in the checkpoint's folder (a descriptor to close), for ranks of other hosts
    that share the folder; None where there is none to take: a folder this rank cannot
    write a file into (a read of a read-only folder, which nobody writes; a write there
    fails in TensorFlow, as it does serially), or a file system without locks (warned)."""
    folder = _folder(file_prefix)
    path = os.path.join(folder, FOLDER_LOCK)
    try:
        if kind == fcntl.LOCK_EX:  # TensorFlow would make it in the save: made now, the first saves take turns too
            os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        _lock(fd, kind, path, holder="a rank of another host")
        return fd
    except OSError as exc:
        os.close(fd)
        if isinstance(exc, BlockingIOError) or exc.errno not in _NO_LOCKS:
            raise
        if folder not in _warned_unordered:
            _warned_unordered.add(folder)
            from tarantella.common.logging import get_logger

            get_logger().warning(
                "tf.train.Checkpoint: the file system of %s has no locks (%s): the ranks of each host write "
                "there one after the other, but ranks of several hosts that share it may write at once. "
                "Save on the master only (if tnt.is_master_rank(): ...)", folder, exc.strerror)
        return None
    except BaseException:
        os.close(fd)
        raise


def _writing(original):
    @functools.wraps(original)
    def _write(self, file_prefix, *args, **kwargs):
        return _holding(fcntl.LOCK_EX, file_prefix, lambda: original(self, file_prefix, *args, **kwargs))

    setattr(_write, _INSTALLED, True)
    return _write


def _reading(original):
    @functools.wraps(original)
    def read(self, save_path, *args, **kwargs):
        if save_path is None:  # restore(None): nothing to read, nothing to wait for
            return original(self, save_path, *args, **kwargs)
        return _holding(fcntl.LOCK_SH, save_path, lambda: original(self, save_path, *args, **kwargs))

    setattr(read, _INSTALLED, True)
    return read


def install():
    """Order tf.train.Checkpoint's writes and reads of one folder among this host's ranks (once)."""
    from tensorflow.python.checkpoint import checkpoint

    for name, wrap in (("_write", _writing), ("read", _reading)):
        original = getattr(checkpoint.Checkpoint, name)
        if not getattr(original, _INSTALLED, False):
            setattr(checkpoint.Checkpoint, name, wrap(original))
