"""glibc's malloc, tuned for a process that allocates and frees buffers of megabytes all the time.

A broker receiving large produce requests allocates, per request, the pieces read from the socket
(or decrypted from TLS), the frame joined from them and the records decoded from the frame, and
frees them a moment later. By default glibc serves an allocation above its mmap threshold (128 KiB,
raised on the fly up to the largest block freed so far) with a fresh mmap(), and hands free memory
at the top of its heap back to the kernel above a trim threshold (twice the mmap threshold). Either
way most large buffers are fresh pages, and every 4 KiB page costs a fault and its zeroing when it
is first written: producing 1 KB records (`bench/security.py`), that was a fifth to a third of the
broker's CPU per MB.

`keep_freed_memory` fixes the mmap threshold at 32 MiB (glibc's maximum on 64-bit systems) and the
trim threshold at 64 MiB, so that freed buffers stay in the heap for the next ones: at most
64 MiB of free memory is kept at the top of the heap. It changes nothing when the environment
already sets malloc's parameters (`GLIBC_TUNABLES` naming `glibc.malloc.*`, or one of the
`MALLOC_*_` variables): the operator's choice wins. Only glibc has `mallopt` with these meanings.

Concurrency: called once, from the main thread, before the broker starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_OPERATOR_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


def operator_settings(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the environment sets malloc's parameters itself."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return True
    return any(name in environ for name in _OPERATOR_SETTINGS)


def keep_freed_memory() -> bool:
    """Set the thresholds of the module docstring; True when they were set."""
    if platform.libc_ver()[0] != "glibc" or operator_settings(os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    logger.debug(
        "malloc thresholds: mmap %d, trim %d (set: %s)", MMAP_THRESHOLD, TRIM_THRESHOLD, done
    )
    return done
