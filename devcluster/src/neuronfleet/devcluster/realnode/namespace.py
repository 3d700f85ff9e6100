"""The real node's mount namespace: cgroups mounted again, then held until SIGTERM.

Started as ``ip netns exec <netns> python -m neuronfleet.devcluster.realnode.namespace READY_FILE``: the
node's daemons join this process's network and mount namespaces (``nsenter``), so the kubelet's volume
mounts are visible to runc, and every mount made for the node vanishes with the namespace.

Sandbox refusal it answers: ``ip netns exec`` remounts /sys for the namespace, which hides the cgroup
hierarchies under /sys/fs/cgroup, and the kubelet stops with ``failed to get mounted cgroup subsystems:
failed to find cgroup mounts``; a bind mount from /proc/1/root is refused (``bind
/proc/1/root/sys/fs/cgroup failed``). Mounting each hierarchy again with the host's options attaches to
the same hierarchy, so the kubelet and runc see the host's cgroups.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

CGROUP_ROOT = "/sys/fs/cgroup"


class Mount(NamedTuple):
    """One cgroup hierarchy as the host mounts it."""

    point: str
    fstype: str
    options: str


def cgroup_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup (v1 and v2) mounts under /sys/fs/cgroup in a ``/proc/<pid>/mountinfo`` text."""
    mounts = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        words, rest = fields.split(), tail.split()
        if len(words) < 5 or len(rest) < 3:
            continue
        point, (fstype, _source, options) = words[4], rest[:3]
        if fstype in ("cgroup", "cgroup2") and point.startswith(f"{CGROUP_ROOT}/"):
            mounts.append(Mount(point, fstype, options))
    return mounts


def mount_cgroups(mounts: list[Mount]) -> None:
    """A tmpfs on /sys/fs/cgroup, and each hierarchy in it again."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", CGROUP_ROOT], check=True)
    for mount in mounts:
        Path(mount.point).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", mount.fstype, "-o", mount.options, mount.fstype, mount.point], check=True)


def main() -> None:
    """Mount, say so by creating the ready file, then wait for SIGTERM."""
    ready = Path(sys.argv[1])
    mount_cgroups(cgroup_mounts(Path("/proc/1/mountinfo").read_text()))
    ready.touch()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
