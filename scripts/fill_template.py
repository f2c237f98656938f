#!/usr/bin/env python3
"""Fill a Triton ``config.pbtxt`` template: a drop-in for tensorrtllm_backend's tools/fill_template.py.

    python scripts/fill_template.py [-i] CONFIG key:value,key:value[,...]

Writes the filled config to stdout, or back into CONFIG with ``-i/--in_place``. Unlike the
upstream tool it is strict: a placeholder left unfilled, a key that matches no placeholder, or
a result that is not a valid Triton ModelConfig (parsed with tritonclient's ``model_config_pb2``)
is an error naming the file and key, exit status 2. ``--allow-unfilled`` / ``--allow-unknown``
restore the lenient behaviour; ``--no-validate`` skips the protobuf parse. A literal comma in a
value is written ``\\,``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.errors import TemplateError  # noqa: E402
from tensorrtllm_backend.templates import fill_template, parse_key_values, parse_model_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file_path", type=Path, help="config.pbtxt template")
    parser.add_argument("substitutions", nargs="?", default="", help="key:value,key:value")
    parser.add_argument("-i", "--in_place", "--in-place", action="store_true", help="rewrite the file")
    parser.add_argument("--allow-unfilled", action="store_true", help="leave placeholders without a value")
    parser.add_argument("--allow-unknown", action="store_true", help="ignore keys that match no placeholder")
    parser.add_argument("--no-validate", action="store_true", help="do not parse the result as a ModelConfig")
    args = parser.parse_args(argv)
    try:
        text = args.file_path.read_text()
    except OSError as exc:
        print(f"fill_template: cannot read {args.file_path}: {exc}", file=sys.stderr)
        return 2
    try:
        values = parse_key_values(args.substitutions, what="substitutions")
        filled = fill_template(
            text,
            values,
            source=str(args.file_path),
            allow_unfilled=args.allow_unfilled,
            allow_unknown=args.allow_unknown,
        )
        if not args.no_validate:
            parse_model_config(filled, source=str(args.file_path))
    except TemplateError as exc:
        print(f"fill_template: {exc}", file=sys.stderr)
        return 2
    if args.in_place:
        args.file_path.write_text(filled)
    else:
        sys.stdout.write(filled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
