# Sourced by job and test scripts: Open MPI settings for containers and small machines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI and containers run as root
export OMPI_MCA_rmaps_base_oversubscribe=1                          # 4 ranks on 2 cores
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}              # OpenMP kernels own the threads
