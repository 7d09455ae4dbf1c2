"""What one step of tnt.Model knows about the global batch.

A train or test step runs on this rank's micro-batch of b_r samples, but some
quantities of the serial step are global: the global batch B = Σ b_r, this
rank's offset in it, the normaliser of a loss that is not a plain batch mean
(the number of unmasked time steps, the sum of sample weights), the batch
statistics of a synchronised BatchNormalization. The step context computes them
with small float64 allreduces, issued where the forward (or backward) pass
first needs them, once per step each.

A rank whose slice of the last, partial batch is empty does not run the model
(tnt.Model's empty branch), yet it must take part in every collective the other
ranks issue, in the same order. Every allreduce issued through the context is
logged while the real branch is traced (tf.cond traces it first); the empty
branch calls `replay()`, which issues the same requests with zero
contributions. Stateful ops run in program order (automatic control
dependencies), so the order is the same on every rank.

Request names are the step's own sequence numbers ("tnt.step.3.loss"), never
per-process counters of layers or models: a rank that built, loaded or
compiled something the others did not still names the step's requests alike.
Steps never overlap, so the names repeat from step to step (the core's
negotiation cache then recognises them).
"""
import contextlib
import threading

import numpy as np
import tensorflow as tf

from tarantella.common import collectives, core
from tarantella.tensorflow import collective_ops
from tarantella.tensorflow import ops as tf_ops

_local = threading.local()


def _allreduce_sum_op(values, name):
    """Σ_r values over all ranks (a 1-D float64 tensor of static length): the
    compiled op where it is available, else a tf.numpy_function (TNT_TF_OPS)."""
    compiled = tf_ops.get()
    if compiled is not None:
        return compiled.run("allreduce", [values], [name])[0]

    @collective_ops.reporting
    def reduce(array):
        return collectives.allreduce(np.ascontiguousarray(array), op="sum", name=name)

    out = tf.numpy_function(reduce, [values], tf.float64, stateful=True, name="TntStepSum")
    out.set_shape(values.shape)
    return out


class StepContext:
    """One traced step: this rank's micro-batch size and the collectives the
    step issued through `allreduce_sum`."""

    def __init__(self, local_batch):
        self.local_batch = tf.cast(local_batch, tf.float64)
        self._sizes = None
        self._replaying = False
        self._replayed_sizes = False  # replaying a real branch that summed the sizes
        self._log = []  # (name, length, on_replay) of each allreduce, or a _Call, in program order
        self._in_replay = False  # the empty branch is being traced: its calls are not logged
        self._on_replay = []  # what the empty branch must also do (advance seed generators)
        self.values = {}  # what parts of the step share (e.g. the loss scale folding)

    def allreduce_sum(self, values, purpose, on_replay=None):
        """Σ_r of a 1-D float64 tensor of static length, logged for replay.
        `on_replay(summed)` is called with the sum the empty branch gets (the
        other ranks' contributions), for state that the real branch updates
        from it (synchronised BatchNormalization's moving statistics)."""
        values = tf.convert_to_tensor(values, tf.float64)
        length = values.shape.num_elements()
        if values.shape.rank != 1 or length is None:
            raise ValueError(f"allreduce_sum takes a 1-D tensor of static length. Received: "
                             f"shape={values.shape}")
        # numbered among the step's own requests only: a rank run eagerly logs no _Call
        name = f"tnt.step.{sum(not isinstance(e, _Call) for e in self._log)}.{purpose}"
        self._log.append((name, length, on_replay))
        return _allreduce_sum_op(values, name)

    def _onehot_size(self):
        return tf.one_hot(core.get_rank(), core.get_size(), dtype=tf.float64) * self.local_batch

    def sizes(self):
        """Every rank's micro-batch size (float64, [ranks]), from one allreduce
        made at the first call in the step."""
        if self._replaying:
            return tf.zeros([core.get_size()], tf.float64)
        if self._sizes is None:
            self._sizes = self.allreduce_sum(self._onehot_size(), "sizes")
        return self._sizes

    def knows_sizes(self):
        """Whether the step has already summed the sizes (the real branch did,
        when replaying)."""
        return self._sizes is not None or self._replayed_sizes

    def sum_with_sizes(self, values, purpose, on_replay=None):
        """allreduce_sum(values), in the same request as the sizes when they
        are not summed yet."""
        if self._sizes is not None or self._replaying:
            return self.allreduce_sum(values, purpose, on_replay)
        size = core.get_size()
        consume = None if on_replay is None else lambda summed: on_replay(summed[size:])
        both = self.allreduce_sum(tf.concat([self._onehot_size(), values], 0), purpose, consume)
        self._sizes = both[:size]
        return both[size:]

    def global_batch(self):
        """Σ_r b_r (float64); 0 in the empty branch (whose contributions are all 0)."""
        return tf.reduce_sum(self.sizes())

    def offset(self):
        """This rank's first sample in the global batch (float64)."""
        return tf.reduce_sum(self.sizes()[:core.get_rank()])

    def log_call(self, function, applies_before):
        """Have the empty branch call `function()` where the real branch made one of the TF-level
        collectives (tnt.allreduce, broadcast, allgather of a custom layer, metric or train_step),
        in program order with the step's own requests, after `applies_before` optimizer applies.
        Not replayed, a rank with an empty slice skipped such a call and every rank waited until
        TNT_TIMEOUT_S (a layer that subtracts the global batch mean, a metric whose result() sums
        over ranks)."""
        if not (self._replaying or self._in_replay):
            self._log.append(_Call(function, applies_before))

    def on_replay(self, function):
        """Have the empty branch call `function()` too (e.g. draw a seed, so that
        a random layer's state advances on every rank alike)."""
        self._on_replay.append(function)

    def requests(self):
        """What `replay` issues: the logged requests, the replay hooks, and
        whether the step summed the sizes (so that the empty branch, like the
        real one, makes no request of its own for the gradients' total weight)."""
        return list(self._log), list(self._on_replay), self._sizes is not None

    def replay(self, previous=None, applies=()):
        """Issue the logged requests with zero contributions (the empty branch), and call
        `applies` (the optimizer applies of the real branch, with zero gradients), each where
        the real branch made it among the logged TF-level collectives (log_call).
        Afterwards the context only answers with constants: tensors of the
        real branch's graph cannot be used in this one. Run eagerly, only one
        branch runs, so nothing was logged in this step: `previous` (an
        earlier step's `requests()`) says what the real branch issues."""
        if self._log or not previous:
            log, hooks, self._replayed_sizes = self._log, self._on_replay, self._sizes is not None
        else:
            log, hooks, self._replayed_sizes = previous
        applies = list(applies)
        done = 0
        self._in_replay = True
        try:
            for entry in list(log):
                if isinstance(entry, _Call):
                    while done < min(entry.applies_before, len(applies)):
                        self._replaying = True  # an apply of the empty branch asks for no sizes
                        applies[done]()
                        done += 1
                    entry.function()
                    continue
                name, length, consume = entry
                summed = _allreduce_sum_op(tf.zeros([length], tf.float64), name)
                if consume is not None:
                    consume(summed)
            for function in list(hooks):
                function()
            self._replaying = True
            for apply in applies[done:]:
                apply()
        finally:
            self._in_replay = False


class _Call:
    """A TF-level collective of the real branch, for the empty branch to make (log_call)."""

    def __init__(self, function, applies_before):
        self.function, self.applies_before = function, applies_before


def current():
    """The StepContext of the step being traced on this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def step(local_batch):
    """Make a StepContext current while a step is traced."""
    context = StepContext(local_batch)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(context)
    try:
        yield context
    finally:
        stack.pop()


def allreduce_sum(values, purpose):
    """Σ_r `values` through the current step (logged for the empty branch) or,
    outside a tnt.Model step (a custom training loop), as a plain request."""
    context = current()
    if context is not None:
        return context.allreduce_sum(values, purpose)
    return _allreduce_sum_op(tf.convert_to_tensor(values, tf.float64), f"tnt.loop.{purpose}")
