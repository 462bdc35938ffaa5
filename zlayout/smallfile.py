"""Reading a small file a user names: a regular file only, and only up to a limit.

A path can name a FIFO (a plain open() waits for a writer forever), a device (/dev/zero never
ends) or a file of gigabytes. Every reader of a user's config, card, ds_config or results goes
through `read_small_file`, which raises before reading anything unbounded."""

from __future__ import annotations

import errno
import os
import stat


class NotARegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory."""


class TooLarge(OSError):
    """The file holds more than the limit."""


def read_small_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError (NotARegularFile, TooLarge,
    or the system's own: missing, no permission) otherwise."""
    # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; the fstat
    # then refuses it before any read
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise TooLarge(errno.EFBIG, f"larger than {limit:,} bytes", os.fspath(path))
    return b"".join(chunks)
