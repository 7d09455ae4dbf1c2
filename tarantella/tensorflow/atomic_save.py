"""Write a file or directory so that an interrupted save never replaces a
good one with a half-written one: write next to the target, then rename."""
import os
import re
import shutil

_TMP_MARK = ".tnt-tmp-"


def _is_local(path):
    return "://" not in path


def _twin_parts(path):
    directory, base = os.path.split(path)
    stem, dot, rest = base.partition(".")
    return directory, f".{stem}{_TMP_MARK}", f"{dot}{rest}"


def temporary_twin(path, pid=None):
    """A path in the same directory (same filesystem, so the rename is atomic)
    whose name ends like `path` (Keras checks suffixes such as `.keras` and
    `.weights.h5`): `.NAME.tnt-tmp-<pid>.keras` for `NAME.keras`."""
    directory, head, tail = _twin_parts(path)
    return os.path.join(directory, f"{head}{os.getpid() if pid is None else pid}{tail}")


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


def remove_stale_twins(path):
    """Remove the temporaries that interrupted saves of `path` left behind
    (killed before their rename or clean-up): those named as
    `temporary_twin(path)` names them, whose process no longer exists. A
    concurrent save's temporary (its process is alive) is left alone; so is
    anything of another target. The pid is looked up on this host: saves of
    one target from several hosts at once are not supported anyway (the last
    rename would win)."""
    directory, head, tail = _twin_parts(path)
    pattern = re.compile(re.escape(head) + r"([0-9]+)" + re.escape(tail) + r"\Z")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return
    for name in names:
        match = pattern.match(name)
        if not match or _process_exists(int(match.group(1))):
            continue
        stale = os.path.join(directory, name)
        try:
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale)
            else:
                os.remove(stale)
        except FileNotFoundError:
            pass  # another save removed it first


def atomic_save(path, save_fn, siblings=False):
    """Call `save_fn(tmp_path)`, then move the result to `path`.

    `siblings`: `save_fn` also writes files beside its target, named after
    it (Keras' weight shards: `NAME_00000.weights.h5` for
    `NAME.weights.json`, listed by name in it). It then writes in a temporary
    directory beside `path`, under `path`'s own name, so that the files get
    their final names; they are moved beside `path` first, `path` itself last
    (each move is atomic, the set of them is not)."""
    path = os.fspath(path)
    if not _is_local(path):
        return save_fn(path)
    remove_stale_twins(path)
    if siblings:
        return _save_with_siblings(path, save_fn, temporary_twin(path))
    tmp = temporary_twin(path)
    try:
        result = save_fn(tmp)
        if os.path.isdir(tmp):
            # a directory cannot replace another atomically: swap it in with two renames
            old = tmp + ".old"
            if os.path.exists(path):
                os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        return result
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)


def _save_with_siblings(path, save_fn, tmp_dir):
    directory, base = os.path.split(path)
    os.makedirs(tmp_dir)
    try:
        result = save_fn(os.path.join(tmp_dir, base))
        for name in sorted(os.listdir(tmp_dir)):
            if name != base:
                os.replace(os.path.join(tmp_dir, name), os.path.join(directory, name))
        os.replace(os.path.join(tmp_dir, base), path)
        return result
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
