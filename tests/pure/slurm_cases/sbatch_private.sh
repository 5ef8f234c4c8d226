#!/bin/sh
#SBATCH --job-name=fleetctl-j1
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
#SBATCH --output=/tmp/fleetctl-slurm-j1.out
#SBATCH --error=/tmp/fleetctl-slurm-j1.err
#SBATCH --chdir=/shared/code
# written by fleetctl run --slurm: the same job run inside the allocation
export FLEETCTL_RUN_ID=j1
# the run's options, for `fleetctl run --spec` (0600 in a 0700 folder, never on
# a command line)
(umask 077 && mkdir -p /tmp/fleetctl-slurm-j1 && [ ! -L /tmp/fleetctl-slurm-j1 ] && [ -O /tmp/fleetctl-slurm-j1 ] && chmod 700 /tmp/fleetctl-slurm-j1 && cat >/tmp/fleetctl-slurm-j1/run-spec.json) <<'FLEETCTL_RUN_SPEC_END' || { echo "fleetctl-slurm: cannot write /tmp/fleetctl-slurm-j1/run-spec.json (a folder of another user?)" >&2; exit 3; }
{"format": "fleetctl-run-spec/1", "spec": {"program": {"script": "job.py", "env": {"T": "'it's' \"x\""}}}, "inside": {"runs_dir": "/tmp/fleetctl-slurm-j1", "inventory": null, "limit": null, "known_hosts": null, "accept_new": false, "connect_timeout": 10.0, "tail": "all", "raw_output": false}}
FLEETCTL_RUN_SPEC_END
# no shared filesystem: fleetctl runs as a child (TERM passed on: scancel --batch);
# once it has ended the submitter pulls the run folder by an srun step and says so
python3 -m fleetctl run --spec=/tmp/fleetctl-slurm-j1/run-spec.json &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM INT
while :; do wait $pid; code=$?; kill -0 $pid 2>/dev/null || break; done
echo "fleetctl-slurm: ended $code" >&2
i=0
while [ ! -e /tmp/fleetctl-slurm-j1/j1/.fetched ] && [ $i -lt 600 ]; do
  sleep 0.5; i=$((i+1))
done
rm -rf /tmp/fleetctl-slurm-j1 /tmp/fleetctl-slurm-j1.out /tmp/fleetctl-slurm-j1.err
exit $code
