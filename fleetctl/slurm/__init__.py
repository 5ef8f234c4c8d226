"""Slurm: the fleet from an allocation, node supervisors started by ``srun`` (not SSH).

``hostlist`` expands Slurm's node lists (pure); ``allocation`` turns ``SLURM_*`` variables (and
``scontrol show node``) into the fleet's nodes, reached by ``fleetctl.transport.srun`` (the
``Connection`` whose commands are job steps on one node). Everything after launch is the
ordinary job core.
"""
