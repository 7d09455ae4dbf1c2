"""Where each launch engine says which rank a process is: the (rank, size,
local rank, local size) variables of GPI-2, Open MPI, MPICH/Hydra and Slurm,
most specific first. Slurm's come last: an engine started in an sbatch script
(gaspi_run, mpirun, mpiexec) hands its ranks the script's SLURM_PROCID=0 and
SLURM_NTASKS, or across nodes those of the daemon srun started on each node,
which are no rank of its job (core/src/params.c reads them in the same order;
it read Slurm's before Open MPI's and PMI's, and every rank of an `mpirun` in
sbatch took rank 0). The rank wrapper (runner/rank.py) exports them as TNT_RANK,
...; the logger reads them before init() under a bare mpirun or srun."""
import re

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


def slurm_tasks_per_node(text):
    """Slurm's compressed task counts per node, "2(x3),1" -> [2, 2, 2, 1] (None if unreadable)."""
    counts = []
    for item in (text or "").split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts or None


def slurm_local_size(environ):
    """Tasks of this job step on this node, from SLURM_STEP_TASKS_PER_NODE (or the job's
    SLURM_TASKS_PER_NODE) and SLURM_NODEID, or None. Not SLURM_NTASKS_PER_NODE: srun sets it
    only for --ntasks-per-node, and a step's tasks inherit the allocation's (`salloc
    --ntasks-per-node=4`, then `srun -n 2`: 4). The core's rule (params.c) is the same."""
    counts = slurm_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE")
                                  or environ.get("SLURM_TASKS_PER_NODE"))
    try:
        node = int(environ.get("SLURM_NODEID", ""))
    except ValueError:
        return None
    return counts[node] if counts and 0 <= node < len(counts) else None
