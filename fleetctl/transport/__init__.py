"""One connection to one host: SSH (paramiko), the local machine, an srun step.

``connection`` holds the ``Connection`` interface and picks a node's transport; ``dial``,
``sshconfig``, ``hostkeys`` reach an SSH host; ``local`` and ``srun`` are the exec-style
transports. The fan-out over many nodes is ``fleetctl.ssh``.
"""
