"""The preflight check as one room: the probe session (``preflight``), the mesh (``mesh_plan``,
``mesh``, ``mesh_judge``), the judging and the report (``judge``, ``report``), its cache, the
health gate, the ``--image`` container check and the ``--collective`` benchmark. Empty on
purpose: importing one part (the pure judges) does not pull in the session and its SSH stack."""
