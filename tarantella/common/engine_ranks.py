"""Where each launch engine says which rank a process is: the (rank, size,
local rank, local size) variables of GPI-2, Open MPI, MPICH/Hydra and Slurm,
most specific first. Slurm's come last: an engine started in an sbatch script
(gaspi_run, mpirun, mpiexec) hands its ranks the script's SLURM_PROCID=0 and
SLURM_NTASKS, or across nodes those of the daemon srun started on each node,
which are no rank of its job (core/src/params.c reads them in the same order;
it read Slurm's before Open MPI's and PMI's, and every rank of an `mpirun` in
sbatch took rank 0). The rank wrapper (runner/rank.py) exports them as TNT_RANK,
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
