"""Where a link writes its temporary files: a RAM-backed folder when one holds them with room to spare.

Linking a model writes its weights twice before the library reaches its destination: the object that packs
the executable, then the linker's output. On a disk those are page-cache writes that the kernel throttles to
the disk's speed once the dirty pages pass their limit: on a 2-core KVM guest (ext4 on virtio) a 100 MB
write took 0.03 s into an idle page cache and 0.25 s after two others. A compile that also stores its build
and exports it writes four copies of ResNeXt-50's 100 MB, and the last ones wait for the disk. ``/dev/shm``
(tmpfs) holds the two temporary ones in memory, which they occupy only while the link runs, the linked
library while the compiled model keeps it (a held, unlinked file), and the copy a run loads (mapped while the
model runs). It is used only when it has room for them with a margin, and when they take at most a quarter
of the memory available to this process (its cgroup's limit included): tmpfs pages cannot be dropped the
way page cache can. ``TMPDIR``, when set, is the user's choice and is kept.
"""

from __future__ import annotations

import os

RAM_FOLDER = "/dev/shm"
MARGIN = 64 << 20  # bytes left free in the RAM folder beyond what a link writes there
SHARE = 4  # what a link writes there is at most 1/SHARE of the memory available


def folder(size: int) -> str | None:
    """A folder for temporary files of ``size`` bytes in all: :data:`RAM_FOLDER` where it suits (see the
    module), else None (the default temporary folder)."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        st = os.statvfs(RAM_FOLDER)
    except OSError:
        return None
    if not os.access(RAM_FOLDER, os.W_OK | os.X_OK):
        return None
    available = available_memory()
    if available is None or st.f_bavail * st.f_frsize < size + MARGIN or size * SHARE > available:
        return None
    return RAM_FOLDER


def folders(size: int) -> list:
    """The folders to try, in order, for temporary files of ``size`` bytes: :func:`folder`'s RAM folder where
    it suits, then None (the default temporary folder), for when the RAM folder filled since it was chosen."""
    ram = folder(size)
    return ([ram] if ram else []) + [None]


def available_memory() -> int | None:
    """Bytes of memory this process can still use: ``MemAvailable``, capped by its cgroup's limit (v1 or v2) less
    its usage; None where ``/proc/meminfo`` cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _cgroup_room(root: str = "/sys/fs/cgroup", table: str = "/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup less its usage (cgroup v2 ``memory.max``/``memory.current``,
    v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``), or None where there is no limit or no such files.
    A container that sees only its own cgroup has it at the hierarchy's root."""
    try:
        with open(table) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, group in (parts for parts in lines if len(parts) == 3):
        if controllers == "":
            hierarchy, names = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            hierarchy, names = os.path.join(root, "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        for base in (os.path.join(hierarchy, group.lstrip("/")), hierarchy):
            room = _room(base, *names)
            if room is not None:
                return room if room >= 0 else None
    return None


def _room(base: str, limit_file: str, usage_file: str) -> int | None:
    """limit - usage from two files of ``base``; -1 when the limit is none ("max", or v1's near-2**63)."""
    try:
        with open(os.path.join(base, limit_file)) as f:
            limit = f.read().strip()
        with open(os.path.join(base, usage_file)) as f:
            usage = int(f.read().strip())
        limit = -1 if limit == "max" else int(limit)
    except (OSError, ValueError):
        return None
    return -1 if limit < 0 or limit >= 1 << 60 else max(0, limit - usage)
