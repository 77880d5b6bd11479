"""Crash-safe writing, the bottom layer: every file glassbox saves goes through here.

- ``atomic``: one file replaced whole (``write_bytes``, ``write_text``, ``write_file(path, fill)``,
  ``save_torch``, ``save_safetensors``; ``append_text`` for logs).
- ``folder``: a folder of several files replaced in place, keeping a user's other files
  (``FolderWriter``), and ``recover`` for a folder whose save was interrupted.
- ``legacy``: recovering what the savers of earlier glassbox versions left beside a folder.

Errors of the OS surface as ``OSError`` naming the file written (errno kept). This package imports
nothing of glassbox and no torch at import time.
"""

from .atomic import (TMP_PREFIX, append_text, as_os_error, save_safetensors, save_torch, write_bytes, write_file,
                     write_text)
from .folder import JOURNAL, RECORD, FolderStateError, FolderWriter, owned_files, read_record, recover

__all__ = ["FolderStateError", "FolderWriter", "JOURNAL", "RECORD", "TMP_PREFIX", "append_text", "as_os_error",
           "owned_files", "read_record", "recover", "save_safetensors", "save_torch", "write_bytes", "write_file",
           "write_text"]
