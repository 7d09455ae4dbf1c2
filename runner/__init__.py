"""`tntrun` (alias `tarantella`): the launcher of Tarantella jobs.

On one host it starts the ranks itself (local.py) and supervises them; across
hosts it builds the command of an existing engine (engines.py: mpirun, srun,
gaspi_run) and supervises that. It never imports TensorFlow.
"""
