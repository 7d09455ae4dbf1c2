#!/bin/sh
# The MPI peers of bench/allreduce.py, from PyPI, each in a venv of its own
# (benchmark tools, not dependencies of Tarantella):
#   Intel MPI: pip install impi-rt mpi4py     MPICH: pip install mpich mpi4py
# mpi4py 4.x wheels find the MPI of the venv they run in. Prints the options
# that hand them to bench/allreduce.py.
#
#   sh bench/setup_peers.sh [DIR]        # default: $TMPDIR/tnt-bench-peers
set -e
DIR=${1:-${TMPDIR:-/tmp}/tnt-bench-peers}
PY=${PYTHON:-python3}
for peer in impi mpich; do
  if [ ! -x "$DIR/$peer/bin/mpiexec" ]; then
    "$PY" -m venv "$DIR/$peer"
    pkg=$([ "$peer" = impi ] && echo impi-rt || echo mpich)
    "$DIR/$peer/bin/pip" install -q "$pkg" mpi4py numpy
  fi
done
echo "--peer-venv 'Intel MPI=$DIR/impi' --peer-venv 'MPICH=$DIR/mpich'"
