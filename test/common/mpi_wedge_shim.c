/* mpi_wedge_shim.c - LD_PRELOADed into the ranks of test_mpi_transport.py's
 * wedge test: it makes MPI_Improbe of rank TNT_TEST_WEDGE_RANK never return
 * once the file TNT_TEST_WEDGE_FILE exists, as Open MPI's shared-memory
 * transport does for ever when a sender dies between the two steps of linking
 * a message into the receiver's queue (vader_fifo_read). That wedge comes by
 * chance, one SIGKILL in very many; this one comes every time, in the same
 * call, under the same lock. Built with mpicc by the test. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*improbe_fn)(int, int, MPI_Comm, int *, MPI_Message *, MPI_Status *);

int MPI_Improbe(int source, int tag, MPI_Comm comm, int *flag, MPI_Message *message, MPI_Status *status) {
  static improbe_fn real;
  if (!real) real = (improbe_fn)dlsym(RTLD_NEXT, "MPI_Improbe");
  const char *file = getenv("TNT_TEST_WEDGE_FILE"), *who = getenv("TNT_TEST_WEDGE_RANK");
  const char *rank = getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : getenv("PMI_RANK");
  if (file && who && rank && atoi(who) == atoi(rank) && access(file, F_OK) == 0)
    for (;;) pause(); /* the call that never returns (vader spins; pausing spares the test's cores) */
  return real(source, tag, comm, flag, message, status);
}
