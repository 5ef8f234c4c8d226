#!/bin/sh
#SBATCH --job-name=fleetctl-j1
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
#SBATCH --partition=gpu
#SBATCH --output=/T/runs/j1/slurm.out
#SBATCH --error=/T/runs/j1/slurm.err
#SBATCH --chdir=/T/code
# written by fleetctl run --slurm: the same job run inside the allocation
export FLEETCTL_RUN_ID=j1
export PYTHONPATH=/LIB
exec PY -m fleetctl run --spec=/T/runs/j1/run-spec.json
