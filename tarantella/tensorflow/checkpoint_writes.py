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

The lock is a file in the host's /tmp named after the checkpoint's
folder: an fcntl lock ends with its process, so a rank killed in a write frees
it. Ranks on several hosts that share a file system are not ordered by it:
there, save on the master only (custom-training-loops.md).
"""
import fcntl
import functools
import hashlib
import os
import tempfile
import time

_INSTALLED = "_tnt_checkpoint_lock"


def _lock_path(file_prefix):
    folder = os.path.realpath(os.path.dirname(os.path.abspath(os.fspath(file_prefix))))
    digest = hashlib.sha1(os.fsencode(folder)).hexdigest()[:16]
    # /tmp, not $TMPDIR: a cluster may give each task a TMPDIR of its own, and the ranks of a
    # host must meet at one lock
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return os.path.join(base, f"tnt-checkpoint-{os.getuid()}-{digest}.lock")


def _several_ranks():
    from tarantella.common import core

    return core.is_initialized() and core.get_size() > 1


def _local(file_prefix):
    """A path of this host's file systems (not gs://, s3://, ...): only those are ordered."""
    try:
        return "://" not in os.fspath(file_prefix)
    except TypeError:  # a tensor: a prefix computed in a graph
        return False


def _lock(fd, kind, path):
    """flock(fd, kind), waiting while another rank of this host holds it, up to
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
                    f"tf.train.Checkpoint: another process of this host has held {path}, the lock of "
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
            return call()
        finally:
            os.close(fd)  # and with it the lock


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
