# Sourced by job and test scripts: Open MPI settings for containers and small machines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI and containers run as root
export OMPI_MCA_rmaps_base_oversubscribe=1                          # 4 ranks on 2 cores
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}              # OpenMP kernels own the threads
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}                        # one thread per rank: ranks fill the cores
export OMPI_MCA_mpi_yield_when_idle=1                               # waiting ranks give their core away
# OpenBLAS 0.3.21 does not recognise some virtual CPUs and falls back to its slowest kernels
# ("Prescott"); pick the core type from the CPU's flags (never one the CPU cannot run).
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
fi
