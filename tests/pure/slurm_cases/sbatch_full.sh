#!/bin/sh
#SBATCH --job-name=fleetctl-20261126-120000-abcdef
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
#SBATCH --partition=gpu
#SBATCH --gres=gpu:1
#SBATCH --time=1:00:00
#SBATCH --account=ml
#SBATCH --output=/shared/runs/20261126-120000-abcdef/slurm.out
#SBATCH --error=/shared/runs/20261126-120000-abcdef/slurm.err
#SBATCH --chdir=/shared/code
#SBATCH --qos=high
#SBATCH --exclusive
# written by fleetctl run --slurm: the same job run inside the allocation
export FLEETCTL_RUN_ID=20261126-120000-abcdef
export PYTHONPATH='/opt/fleetctl lib'
exec /opt/conda/bin/python -m fleetctl run --spec=/shared/runs/20261126-120000-abcdef/run-spec.json
