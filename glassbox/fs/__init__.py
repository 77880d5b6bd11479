"""Crash-safe writing, the bottom layer: every file glassbox saves goes through here.

- ``atomic``: one file replaced whole (``write_bytes``, ``write_text``, ``write_file(path, fill)``,
  ``save_torch``, ``save_safetensors``; ``append_text`` and ``open_log`` for logs).
- ``folder``: a folder of several files replaced in place, keeping a user's other files
  (``FolderWriter``), ``recover`` for a folder whose save was interrupted, and ``remove_entries``
  for deleting what a caller knows glassbox wrote.
- ``legacy``: recovering what the savers of earlier glassbox versions left beside a folder.

Errors of the OS surface as ``OSError`` naming the file written (errno kept). This package imports
nothing of glassbox and no torch at import time.
"""

from .atomic import (TMP_PREFIX, append_text, as_os_error, open_log, save_safetensors, save_torch, write_bytes,
                     write_file, write_text)
from .staged import commit_staged, discard_tree, remove_empty_dir, remove_tree
from .folder import JOURNAL, RECORD, FolderStateError, FolderWriter, owned_files, read_record, recover, remove_entries

__all__ = ["FolderStateError", "FolderWriter", "JOURNAL", "RECORD", "TMP_PREFIX", "append_text", "as_os_error",
           "commit_staged", "discard_tree", "remove_empty_dir", "remove_tree",
           "open_log", "owned_files", "read_record", "recover", "remove_entries", "save_safetensors", "save_torch",
           "write_bytes", "write_file", "write_text"]
