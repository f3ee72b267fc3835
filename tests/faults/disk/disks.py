"""Real disk faults for the broker under test (root only): a file system that fills up, one that
turns read-only, and writes that fail with EIO.

* `TmpfsDir`: a size-limited tmpfs mounted on a directory; `grow` is the repair (more room).
* `Ext4Dir`: a small ext4 image on a loop device, mounted with `errors=remount-ro`. `fail`
  writes to ext4's `trigger_fs_error` (its own fault-injection hook): the kernel handles it as
  a metadata error and remounts the file system read-only, as it does when a real disk
  misbehaves — every later write, fsync or create fails with EROFS. (`mount -o remount,ro` is
  refused while the broker holds files open for writing.) `repair` unmounts, runs `e2fsck` and
  mounts again.
* `EioShim`: the LD_PRELOAD library of `eio_shim.c`, compiled here; `fail(prefix)` makes every
  write/fsync/create of a file under `prefix` fail with EIO in the processes that preloaded it,
  `repair` stops that.

Every mount is undone by `unmount` (the fixture calls it in a `finally`), so nothing outlives the
test; commands are bounded by timeouts.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import time
from pathlib import Path

COMMAND_TIMEOUT_S = 60


def run(*command: str) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def tools_missing() -> str | None:
    """Why these faults cannot be made here (None if they can)."""
    for tool in ("mount", "umount", "mkfs.ext4", "e2fsck", "findmnt", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class TmpfsDir:
    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path))
        self.mounted = True

    def grow(self, size_bytes: int) -> None:
        run("mount", "-o", f"remount,size={size_bytes}", str(self.path))

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], timeout=COMMAND_TIMEOUT_S, check=False)
            self.mounted = False


class Ext4Dir:
    def __init__(self, path: Path, image: Path, size_bytes: int) -> None:
        self.path = path
        self.image = image
        path.mkdir(parents=True, exist_ok=True)
        with open(image, "wb") as file:
            file.truncate(size_bytes)
        run("mkfs.ext4", "-q", "-F", str(image))
        self.mounted = False
        self._mount()

    def _mount(self) -> None:
        run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.path))
        self.mounted = True

    def device(self) -> str:
        return run("findmnt", "-n", "-o", "SOURCE", str(self.path)).strip()

    def fail(self) -> None:
        name = Path(self.device()).name
        Path(f"/sys/fs/ext4/{name}/trigger_fs_error").write_text("odradek disk fault test\n")

    def is_read_only(self) -> bool:
        """Does creating a file fail with EROFS? (Recent kernels keep the mount "rw" and flag
        the superblock `emergency_ro`; the effect is what matters.)"""
        probe = self.path / ".odradek-probe"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            return e.errno == errno.EROFS
        return False

    def _attached(self) -> bool:
        """Is the image still on a loop device (its file system still held by the kernel)?"""
        return bool(run("losetup", "-j", str(self.image)).strip())

    def _mounted_here(self) -> bool:
        return (
            subprocess.run(
                ["findmnt", "-n", str(self.path)], capture_output=True, timeout=COMMAND_TIMEOUT_S
            ).returncode
            == 0
        )

    def repair(self) -> None:
        """Unmount until nothing is mounted here and the loop device is gone (otherwise `mount`
        would reuse the loop device and the kernel the failed superblock), check, mount."""
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while self._mounted_here() or self._attached():
            if self._mounted_here():
                subprocess.run(
                    ["umount", "-d", str(self.path)], capture_output=True, timeout=COMMAND_TIMEOUT_S
                )
            else:
                for line in run("losetup", "-j", str(self.image)).splitlines():
                    subprocess.run(
                        ["losetup", "-d", line.split(":")[0]],
                        capture_output=True,
                        timeout=COMMAND_TIMEOUT_S,
                    )
            if time.monotonic() > deadline:
                users = subprocess.run(
                    ["fuser", "-vm", str(self.path)], capture_output=True, text=True, check=False
                )
                raise RuntimeError(
                    f"cannot release {self.path}: {run('losetup', '-a')} {users.stderr}"
                )
            time.sleep(0.2)  # a process that just died may still hold files for a moment
        self.mounted = False
        subprocess.run(
            ["e2fsck", "-fy", str(self.image)], capture_output=True, timeout=COMMAND_TIMEOUT_S
        )
        self._mount()
        if self.is_read_only():
            raise RuntimeError(f"{self.path} is still read-only after the repair")

    def unmount(self) -> None:
        if self.mounted:
            # -d frees the loop device too
            subprocess.run(["umount", "-d", str(self.path)], timeout=COMMAND_TIMEOUT_S, check=False)
            self.mounted = False


class EioShim:
    def __init__(self, workdir: Path) -> None:
        self.library = workdir / "eio_shim.so"
        self.trigger = workdir / "eio-trigger"
        source = Path(__file__).with_name("eio_shim.c")
        run("cc", "-shared", "-fPIC", "-O2", "-o", str(self.library), str(source), "-ldl")

    def environment(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "ODRADEK_EIO_TRIGGER": str(self.trigger)}

    def fail(self, prefix: Path) -> None:
        temp = self.trigger.with_name(self.trigger.name + ".tmp")
        temp.write_text(f"{prefix}\n")
        temp.replace(self.trigger)

    def repair(self) -> None:
        self.trigger.unlink(missing_ok=True)
