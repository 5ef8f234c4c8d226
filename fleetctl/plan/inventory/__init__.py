"""Ansible inventories (YAML and INI) -> nodes in rank order.

Ops teams already describe their boxes for Ansible, so fleetctl reads those files as they are
instead of inventing a format. This package follows ansible-core 2.19's own inventory rules,
re-implemented (no ansible import, it is not a runtime dependency):

* Parsing: the YAML plugin (``all:`` -> ``hosts:`` / ``vars:`` / ``children:``) and the INI
  plugin (``[g]``, ``[g:vars]``, ``[g:children]``, inline ``host k=v``, hosts before any
  section go to ``ungrouped``; values typed with ``ast.literal_eval`` like Ansible does).
  Host ranges ``gpu[01:16]``, ``node-[a:c]``, ``[1:10:2]``; ``host:port``.
* After parsing ("reconcile"): groups without a parent become children of ``all``; hosts with
  no group go to ``ungrouped``, hosts in another group leave it.
* Variables: ``all`` vars < other groups sorted by (depth, ``ansible_group_priority``, name)
  < host vars (last definition of a host var wins). Depth = longest path from ``all``.
* ``group_vars/`` and ``host_vars/`` beside the inventory file are read like Ansible's default
  vars plugin does: ``group_vars/all`` then ``group_vars/<group>`` (same group order) above all
  of the file's group vars; ``host_vars/<host>`` above the file's host vars.
* Order (= node rank): the order Ansible's ``Group.get_hosts()`` yields for the selected group,
  which is what ``ansible-inventory --list`` iterates and ``ansible --list-hosts`` prints: the
  group's own hosts, then breadth-first through its children (in declaration order), each host
  at its first appearance. ``--limit`` only filters that order, it never reorders.
  One caveat: ansible-core walks the 2nd and deeper levels of that breadth-first search over a
  Python ``set`` of groups, so when several groups on one level have child groups, Ansible's
  order between those grandchildren changes from run to run. fleetctl always takes them in
  declaration order, which is one of the orders Ansible produces (and the only stable one).
* ``--limit`` patterns as Ansible: names, globs, ``~regex``, ``a:b`` / ``a,b`` unions,
  ``&`` intersections, ``!`` exclusions, ``group[0]`` / ``group[1:3]`` subscripts, ``@file``.

Stricter than Ansible (which warns and carries on) because a silently dropped or doubled host
changes a job's world size: a ``--limit`` part that matches nothing, duplicate YAML keys,
unknown keys in a YAML group, a group that is not a mapping, a host named like a group,
reversed ranges (``[9:2]``), two remote hosts with the same address and port.

What fleetctl does *not* do: Jinja templating (a mapped value containing ``{{`` is refused),
vault decryption (encrypted values are refused where used; encrypted vars files are skipped),
dynamic inventory scripts/plugins, several ``-i`` sources.

Bad input raises :class:`~fleetctl.errors.InventoryError` (exit code 2) whose message starts
with ``file:line:`` where the file gives a line, and names the host and field.
"""

from __future__ import annotations

from fleetctl.plan.inventory.load import Inventory, load_inventory, local_inventory, parse_limit

__all__ = ["Inventory", "load_inventory", "local_inventory", "parse_limit"]
