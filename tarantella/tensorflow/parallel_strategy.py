"""How a tnt.Model is parallelized."""
import enum


class ParallelStrategy(enum.Flag):
    """`DATA`: every rank holds the whole model and a slice of each global
    batch (the only strategy implemented). `PIPELINING` (split the model
    across ranks) is reserved; asking for it raises NotImplementedError."""

    NONE = 0
    DATA = enum.auto()
    PIPELINING = enum.auto()
    ALL = DATA | PIPELINING
