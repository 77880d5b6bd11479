"""Single files written whole: a reader (or a process killed mid-write) sees the old file or the new one.

``write_file(path, fill)`` calls ``fill(tmp)`` to write the content into a temporary sibling
``.glassbox-tmp-<token>-NAME`` (in the same folder, so the rename cannot cross file systems),
flushes it to disk (fsync), renames it over ``path`` (``os.replace``, atomic on POSIX and Windows)
and flushes the folder's entry. ``write_bytes``, ``write_text``, ``save_torch`` and
``save_safetensors`` are ``write_file`` with a ready-made ``fill``; ``append_text`` and ``open_log`` are
for logs.

Contract and footguns:
- ``path`` that is an existing folder is refused (IsADirectoryError naming it); a symlink is
  followed (its target is replaced, the link kept). Missing parent folders are created.
- A file replaced keeps its permission bits; a new one gets the usual ones (0o666 less the umask read
  at import), whatever its writer used (safetensors' own writer creates 0o600 files).
- Anything that fails leaves ``path`` as it was and removes the temporary sibling. A killed process
  may leave the sibling; the next write of the same ``path`` removes it (``clean_leftovers``), and a
  ``FolderWriter`` or ``recover`` of the folder removes every ``.glassbox-tmp-*`` entry. Names with
  that prefix are glassbox's own: never name a file of yours so.
- Errors of the OS (ENOSPC, EFBIG under ``RLIMIT_FSIZE``, EACCES, ...) surface as ``OSError`` (its
  subclass for the errno) whose message and ``filename`` name ``path``, with the errno kept.
  torch's ``[enforce fail at inline_container.cc]`` RuntimeError and safetensors' ``SafetensorError``
  for a failed write are turned into such an OSError (the cause chained), see ``as_os_error``.
- One writer per file at a time: there is no locking. ``append_text`` is not atomic: a process killed
  mid-append can leave a partial last line, which a log reader must skip.
"""

import errno
import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Callable, Union

TMP_PREFIX = ".glassbox-tmp-"

# The process's umask, read once at import (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def set_mode(target: Path, tmp: Path) -> None:
    """Give ``tmp``, about to replace ``target``, ``target``'s permission bits, or a new file's usual ones."""
    if target.is_file():
        os.chmod(tmp, os.stat(target).st_mode & 0o7777)
    else:
        os.chmod(tmp, 0o666 & ~_UMASK)
PathLike = Union[str, "os.PathLike[str]"]
_NAME_MAX = 200  # longer names are hashed in the temporary name, which must stay under NAME_MAX (255)


def temp_name(name: str, token: str) -> str:
    """The temporary sibling's name for a file ``name`` (``token``: unique per write)."""
    if len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
        name = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return f"{TMP_PREFIX}{token}-{name}"


def new_token() -> str:
    return uuid.uuid4().hex[:12]


def target_path(path: PathLike, what: str = "write") -> Path:
    """``path`` absolute, its final symlink followed; IsADirectoryError if it is a folder."""
    path = Path(os.path.abspath(os.fspath(path)))
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"cannot {what} it as a file: it is a folder", str(path))
    if path.name in ("", ".", ".."):
        raise ValueError(f"cannot {what} {path}: not a file name")
    return path


def fsync_file(path: PathLike) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: PathLike) -> None:
    """Flush a folder's entries (its renames) to disk; a no-op where folders cannot be opened (Windows)."""
    if os.name == "nt":
        return
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)|Errno (\d+)")


def as_os_error(error: BaseException, path: PathLike) -> BaseException:
    """The error to raise for a failed write of ``path``: an OSError naming ``path`` (the errno kept) for
    an OSError, for torch's ``[enforce fail ...]`` RuntimeError (whose OSError torch hides in the
    context, or which has none: then ENOSPC if the disk is full, else EIO) and for a SafetensorError
    carrying an ``os error N``; any other error unchanged."""
    path = os.fspath(path)
    if isinstance(error, OSError):
        if error.filename == path:
            return error
        new = OSError(error.errno, f"{error.strerror or error} (writing)", path) if error.errno else \
            OSError(errno.EIO, f"{error} (writing)", path)
        return new
    text = str(error)
    if type(error).__name__ == "SafetensorError" or (isinstance(error, RuntimeError) and (
            "enforce fail" in text or "PytorchStreamWriter" in text or "inline_container" in text)):
        inner = error.__context__ or error.__cause__
        while inner is not None and not isinstance(inner, OSError):
            inner = inner.__context__ or inner.__cause__
        if inner is not None and inner.errno:
            return OSError(inner.errno, f"{inner.strerror} (writing; {_first_line(text)})", path)
        found = _OS_ERROR_IN_TEXT.search(text)
        if found:
            code = int(found.group(1) or found.group(2))
            return OSError(code, f"{os.strerror(code)} (writing; {_first_line(text)})", path)
        if isinstance(error, RuntimeError):
            code = errno.ENOSPC if _disk_full(path) else errno.EIO
            return OSError(code, f"{os.strerror(code)} (writing; {_first_line(text)})", path)
    return error


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "no message"


def _disk_full(path: str) -> bool:
    try:
        return os.statvfs(os.path.dirname(path) or ".").f_bavail == 0
    except (OSError, AttributeError):
        return False


def remove_quietly(path: PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass  # a leftover the next write or recover removes


def clean_leftovers(path: PathLike) -> None:
    """Remove the temporary siblings that killed writes of ``path`` left (``.glassbox-tmp-*-NAME``)."""
    path = Path(path)
    tails = {"-" + path.name, "-" + temp_name(path.name, "")[len(TMP_PREFIX) + 1:]}
    for entry in os.listdir(path.parent):
        if entry.startswith(TMP_PREFIX) and any(entry.endswith(t) and len(entry) == len(TMP_PREFIX) + 12 + len(t)
                                                for t in tails):
            if not os.path.isdir(path.parent / entry):
                os.unlink(path.parent / entry)


def write_file(path: PathLike, fill: Callable[[Path], None]) -> Path:
    """Replace ``path`` whole by what ``fill(tmp)`` writes at the temporary path ``tmp``; returns ``path``."""
    path = target_path(path)
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(path)
    except OSError as error:
        raise as_os_error(error, path) from error
    tmp = path.parent / temp_name(path.name, new_token())
    try:
        fill(tmp)
        if not tmp.is_file():
            raise FileNotFoundError(errno.ENOENT, f"the writer of {path} wrote nothing at its temporary path",
                                    str(tmp))
        set_mode(path, tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        remove_quietly(tmp)
        new = as_os_error(error, path)
        if new is error:
            raise
        raise new from error
    try:
        fsync_dir(path.parent)
    except OSError as error:
        raise as_os_error(error, path) from error
    return path


def fill_bytes(data: bytes) -> Callable[[Path], None]:
    """A ``fill`` writing ``data`` (bytes or bytearray)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"write_bytes takes bytes, got {type(data).__name__}")

    def fill(tmp: Path) -> None:
        with open(tmp, "xb") as handle:
            handle.write(data)
    return fill


def write_bytes(path: PathLike, data: bytes) -> Path:
    return write_file(path, fill_bytes(data))


def write_text(path: PathLike, text: str, encoding: str = "utf-8") -> Path:
    if not isinstance(text, str):
        raise TypeError(f"write_text takes a str, got {type(text).__name__}")
    return write_file(path, fill_bytes(text.encode(encoding)))


def fill_torch(obj) -> Callable[[Path], None]:
    """A ``fill`` that ``torch.save``s ``obj`` through a Python file, so a failed write keeps its errno."""
    def fill(tmp: Path) -> None:
        import torch

        with open(tmp, "xb") as handle:
            torch.save(obj, handle)
    return fill


def save_torch(path: PathLike, obj) -> Path:
    """``torch.save(obj)`` to ``path``, written whole (read it back with ``torch.load(weights_only=True)``)."""
    return write_file(path, fill_torch(obj))


def fill_safetensors(tensors: dict, metadata=None) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp), metadata=metadata)
    return fill


def save_safetensors(path: PathLike, tensors: dict, metadata=None) -> Path:
    """``safetensors.torch.save_file(tensors)`` to ``path``, written whole (tensors contiguous, on CPU or not)."""
    return write_file(path, fill_safetensors(tensors, metadata))


def append_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Append ``text`` to a log file and flush it (not atomic: see the module docstring)."""
    path = target_path(path, "append to")
    try:
        with open(path, "a", encoding=encoding) as handle:
            handle.write(text)
            handle.flush()
    except OSError as error:
        raise as_os_error(error, path) from error


def open_log(path: PathLike, fresh: bool = False, encoding: str = "utf-8"):
    """A text file handle appending to the log ``path`` (the caller flushes and closes it); ``fresh``
    first replaces the log by an empty one (whole). Not atomic: see the module docstring."""
    path = target_path(path, "append to")
    if fresh:
        write_bytes(path, b"")
    try:
        return open(path, "a", encoding=encoding)
    except OSError as error:
        raise as_os_error(error, path) from error
