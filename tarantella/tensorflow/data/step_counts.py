"""Whether every rank will take the same number of steps in fit, evaluate and
predict.

Every step is collective (the gradient allreduce, the global metrics, the
gathered predictions): a rank whose data runs out first ends its epoch while
the others wait in their next step, and the job stopped only at TNT_TIMEOUT_S
(300 s by default) with a message about a tensor nobody submitted. Ranks load
their data on their own (a file of their own, their own shard with
`tnt_distribute_dataset=False`, a pipeline built from the rank), so the ranks
compare what fixes their step counts, in two small allgathers:

1. before anything else is distributed, the arguments (`epochs`,
   `steps_per_epoch`, ...) and the type of each input, which decide which
   collectives distributing them takes (same_arguments: a Group that rides in
   the call agreement's allgather, call_agreement.py);
2. after, the number of batches of each input where it is known and no
   argument sets the steps (check_same_batches): a tf.data pipeline's
   cardinality, arrays' length over the batch size. A count tf.data cannot
   know (after `filter`, from a generator) is not compared.

Either raises the same MismatchError on every rank.
"""
import numbers
import zlib

import keras
import numpy as np
import tensorflow as tf

from tarantella.common import collectives, core
from tarantella.common.errors import MismatchError

UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)  # -2: not known, so not compared
INFINITE = int(tf.data.INFINITE_CARDINALITY)  # -1
_NONE = -3  # an argument left at None
KINDS = ("None", "a tf.data.Dataset", "arrays", "another input")  # what `input_kind` says
# the calls that compare what they are (call_agreement.py)
CALLS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch",
         "save", "save_weights", "load_weights", "load_model", "export", "set_weights",
         "tf.saved_model.save", "BackupAndRestore")
# the words a value can be (shuffle="batch", the call's name)
_WORDS = KINDS + ("False", "True", "batch") + CALLS
_WORD_BASE = -10  # _WORDS[i] travels as _WORD_BASE - i
_OTHER_BASE = -(1 << 40)  # any other value: below it, by a CRC of its repr

_ADVICE = (
    "Every step is collective, so the ranks would wait for each other until TNT_TIMEOUT_S. Give "
    "every rank the same data and arguments; where each rank feeds its own shard "
    "(tnt_distribute_dataset=False), make the shards the same number of batches (e.g. "
    "`dataset.take(n)`), or pass the number of steps")


def input_kind(x):
    """Which of KINDS `x` is (ranks that pass different kinds take different
    paths, and different collectives)."""
    if x is None:
        return KINDS[0]
    if isinstance(x, tf.data.Dataset):
        return KINDS[1]
    leaves = [t for t in tf.nest.flatten(x) if t is not None]
    if leaves and all(hasattr(t, "shape") or isinstance(t, list) or np.isscalar(t) for t in leaves):
        return KINDS[2]
    return KINDS[3]


def batches(x, batch_size=None):
    """The number of batches Keras will draw from `x`: a tf.data.Dataset's
    cardinality, arrays' samples over `batch_size` (Keras' 32 when None), 0
    for no input, a PyDataset's num_batches, or UNKNOWN (a generator, an endless PyDataset)."""
    kind = input_kind(x)
    if kind == KINDS[0]:
        return 0
    if kind == KINDS[1]:
        return int(x.cardinality())
    if isinstance(x, keras.utils.PyDataset):
        return UNKNOWN if x.num_batches is None else int(x.num_batches)
    if kind != KINDS[2]:
        return UNKNOWN
    samples = int(np.shape(tf.nest.flatten(x)[0])[0])
    return -(-samples // (32 if batch_size is None else int(batch_size)))


def _encoded(value):
    """An argument as one int64 that the other ranks can compare and show."""
    if value is None:
        return _NONE
    if isinstance(value, (bool, np.bool_)):
        value = str(bool(value))
    elif isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str) and value in _WORDS:
        return _WORD_BASE - _WORDS.index(value)
    if isinstance(value, dict):  # class_weight: the same whatever order it was built in
        value = sorted(value.items(), key=repr)
    return _OTHER_BASE - zlib.crc32(repr(value).encode())


def _shown(value):
    if value <= _WORD_BASE:
        word = _WORDS[_WORD_BASE - value]
        return repr(word) if word == "batch" else word
    return {UNKNOWN: "unknown", INFINITE: "infinite", _NONE: "None"}.get(value, str(value))


class Group:
    """Labels compared in one round of `compare_groups`, and how a difference
    reads: `lead`, each differing label with the ranks' values, then `advice`;
    or `message(every)` (the ranks' values, one row per rank) where given.
    With `skip_unknown`, a label that is None (not counted) or UNKNOWN on some
    rank is not compared."""

    def __init__(self, values, lead=None, advice=None, skip_unknown=False, message=None):
        self.values, self.lead, self.advice = values, lead, advice
        self.skip_unknown, self.message = skip_unknown, message


def compare(name, values, lead, advice, skip_unknown=False):
    """Collective: MismatchError on every rank unless every rank has the same
    `values` (label -> int, bool, None, one of _WORDS, or any other value,
    compared by a CRC of its repr; the labels the same on every rank), which
    reads `lead`, each differing label with the ranks' values, then `advice`.
    With `skip_unknown`, a label that is None (not counted) or UNKNOWN on some
    rank is not compared; returns the labels that were UNKNOWN somewhere."""
    return compare_groups(name, [Group(values, lead, advice, skip_unknown)])


def compare_groups(name, groups):
    """`compare` of several Groups in one allgather (one round where there
    were as many as groups): the MismatchError is the first differing group's,
    as if each had been compared in turn. Only the first group's labels must be
    the same on every rank: it says which call this is, which decides the
    others' (a rank in evaluate sends fewer than one in fit, which then differ
    in the first group). Returns the labels that were UNKNOWN somewhere."""
    if core.get_size() == 1:
        return []
    return check_groups(name, groups, gather_groups(name, groups))


def gather_groups(name, groups):
    """Collective: every rank's values of `groups`, encoded: one array a rank
    (of other lengths where the ranks are in other calls)."""
    encoded = [_encoded(v) for g in groups for v in g.values.values()]
    gathered = collectives.allgather(np.array([len(encoded)] + encoded, np.int64), name=name)
    rows, at = [], 0
    while at < len(gathered):  # each rank's values, after their count
        rows.append(gathered[at + 1:at + 1 + int(gathered[at])])
        at += 1 + int(gathered[at])
    return rows


def check_groups(name, groups, rows):
    """`compare_groups` on the `rows` gather_groups(name, groups) returned."""
    unknown, begin = [], 0
    for g in groups:
        end = begin + len(g.values)
        if any(len(r) < end for r in rows):  # only after a first group that agreed: a bug here
            raise MismatchError(f"{name}: the ranks compared different values ({[len(r) for r in rows]})")
        unknown += _check_group(g, np.stack([r[begin:end] for r in rows]))
        begin = end
    if any(len(r) != begin for r in rows):
        raise MismatchError(f"{name}: the ranks compared different values ({[len(r) for r in rows]})")
    return unknown


def _check_group(group, every):
    """The MismatchError of `group` whose ranks' values are `every` (one row a
    rank); else its labels that were UNKNOWN somewhere."""
    labels = list(group.values)
    unknown = [labels[i] for i in range(len(labels)) if (every[:, i] == UNKNOWN).any()]
    skip = group.skip_unknown
    skipped = lambda i: skip and ((every[:, i] == UNKNOWN) | (every[:, i] == _NONE)).any()
    differ = [i for i in range(len(labels)) if (every[:, i] != every[0, i]).any() and not skipped(i)]
    if differ:
        if group.message is not None:
            raise MismatchError(group.message(every))
        said = "; ".join(_differing(labels[i], every[:, i]) for i in differ)
        raise MismatchError(f"{group.lead}: {said}. {group.advice}")
    return unknown


def _differing(label, values):
    """How `values` (one per rank) differ: each rank's, or which ranks differ
    from rank 0 where a value cannot be shown (a dict, a bad value)."""
    if (values <= _OTHER_BASE).any():
        return f"{label} (ranks {np.flatnonzero(values != values[0]).tolist()} differ from rank 0)"
    return f"{label} (" + ", ".join(f"rank {r}: {_shown(int(v))}" for r, v in enumerate(values)) + ")"


def same_arguments(what, arguments):
    """The Group (for call_agreement.check) that fails unless the ranks pass
    the same `arguments` to `what` (label -> int, bool, None, one of KINDS or
    "batch"; any other value, such as class_weight, is compared by a CRC of
    its repr)."""
    return Group(arguments, _lead(what), _ADVICE)


def check_same_batches(what, counts):
    """Collective: the same MismatchError on every rank unless the ranks'
    inputs have the same numbers of batches (label -> count; None, not
    counted on purpose, or UNKNOWN on any rank: not compared). Returns what
    `timeout_hint` needs: the labels tf.data could not count on some rank."""
    return compare(f"tnt.steps.{what}.batches", counts, _lead(what), _ADVICE, skip_unknown=True)


def _lead(what):
    return f"the ranks would take different numbers of steps in {what}"


def timeout_hint(uncounted):
    """A sentence for a TimeoutError of a call whose inputs `uncounted` (from
    check_same_batches) could not be compared, or None."""
    if not uncounted:
        return None
    return (f"If the ranks' data differ in length, this is how they stop: tf.data could not count "
            f"{' and '.join(uncounted)} (a filter, a generator), so the ranks could not compare "
            "them before the first step; give every rank the same number of batches, or pass the "
            "number of steps.")
