"""The cgroup backends' own behaviour where a host differs from this one (v1 here)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sandloop.sandbox import cgroups


def _v2_tree(root: Path) -> Path:
    """A directory shaped like a cgroup v2 mount's top (the kernel's is not available here)."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("\n")
    return root


@pytest.mark.parametrize(("err", "hint"), [
    (errno.EBUSY, "Move them into a leaf group first"),
    (errno.EROFS, "not writable"),
])
def test_v2_delegation_failure_says_why_and_what_to_do_fault_injected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, hint: str) -> None:
    # Fault injection: the kernel refuses to enable controllers, as in a container whose
    # cgroup namespace root holds its processes (EBUSY) or whose cgroup mount is read-only.
    def refuse(path: str, value: str) -> None:
        raise OSError(err, "refused", path)

    monkeypatch.setattr(cgroups, "_write", refuse)
    root = _v2_tree(tmp_path)
    with pytest.raises(cgroups.CgroupError) as e:
        cgroups.CgroupV2(root)
    assert "cannot delegate memory, pids, cpu" in str(e.value) and hint in str(e.value)
    # detect() falls back to v1 (absent in this tree) and reports both reasons.
    with pytest.raises(cgroups.CgroupError) as e2:
        cgroups.detect(root)
    assert hint in str(e2.value) and "v1:" in str(e2.value)


def test_v2_without_the_needed_controllers_is_refused(tmp_path: Path) -> None:
    root = tmp_path
    (root / "cgroup.controllers").write_text("hugetlb\n")
    with pytest.raises(cgroups.CgroupError, match=r"not available.*memory, pids, cpu"):
        cgroups.CgroupV2(root)


def test_v1_co_mounted_controllers_share_one_group_directory(tmp_path: Path) -> None:
    # systemd hosts mount cpu and cpuacct together and link both names to that hierarchy:
    # a group must be made once there, not twice (the second mkdir would fail).
    for d in ("memory", "pids", "cpu,cpuacct", "freezer"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "cgroup.procs").write_text("")
    (tmp_path / "cpu").symlink_to("cpu,cpuacct")
    (tmp_path / "cpuacct").symlink_to("cpu,cpuacct")
    v1 = cgroups.CgroupV1(tmp_path)
    assert v1.controllers == ["memory", "pids", "cpu", "cpuacct", "freezer"]
    cg = v1.create("p1x0-s0r1", run=True)
    assert cg.dirs["cpu"] == cg.dirs["cpuacct"] == str(tmp_path / "cpu,cpuacct/sandloop/p1x0-s0r1")
    assert len(cg.procs_files) == 3 and "freezer" not in cg.dirs  # memory, pids, cpu+cpuacct
    assert sorted(v1.leftover_groups()) == sorted(
        str(tmp_path / c / "sandloop/p1x0-s0r1") for c in ("memory", "pids", "cpu,cpuacct"))
    assert cg.try_remove()
    assert v1.leftover_groups() == []
