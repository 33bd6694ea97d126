"""nbmpi controller (``nbmpi serve``): pools and jobs of authenticated users over REST and a dashboard,
run by a pluggable backend (:mod:`nbmpi.server.backends`: local mpiexec or Slurm), recorded in SQLite."""
