"""The committed Cog schema put where coglet reads it (the schema itself: :mod:`cog_triton.schema`).

coglet reads ``.cog/openapi_schema.json`` relative to its working directory (``crates/coglet/src/worker.rs``,
``BUNDLED_SCHEMA_PATH``) to validate inputs (HTTP 422) and to allow SSE streaming. ``cog build`` excludes ``.cog/``
from the Docker build context (replicate/cog ``pkg/image/build.go``, ``defaultExcludePatterns``) and writes its own
files there, so the committed copy lives at :data:`cog_triton.schema.SCHEMA_PATH`; the Dockerfile copies it to
``/src/.cog/`` (``cog build`` then adds the identical file), and local runs put it in place with
:func:`install_for_coglet`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cog_triton.schema import SCHEMA_PATH, load_schema
from cog_triton.settings import REPO_ROOT

#: Where coglet reads the schema, relative to its working directory (crates/coglet/src/worker.rs).
COGLET_SCHEMA_NAME = Path(".cog") / "openapi_schema.json"


def install_for_coglet(work_dir: Path = REPO_ROOT) -> Path:
    """Put the committed schema where coglet running in ``work_dir`` reads it; return that path.

    Written atomically (temporary file + rename), and only when the content differs.

    Raises:
        ConfigError: the committed schema is missing.
    """
    load_schema(SCHEMA_PATH)  # it exists and parses
    target = work_dir / COGLET_SCHEMA_NAME
    if target.is_file() and target.read_text(encoding="utf-8") == SCHEMA_PATH.read_text(encoding="utf-8"):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".openapi_schema.", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(SCHEMA_PATH.read_text(encoding="utf-8"))
    os.replace(tmp, target)
    return target
