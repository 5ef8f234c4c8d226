#!/bin/sh
#SBATCH --job-name=fleetctl-j1
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
#SBATCH --output=/r/j1/slurm.out
#SBATCH --error=/r/j1/slurm.err
#SBATCH --chdir=/c
# written by fleetctl run --slurm: the same job run inside the allocation
exec python3 -m fleetctl run job.py
