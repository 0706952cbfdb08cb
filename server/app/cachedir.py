"""The pack cache's directory on the local disk: one per server process, locked while the
process lives, and the reclaiming of those of dead servers (docs/ARCHITECTURE.md "Pack
cache"). An flock is released by the kernel whatever way the process dies, so an unlocked
directory with the final prefix is a dead server's, whatever its age.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time

__all__ = ["make_directory", "reclaim_orphans", "remove_files", "unlink_quietly",
           "DIR_PREFIX", "NEW_PREFIX"]

log = logging.getLogger("gitspout")

DIR_PREFIX = "gitspout-packcache-"
NEW_PREFIX = ".gitspout-packcache-new-"  # made, then locked, then renamed to DIR_PREFIX...
ORPHAN_AGE = 60.0  # seconds: a NEW_PREFIX directory younger than this may be being locked


def make_directory(base: str) -> tuple[str, int]:
    """A cache directory of this process's own in ``base`` and the descriptor holding its
    flock. It is made under a temporary name and locked before it is renamed, so a
    directory with the final prefix is locked from the moment it has that name: an
    unlocked one is a dead server's, whatever its age (a crash loop restarts within
    seconds)."""
    tmp = tempfile.mkdtemp(prefix=NEW_PREFIX, dir=base)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        final = os.path.join(base, DIR_PREFIX + os.path.basename(tmp)[len(NEW_PREFIX):])
        os.rename(tmp, final)
    except OSError:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, fd


def reclaim_orphans(base: str) -> int:
    """Remove the cache directories in ``base`` that no live server holds (their server
    was killed: close() never ran); how many. Each server holds an flock on its
    directory, which the kernel releases when the process dies, however it dies."""
    removed = 0
    try:
        found = [e for e in os.scandir(base)
                 if e.name.startswith((DIR_PREFIX, NEW_PREFIX)) and e.is_dir()]
    except OSError:
        return 0
    now = time.time()
    for entry in found:
        try:
            if entry.name.startswith(NEW_PREFIX) and now - entry.stat().st_mtime < ORPHAN_AGE:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live server's
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    if removed:
        log.info("pack cache: removed %d directories of stopped servers from %s", removed, base)
    return removed


def unlink_quietly(path: str) -> None:
    """Remove ``path``; gone already is as good."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_files(directory: str) -> None:
    """Remove every file of ``directory`` (one of this process's own), then it if empty."""
    for name in os.listdir(directory):
        unlink_quietly(os.path.join(directory, name))
    try:
        os.rmdir(directory)
    except OSError:
        pass
