"""Reading a file that a model's config names inside the model's folder (``label_filename``, a warmup
sample's ``input_data_file``), as a hostile repository might lay it out.

:func:`read_model_file` takes a name the config gave, relative to a folder, and reads it only if it is a
plain relative name (no empty, ``.`` or ``..`` part, not absolute, no NUL), resolves inside the folder
(a symlink out of it is refused), opens without following a final symlink and without blocking (a FIFO
put there never hangs the reader), is a regular file, and holds at most ``max_bytes``. It reads from the
descriptor it checked, so a file swapped after the check is not the one read, and stops reading past
``max_bytes`` (a file that grows between ``fstat`` and ``read`` is refused too).

:func:`check_label_files` reads every ``label_filename`` of a config at load, so a model whose label file is
missing or unusable fails to load, as in Triton, instead of failing its first classification request.

A refusal is a :class:`ConfigError` whose text is only the reason ("is not inside ...", "cannot be read:
...", "is not a regular file", "has N bytes, more than M"); callers put the model and field in front.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from zinfer.client.errors import ConfigError

from .model_config import ModelConfig

__all__ = [
    "MAX_LABEL_BYTES",
    "check_label_files",
    "FileIdentity",
    "plain_relative",
    "read_model_file",
    "read_model_file_if_changed",
    "split_labels",
]

MAX_LABEL_BYTES = 16 << 20  # a label file (Triton's densenet labels are 10 KiB)


def plain_relative(name: str) -> bool:
    """A relative name of plain parts: not empty, not absolute, no NUL, no ``""``/``.``/``..`` part."""
    if not name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


FileIdentity = tuple[int, int, int, int]
"""device, inode, size, modification time (ns): a file read again is the same file only if all match"""

_CHUNK = 1 << 20


def read_model_file(folder: Path, name: str, max_bytes: int) -> bytes:
    """The bytes of ``name`` inside ``folder``; a ConfigError giving the reason it cannot be used."""
    _, data = read_model_file_if_changed(folder, name, max_bytes, None)
    assert data is not None
    return data


def read_model_file_if_changed(
    folder: Path, name: str, max_bytes: int, known: FileIdentity | None
) -> tuple[FileIdentity, bytes | None]:
    """The file's identity and its bytes, or None for the bytes when its identity is ``known`` (a caller's
    cache is still right); every check of :func:`read_model_file` is made either way."""
    if not plain_relative(name):
        raise ConfigError("is not a plain relative name")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root or path == root:
        raise ConfigError(f"is not inside {root}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("is not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(f"has {st.st_size} bytes, more than {max_bytes}")
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if identity == known:
            return identity, None
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes and (chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise ConfigError(f"has more than {max_bytes} bytes")
    return identity, b"".join(chunks)


def split_labels(raw: bytes) -> tuple[bytes, ...]:
    """A label file's labels, one per line (LF or CRLF); the newline ending the last line starts none."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return tuple(line.removesuffix(b"\r") for line in lines)


def check_label_files(config: ModelConfig, model_dir: Path) -> None:
    """Every output's ``label_filename`` readable as a label file, as Triton requires at load; a
    ConfigError naming the output and the reason otherwise."""
    for tensor in config.output:
        if tensor.label_filename:
            try:
                read_model_file(model_dir, tensor.label_filename, MAX_LABEL_BYTES)
            except ConfigError as exc:
                raise ConfigError(
                    f"model '{config.name}': output '{tensor.name}': label_filename "
                    f"'{tensor.label_filename}' {exc}"
                ) from None
