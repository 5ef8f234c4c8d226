"""The lab's login user gets subordinate id ranges for rootless podman (``lab/users.py``):
the next free range, the same in /etc/subuid and /etc/subgid, only where it has none."""

from __future__ import annotations

from fleetctl.lab.users import subid_grant


def test_a_user_without_ranges_gets_the_next_free_one_in_both_files() -> None:
    subuid = "alice:100000:65536\nbob:165536:65536\n"
    subgid = "alice:100000:65536\ncarol:300000:1000\n"
    assert subid_grant("fleetci", subuid, subgid) == [
        "--add-subuids",
        "301000-366535",
        "--add-subgids",
        "301000-366535",
    ]


def test_a_user_with_ranges_gets_none_and_an_empty_file_starts_at_useradds_minimum() -> None:
    assert subid_grant("fleetci", "fleetci:100000:65536\n", "fleetci:100000:65536\n") == []
    assert subid_grant("fleetci", "fleetci:100000:65536\n", "") == [
        "--add-subgids",
        "165536-231071",
    ]
    assert subid_grant("fleetci", "", "# comment\n") == [
        "--add-subuids",
        "100000-165535",
        "--add-subgids",
        "100000-165535",
    ]
