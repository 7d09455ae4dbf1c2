"""Where each launch engine says which rank a process is: the (rank, size,
local rank, local size) variables of GPI-2, Open MPI, MPICH/Hydra and Slurm,
most specific first. GPI-2's come before Slurm's: gaspi_run in an sbatch
script inherits the script's SLURM_PROCID=0 (core/src/params.c reads them in
the same order). The rank wrapper (runner/rank.py) exports them as TNT_RANK,
...; the logger reads them before init() under a bare mpirun or srun."""

ENGINE_VARIABLES = (
    ("GASPI_RANK", "GASPI_NRANKS", None, None),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


def engine_rank(environ):
    """This process's rank as its engine gives it, or None."""
    for rank_variable, *_ in ENGINE_VARIABLES:
        value = environ.get(rank_variable, "")
        if value.isdigit():
            return int(value)
    return None
