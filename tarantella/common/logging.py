"""The "tarantella" logger: level from TNT_LOG_LEVEL, master rank only unless
TNT_LOG_ON_ALL_DEVICES is true, lines prefixed with the rank."""
import logging as _logging
import os
import sys

from tarantella.common import config, engine_ranks

logger = _logging.getLogger("tarantella")
_configured = False


class _RankFilter(_logging.Filter):
    def __init__(self, rank, all_ranks, master):
        super().__init__()
        self.rank, self.all_ranks, self.master = rank, all_ranks, master

    def filter(self, record):
        record.tnt_rank = self.rank
        # errors of any rank are always shown: they are what a user needs after a crash
        return self.all_ranks or self.rank == self.master or record.levelno >= _logging.ERROR


def configure(rank, master=0):
    """(Re)configure the logger for this rank; called by init()."""
    global _configured
    level = config.get("TNT_LOG_LEVEL")
    all_ranks = config.get("TNT_LOG_ON_ALL_DEVICES")
    for handler in list(logger.handlers):
        if getattr(handler, "_tnt", False):
            logger.removeHandler(handler)
    handler = _logging.StreamHandler(sys.stderr)
    handler._tnt = True
    handler.setFormatter(_logging.Formatter("[TNT %(levelname)s rank %(tnt_rank)s] %(message)s"))
    handler.addFilter(_RankFilter(rank, all_ranks, master))
    logger.addHandler(handler)
    logger.setLevel(getattr(_logging, level))
    logger.propagate = False
    _configured = True


def get_logger():
    if not _configured:
        # before init(): the rank tntrun or the engine gave (under a bare mpirun or srun every
        # rank was labelled, and shown as, rank 0)
        rank = config.get("TNT_RANK")
        configure(rank=rank if rank is not None else engine_ranks.engine_rank(os.environ) or 0)
    return logger
