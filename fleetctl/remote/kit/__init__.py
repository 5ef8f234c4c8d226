"""The node kit: modules the node programs import (``from ..kit.procfs import …``), never run on
their own; the controller imports a few of them too (``tests/pure/test_layering.py``,
``REMOTE_KIT``). Stdlib only, Python >= 3.8; on a node this ``__init__`` is shipped empty.
"""
