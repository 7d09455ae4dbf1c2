"""Write a file or directory so that an interrupted save never replaces a
good one with a half-written one: write next to the target, then rename."""
import os
import shutil


def _is_local(path):
    return "://" not in path


def temporary_twin(path):
    """A path in the same directory (same filesystem, so the rename is atomic)
    whose name ends like `path` (Keras checks suffixes such as `.keras` and
    `.weights.h5`)."""
    directory, base = os.path.split(path)
    stem, dot, rest = base.partition(".")
    return os.path.join(directory, f".{stem}.tnt-tmp-{os.getpid()}{dot}{rest}")


def atomic_save(path, save_fn):
    """Call `save_fn(tmp_path)`, then move the result to `path`."""
    path = os.fspath(path)
    if not _is_local(path):
        return save_fn(path)
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
