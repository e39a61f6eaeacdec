"""The real one-node Slurm the tests start: see gpupool.backends.slurm_testbed (benchmarks use it too)."""

from gpupool.backends.slurm_testbed import SlurmCluster, missing_binaries

__all__ = ["SlurmCluster", "missing_binaries"]
