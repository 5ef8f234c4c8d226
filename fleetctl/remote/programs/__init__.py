"""The node programs: what the controller runs on a node, each shipped as one bundle with the kit
it imports (``fleetctl.remote``: ``inline``, ``cached_argv``, ``stdin_argv``), each by its file
name (``"supervisor.py"``). The controller never imports one (``tests/pure/test_layering.py``);
stdlib only, Python >= 3.8; on a node this ``__init__`` is shipped empty.
"""
