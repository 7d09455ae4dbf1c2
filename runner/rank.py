"""The rank wrapper that engines start on every host (python -m tarantella.runner.rank).

It reads the placement the engine gives (OpenMPI, MPICH/Hydra, Slurm, GPI-2 variables),
exports it as the TNT_* contract, makes the choices that depend on the host the rank runs
on (its GPU, its NUMA node, whether its stdout is shown), then replaces itself with the
user's program (exec), so the engine supervises the program directly.
"""
import argparse
import os
import sys

from tarantella.runner import gpus, pinning

# (rank, size, local rank, local size) variables of each engine, most specific first
_ENGINES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ("GASPI_RANK", "GASPI_NRANKS", None, None),
)


def placement(environ, per_node=None, size=None):
    """(rank, size, local_rank, local_size) from the engine's variables; a missing local
    rank is derived from `per_node` (engines place ranks host by host, in order)."""
    for rank_v, size_v, lrank_v, lsize_v in _ENGINES:
        if rank_v in environ:
            rank = int(environ[rank_v])
            total = int(environ.get(size_v) or size or 1)
            per = per_node or total
            local_rank = int(environ[lrank_v]) if lrank_v and lrank_v in environ else rank % per
            local_size = int(environ[lsize_v]) if lsize_v and lsize_v in environ else per
            return rank, total, local_rank, local_size
    return 0, size or 1, 0, per_node or 1


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="tarantella.runner.rank")
    p.add_argument("--per-node", type=int)
    p.add_argument("--size", type=int)
    p.add_argument("--output-all", action="store_true")
    p.add_argument("--no-gpu", action="store_true")
    p.add_argument("--pin-cpu", action="store_true")
    p.add_argument("--pin-memory", action="store_true")
    opts = p.parse_args(argv[:cut])
    command = argv[cut + 1:]
    env = os.environ
    rank, size, local_rank, local_size = placement(env, opts.per_node, opts.size)
    env.update(TNT_RANK=str(rank), TNT_SIZE=str(size), TNT_LOCAL_RANK=str(local_rank),
               TNT_LOCAL_SIZE=str(local_size))
    if opts.no_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        ids = gpus.detect(env)
        if ids:
            # one GPU per rank, or none for every rank when ranks outnumber GPUs (CPU run)
            env["CUDA_VISIBLE_DEVICES"] = ids[local_rank] if local_size <= len(ids) else ""
    if opts.pin_cpu or opts.pin_memory:
        command = pinning.pinned_argv_of(command, opts.pin_cpu, opts.pin_memory, local_size)(local_rank)
    if rank != 0 and not opts.output_all:
        # only the master's output is shown; stderr stays, so errors of any rank reach the engine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"tntrun (rank {rank}): cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
