"""File hashing and the reserved names of a weights folder, shared by ``cog_triton.weights`` (which
fetches weights) and ``tensorrtllm_backend.manifest`` (which verifies them against manifest.json).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: File written into the weights folder after a successful fetch (JSON; see cog_triton.weights).
MARKER_NAME = ".cog-triton-weights.json"
#: File written beside manifest.json after a successful hash of the files it lists: each file's size,
#: mtime (ns) and sha256, so a later setup that reuses the folder need not hash it again (JSON; see
#: tensorrtllm_backend.manifest). Never taken from an archive or a copied folder.
VERIFIED_NAME = ".cog-triton-verified.json"
#: Files of the weights folder that survive a fetch (placeholders tracked by git).
KEEP_NAMES = frozenset({".gitkeep"})
#: Default read size when hashing, bytes.
CHUNK_BYTES = 1 << 20


def sha256_file(path: Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, int]:
    """(hex sha256, size in bytes) of the file at ``path``, read in chunks of ``chunk_bytes`` bytes.

    Raises:
        OSError: the file cannot be read.
    """
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size
