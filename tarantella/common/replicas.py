"""Whether state that every rank must hold alike (a data-parallel model's
weights, its optimizer's variables) is still the same on every rank.

Nothing in the collectives can see that one rank changed its copy on its own:
a callback that sets the learning rate on the master only, or edits a weight
on one rank, leaves every later step summing gradients of different models,
and training goes on without a word, unlike serial training. `check` compares
a fingerprint of each array across the ranks (two small allgathers) and
raises the same MismatchError on every rank when any differs, naming it. The
same check compares the arrays that every rank passes to `fit`, each taking
its slice of every global batch from its own copy.

A fingerprint is the wrapping sum of the array's bytes read as 64-bit words
(zero-padded), and their wrapping sum weighted by position (word i times
2i + 1), at about memory speed: any difference of one word changes both, and
the ranks' copies are meant to be bitwise identical (they apply the same
summed gradients), so no tolerance is needed. The weights make it see order:
the sum and XOR it had before did not, so arrays whose rows each rank had
shuffled on its own (a permutation without a common seed) passed as the same,
and fit trained each rank on its slice of its own order, without a word.
"""
import zlib

import numpy as np

from tarantella.common import collectives
from tarantella.common.errors import MismatchError

_MAX_NAMED = 3  # differing items named in the message; the rest are counted


_CHUNK = 1 << 20  # words weighted at a time: the weights of one chunk are 8 MiB, made once
_WEIGHTS = None


def fingerprint(array):
    """(wrapping sum, position-weighted wrapping sum) of `array`'s bytes as
    64-bit words: see the module's docstring."""
    global _WEIGHTS
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if raw.size % 8:
        raw = np.concatenate([raw, np.zeros(8 - raw.size % 8, np.uint8)])
    words = raw.view(np.uint64)
    if not words.size:
        return 0, 0
    if _WEIGHTS is None:
        _WEIGHTS = np.arange(1, 2 * _CHUNK, 2, dtype=np.uint64)  # 2i + 1
    total, weighted = np.uint64(0), np.uint64(0)
    with np.errstate(over="ignore"):  # wrapping, as meant
        for start in range(0, words.size, _CHUNK):
            chunk = words[start:start + _CHUNK]
            part = np.add.reduce(chunk, dtype=np.uint64)
            # sum of (2(start + j) + 1) * w_j = 2 * start * sum(w) + sum((2j + 1) * w_j)
            weighted = weighted + np.uint64(2 * start) * part + np.dot(chunk, _WEIGHTS[:chunk.size])
            total = total + part
    return int(total), int(weighted)


def _is_number(array):
    """One bool, integer or float: its value is shown in the message."""
    return array.size == 1 and array.dtype.kind in "biuf"


def _scalar_bits(array):
    """A number as float64 bits, for the other ranks' messages, else 0."""
    return int(np.array(float(array.reshape(-1)[0]), np.float64).view(np.uint64)) if _is_number(array) else 0


def _shown(bits, array):
    value = float(np.array(bits, np.uint64).view(np.float64))
    return int(value) if array.dtype.kind in "biu" else value


def check(items, lead, advice, name="tnt.replicas", compare_labels=True):
    """Collective: raise MismatchError on every rank unless every rank's
    `items` (a list of (label, numpy array), in the same order on every rank)
    are the same bits. The message is `lead`, what differs, then `advice`.
    `compare_labels=False`: the labels only name the arrays in the message
    (variable paths such as "sequential_3/dense_5/kernel" come from
    per-process name counters, so a rank that built one more model than the
    others labels the same variables differently)."""
    arrays = [np.asarray(a) for _, a in items]
    layout = ", ".join(f"{label} {a.dtype.name}{a.shape}" for (label, _), a in zip(items, arrays))
    compared = layout if compare_labels else ", ".join(f"{a.dtype.name}{a.shape}" for a in arrays)
    header = np.array([len(arrays), zlib.crc32(compared.encode())], np.int64)
    headers = collectives.allgather(header, name=f"{name}.layout").reshape(-1, 2)
    if (headers != headers[0]).any():
        ranks = [r for r in range(len(headers)) if (headers[r] != headers[0]).any()]
        raise MismatchError(
            f"{lead}: ranks {ranks} differ from rank 0 in the number, shapes or dtypes of the "
            f"arrays (rank 0: {int(headers[0][0])} arrays, rank {ranks[0]}: "
            f"{int(headers[ranks[0]][0])}; this rank's: {layout[:300]}). {advice}")
    mine = np.array([(*fingerprint(a), _scalar_bits(a)) for a in arrays], np.uint64).reshape(-1, 3)
    every = collectives.allgather(mine.reshape(-1).view(np.int64), name=f"{name}.state")  # no uint64 in the core
    every = every.view(np.uint64).reshape(len(headers), -1, 3)
    apart = (every[:, :, :2] != every[0, :, :2]).any(axis=2)  # [rank, item]: not rank 0's fingerprint
    differ = np.flatnonzero(apart.any(axis=0)).tolist()
    if not differ:
        return
    said = []
    for i in differ[:_MAX_NAMED]:
        if _is_number(arrays[i]):
            said.append(f"{items[i][0]} (" + ", ".join(
                f"rank {r}: {_shown(every[r, i, 2], arrays[i])}" for r in range(len(every))) + ")")
        else:
            said.append(f"{items[i][0]} (ranks {np.flatnonzero(apart[:, i]).tolist()} differ from rank 0)")
    more = f", and {len(differ) - _MAX_NAMED} more" if len(differ) > _MAX_NAMED else ""
    raise MismatchError(f"{lead}: " + "; ".join(said) + more + f". {advice}")
