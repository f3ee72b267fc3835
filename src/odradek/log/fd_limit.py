"""The broker's file descriptor budget: raising the soft limit at start-up, and telling a process
that ran out of descriptors apart from a failing disk.

What a broker keeps open per partition (see recovery.py and segment.py): the active segment's data
file once the log has been opened or read, and its two index files once an append has given them
an entry (Kafka keeps the same three). Sealed segments open their files on a read and keep only the
data file. Snapshots, checkpoints and `.txnindex` files are opened, written and closed. So an idle
broker needs about one descriptor per partition plus its sockets, and a busy one up to three;
Kafka asks for 100,000 and raises its soft limit to the hard one at start-up (HotSpot's
MaxFDLimit), which `raise_soft_limit` does too.

Running out (EMFILE: this process's RLIMIT_NOFILE; ENFILE: the system's fs.file-max) is not a disk
fault: the files are intact, the next open may succeed, and a log directory must not be taken
offline for it (KIP-112, log_dir_failure). Such an error is reported as one line that names the
limit to raise (`descriptor_limit_message`).

Concurrency: plain functions; `raise_soft_limit` is called once, from the broker's main thread.
"""

from __future__ import annotations

import errno
import logging
import resource

logger = logging.getLogger(__name__)

_EXHAUSTION = (errno.EMFILE, errno.ENFILE)
_NR_OPEN = "/proc/sys/fs/nr_open"


def raise_soft_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (an unlimited hard limit: to the kernel's
    per-process maximum, fs.nr_open); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN) as file:
                target = int(file.read())
        except (OSError, ValueError):
            target = soft
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as e:
            logger.warning("cannot raise the open file limit from %d to %d: %s", soft, target, e)
    logger.info("open file limit (RLIMIT_NOFILE): %d (hard limit %s)", soft, _show(hard))
    return soft


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def is_descriptor_exhaustion(error: BaseException) -> bool:
    """Is this (or its direct cause) an OSError for running out of file descriptors?"""
    for candidate in (error, error.__cause__):
        if isinstance(candidate, OSError) and candidate.errno in _EXHAUSTION:
            return True
    return False


def descriptor_limit_message(error: BaseException) -> str:
    """One line saying which limit was hit and how to raise it."""
    cause = error if isinstance(error, OSError) else error.__cause__
    if isinstance(cause, OSError) and cause.errno == errno.ENFILE:
        return (
            "the system is out of file descriptors (ENFILE): raise fs.file-max "
            "(sysctl -w fs.file-max=...)"
        )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f"out of file descriptors (EMFILE): this process may open {_show(soft)} files "
        f"(RLIMIT_NOFILE, hard limit {_show(hard)}); raise the hard limit (`ulimit -Hn`, "
        "systemd LimitNOFILE=, /etc/security/limits.conf) to about 3 per partition plus 1 per "
        "client connection"
    )
