"""Write a file or directory so that an interrupted save never replaces a
good one with a half-written one: write next to the target, then rename."""
import ctypes
import errno
import os
import re
import shutil
import socket
import zlib

from tarantella.common.logging import get_logger

_TMP_MARK = ".tnt-tmp-"
_OLD_MARK = ".tnt-old-"  # a replaced directory, moved aside where it could not be exchanged
_OLD_SET_MARK = ".tnt-oldset-"  # a directory holding a replaced file and its siblings (shards)


def _is_local(path):
    return "://" not in path


_NAME_MAX = 255  # bytes in a file name (Linux' file systems)
_PID_ROOM = 12  # "-" and a pid, with room to spare
_TAIL_KEPT = 32  # characters of a long name's end kept: Keras' suffixes are shorter


def _twin_parts(path, mark=_TMP_MARK):
    """(folder, head, tail) of the names of `path`'s twins: head + host-pid +
    tail. A name too long for a twin (Keras saves one of up to 255 bytes)
    keeps the start of its stem and its end, with a digest of the whole name
    between: the twin of a 230-byte name failed with "File name too long",
    where Keras' own save succeeds."""
    directory, base = os.path.split(path)
    stem, dot, rest = base.partition(".")
    head, tail = f".{stem}{mark}", f"{dot}{rest}"
    if len(os.fsencode(head + tail + _host())) + _PID_ROOM > _NAME_MAX:
        digest = f"{zlib.crc32(os.fsencode(base)):08x}"
        head, tail = f".{stem[:16]}~{digest}{mark}", tail[-_TAIL_KEPT:]
    return directory, head, tail


def _host():
    """This host's name, as a temporary's name holds it: a pid says whether a
    save is alive on its own host only, and ranks on several hosts may save
    into one shared directory (tnt_save_all_devices=True): each host's saves
    judge and remove their own host's temporaries only."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


def temporary_twin(path, pid=None, mark=_TMP_MARK):
    """A path in the same directory (same filesystem, so the rename is atomic)
    whose name ends like `path` (Keras checks suffixes such as `.keras` and
    `.weights.h5`): `.NAME.tnt-tmp-<host>-<pid>.keras` for `NAME.keras`."""
    directory, head, tail = _twin_parts(path, mark)
    return os.path.join(directory,
                        f"{head}{_host()}-{os.getpid() if pid is None else pid}{tail}")


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OverflowError:
        return False  # beyond any pid
    return True


def _dead_twins(path, mark):
    """The twins of `path` with `mark` (as `temporary_twin` names them on this
    host, or without a host, as earlier versions did) whose process no longer
    exists, newest first. Another host's are never judged: its pids mean
    nothing here (it removed a save in flight there)."""
    directory, head, tail = _twin_parts(path, mark)
    pattern = re.compile(re.escape(head) + "(?:" + re.escape(_host()) + "-)?([0-9]+)"
                         + re.escape(tail) + r"\Z")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    dead = [os.path.join(directory, name) for name in names
            if (match := pattern.match(name)) and not _process_exists(int(match.group(1)))]
    return sorted(dead, key=_mtime, reverse=True)


def _mtime(path):
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0  # removed meanwhile


def _remove(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass  # another save removed it first


def remove_stale_twins(path):
    """Remove the temporaries that interrupted saves of `path` left behind
    (killed before their rename or clean-up): those named as
    `temporary_twin(path)` names them, whose process no longer exists. A
    concurrent save's temporary (its process is alive) is left alone; so is
    anything of another target, and another host's temporaries (their pid
    cannot be looked up here): saves of one target from several hosts at once
    (tnt_save_all_devices=True into a shared directory) each rename their own
    whole file, the last rename wins.

    A directory a save moved aside (`_swap_in` where the exchange is refused)
    is the user's last good save if that save was killed before moving the
    new one in: with `path` missing it is put back (and said so), otherwise
    it is stale. So is the directory in which a sharded save moved the old
    file and its shards aside (`_save_with_siblings`): its files are moved
    back."""
    for old in _dead_twins(path, _OLD_MARK):
        if not os.path.lexists(path):
            try:
                os.rename(old, path)
                get_logger().warning(f"{path} was missing: a save of it was interrupted after "
                                     f"moving it aside; restored it from {old}")
                continue
            except OSError:
                pass  # another save put one there first
        _remove(old)
    for old in _dead_twins(path, _OLD_SET_MARK):
        if not os.path.lexists(path):
            try:
                _put_set_back(old, path)
            except OSError:
                continue  # kept: explain_missing names it
            get_logger().warning(f"{path} was missing: a save of it was interrupted after "
                                 f"moving it and its shards aside; restored them from {old}")
        _remove(old)
    for stale in _dead_twins(path, _TMP_MARK):
        _remove(stale)


def explain_missing(error, path):
    """`error` (a load of `path` failed), or, where `path` is missing because
    a save was killed after moving it aside (see remove_stale_twins), a
    FileNotFoundError that names where the user's last good save is. Never
    raises (it runs on one rank's failure, before the ranks agree)."""
    try:
        path = os.fspath(path)
    except TypeError:
        return error  # a file object
    if not _is_local(path) or os.path.lexists(path):
        return error
    aside = _dead_twins(path, _OLD_MARK) + _dead_twins(path, _OLD_SET_MARK)
    if not aside:
        return error
    explained = FileNotFoundError(
        f"{path} is missing because a save of it was interrupted: the last good save is "
        f"{aside[0]} (the next save of {path} puts it back; or rename it yourself). "
        f"The load raised: {error}")
    explained.__cause__ = error
    return explained


def atomic_save(path, save_fn, siblings=False):
    """Call `save_fn(tmp_path)`, then move the result to `path`.

    `siblings`: `save_fn` also writes files beside its target, named after
    it (Keras' weight shards: `NAME_00000.weights.h5` for
    `NAME.weights.json`, listed by name in it). It then writes in a temporary
    directory beside `path`, under `path`'s own name, so that the files get
    their final names; they are moved beside `path` first, `path` itself last,
    after the old `path` and its siblings were moved aside together (see
    _save_with_siblings)."""
    path = os.fspath(path)
    if not _is_local(path):
        return save_fn(path)
    if siblings:
        remove_stale_twins(path)
        return _save_with_siblings(path, save_fn, temporary_twin(path))
    path = _through_link(path)
    remove_stale_twins(path)
    _refuse_read_only(path)
    tmp = temporary_twin(path)
    try:
        result = save_fn(tmp)
        _keep_permissions(path, tmp)
        if os.path.isdir(tmp):
            _refuse_file_in_place(path)
            _refuse_losing_other_files(path, tmp)
            _swap_in(tmp, path)
        else:
            os.replace(tmp, path)
        return result
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)


def _through_link(path):
    """Where a save of `path` writes: a symbolic link's target, as Keras'
    own save writes through the link (open follows it). Renamed over the
    link itself, the new file replaced the link in its folder (on the file
    system of the link, not of its target) and the target kept the old
    model, which whoever read it (through another path) took for the saved
    one. A dangling link's target is created, as open creates it."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _refuse_read_only(path):
    """The PermissionError Keras' own save raises for an existing file this
    process may not write (`chmod a-w`, set to keep a checkpoint): a rename
    needs the folder's permission only, so the file was replaced without a
    word. Root may write it, as it may open it."""
    if os.path.isfile(path) and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "Permission denied (the file is read-only; Keras' "
                              "save would fail to open it too)", path)


def _refuse_file_in_place(path):
    """The error Keras' own directory save (`zipped=False`, `export`) raises
    where `path` is a file (`model.export("model.keras")` of the user's saved
    model): it cannot make the directory. The exchange (or the rename) swapped
    the directory in and removed the user's file."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory (the save writes a directory, "
                                 "and a file of this name is in its place; Keras' own save fails "
                                 "alike)", path)


def _refuse_losing_other_files(path, new):
    """An OSError where the directory `path`, which the new directory `new`
    replaces whole, holds entries the save does not write (the job's logs in
    `model.export(output_dir)`): Keras' own directory save writes into the
    directory and leaves them; the exchange removed them with the old
    directory, without a word. The save's own entries (a SavedModel's, a
    `zipped=False` model's) are replaced as before."""
    if not os.path.isdir(path):
        return
    others = sorted(set(os.listdir(path)) - set(os.listdir(new)))
    if others:
        shown = ", ".join(others[:5]) + (f", ... ({len(others)} in all)" if len(others) > 5 else "")
        raise OSError(errno.ENOTEMPTY, f"Directory not empty: it holds {shown}, which this save "
                      "does not write: the save replaces the directory whole (atomically), so it "
                      "would remove them (Keras' own save writes into the directory and keeps "
                      "them). Save to a directory of its own, or move them away first", path)


def _keep_permissions(path, new):
    """Give the new file `new` the mode (and, where allowed, the group) of the
    file at `path` that it replaces: Keras' own save rewrites the file in
    place, which keeps them; a new file had the umask's (a checkpoint shared
    with a group as 0640 came out 0644, or 0600)."""
    try:
        old = os.stat(path)
    except OSError:
        return  # nothing to replace
    if not (os.path.isfile(path) and os.path.isfile(new)):
        return
    if os.stat(new).st_gid != old.st_gid:
        try:
            os.chown(new, -1, old.st_gid)
        except OSError:
            pass  # not a member of that group: as a new file gets it
    os.chmod(new, old.st_mode & 0o7777)  # after chown, which may clear set-id bits


def _swap_in(new, path):
    """Put the directory `new` at `path`. rename() cannot replace a non-empty
    directory: the two are exchanged in one step where the file system can
    (Linux renameat2 RENAME_EXCHANGE), so that `path` holds the old directory
    or the new one at every instant, then the old one (now at `new`) is
    removed. Elsewhere the old one is moved aside first, as
    `.NAME.tnt-old-<host>-<pid>`: a kill between the two renames leaves it there, and
    the next save puts it back (remove_stale_twins)."""
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)
        return
    old = temporary_twin(path, mark=_OLD_MARK)
    moved = os.path.lexists(path)
    if moved:
        os.replace(path, old)
    try:
        os.replace(new, path)
    except Exception:
        if moved:
            os.replace(old, path)
        raise
    if moved:
        _remove(old)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
# errors for "this file system (or kernel, or libc) cannot exchange": rename instead
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                    errno.ENOENT}  # ENOENT: no old directory, nothing to exchange with
_renameat2 = []


def _exchange(a, b):
    """Exchange the paths `a` and `b` atomically; False where that is not
    possible here (not Linux, an old libc, a file system that refuses it, or
    `b` missing), for the caller to rename instead."""
    if not _renameat2:
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                 ctypes.c_uint]
        except (OSError, AttributeError):
            function = None
        _renameat2.append(function)
    if _renameat2[0] is None:
        return False
    if _renameat2[0](_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), a, None, b)


def _save_with_siblings(path, save_fn, tmp_dir):
    """See atomic_save. The old file and its siblings are moved aside first,
    into one directory (`.NAME.tnt-oldset-<host>-<pid>.weights.json`), the file
    first: the shards keep Keras' names (NAME_00000.weights.h5, ...), so a
    kill while the new ones replaced them one by one left the old file over a
    mix of new and old shards, which loaded without a word. Now a kill in the
    moves leaves no NAME: the next save puts the old set back
    (remove_stale_twins), a load says where it is (explain_missing); an error
    puts it back at once."""
    directory, base = os.path.split(path)
    os.makedirs(tmp_dir)
    aside = None
    try:
        result = save_fn(os.path.join(tmp_dir, base))
        if os.path.lexists(path):
            aside = temporary_twin(path, mark=_OLD_SET_MARK)
            os.makedirs(aside)
            os.replace(path, os.path.join(aside, base))  # first: from here on, no mix loads
            for name in _siblings(directory, base):
                os.replace(os.path.join(directory, name), os.path.join(aside, name))
        for name in sorted(os.listdir(tmp_dir)):
            if name != base:
                os.replace(os.path.join(tmp_dir, name), os.path.join(directory, name))
        os.replace(os.path.join(tmp_dir, base), path)
    except Exception:
        if aside is not None:
            _put_set_back(aside, path)  # where this fails too, the set stays aside (kept)
            os.rmdir(aside)
        raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return result


def _siblings(directory, base):
    """The files beside `base` (NAME.weights.json) that Keras names after it:
    its shards, NAME_<index>.weights.h5 (saving_lib.ShardedH5IOStore)."""
    stem = os.path.splitext(base)[0].replace(".weights", "")  # Keras' base_name
    pattern = re.compile(re.escape(stem) + r"_[0-9]{5,}\.weights\.h5\Z")
    return sorted(name for name in os.listdir(directory or ".") if pattern.match(name))


def _put_set_back(aside, path):
    """Move the files of `aside` (see _save_with_siblings) back beside `path`,
    `path` itself last. Shards of the interrupted save with higher indices may
    stay beside it: the old file does not list them, the next save removes
    them with it."""
    directory, base = os.path.split(path)
    for name in sorted(os.listdir(aside)):
        if name != base:
            os.replace(os.path.join(aside, name), os.path.join(directory, name))
    if os.path.lexists(os.path.join(aside, base)):
        os.replace(os.path.join(aside, base), path)
