"""Every ``cog`` command in README.md and docs/**/*.md would work against the built image.

replicate/cog (6110c912, the CLI whose SDK files are cog 0.23.1's): ``cog predict``/``run``/``train``
without an image argument build with ``serveBuildOptions`` (``pkg/cli/serve.go``; ``predict.go``,
``train.go``), which carry no Dockerfile, so they would build cog's generated image, without Triton,
and setup fails; ``cog serve`` and ``cog exec`` take no image at all. ``--dockerfile`` is honoured by
``cog build`` and ``cog push``. ``cog predict``/``run`` wait ``--setup-timeout`` seconds, 300 by default
(``pkg/cli/predict.go``), less than a multi-GB engine's download and load.

Commands are read from fenced code blocks (continuation lines joined, ``#`` comments dropped) and from
inline code spans that hold a command with arguments (a bare `cog predict` in prose is a name).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cog_triton.settings import REPO_ROOT

#: Options of the cog subcommands used here that take a value (pkg/cli: predict.go, build.go, push.go, train.go).
VALUE_OPTIONS = {"-i", "--input", "-e", "--env", "-o", "--output", "--setup-timeout", "--gpus", "--json",
                 "--dockerfile", "-f", "--file", "--progress", "-t", "--tag", "--use-cuda-base-image"}
NEED_IMAGE = {"predict", "run", "train"}
NEED_DOCKERFILE = {"build", "push"}
REFUSED = {"serve", "exec"}  # they always build cog's generated image
CLI_DEFAULT_SETUP_TIMEOUT_S = 300
IMAGE = "cog-triton"


def documents() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]


def cog_commands(text: str) -> list[list[str]]:
    """The argument lists (after ``cog``) of the cog commands in a Markdown text."""
    commands: list[list[str]] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("cog "):  # other lines (a JSON body over several lines) are not parsed
                commands.append(shlex.split(line, comments=True)[1:])
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if span.startswith("cog ") and len(span.split()) > 2:
            commands.append(shlex.split(span.replace("...", ""))[1:])
    return commands


def problems(args: list[str]) -> list[str]:
    """What is wrong with ``cog <args>`` (empty: nothing)."""
    if not args:
        return []
    sub, rest = args[0], args[1:]
    if sub in REFUSED:
        return [f"cog {sub} always builds cog's generated image (no Triton): run the built image instead"]
    if sub in NEED_DOCKERFILE:
        ok = "--dockerfile" in rest or any(w.startswith("--dockerfile=") for w in rest)
        return [] if ok else [f"cog {sub} without --dockerfile builds cog's generated image"]
    if sub not in NEED_IMAGE:
        return []
    positional, options, skip = [], {}, False
    for i, word in enumerate(rest):
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            name, eq, value = word.partition("=")
            if not eq and name in VALUE_OPTIONS:
                options[name] = rest[i + 1] if i + 1 < len(rest) else ""
                skip = True
            else:
                options[name] = value
            continue
        positional.append(word)
    found = []
    if positional[:1] != [IMAGE]:
        found.append(f"cog {sub} must name the built image ({IMAGE}) first, got {positional[:1] or 'none'}")
    if sub in ("predict", "run"):
        timeout = options.get("--setup-timeout")
        if timeout is None or not timeout.isdigit() or int(timeout) <= CLI_DEFAULT_SETUP_TIMEOUT_S:
            found.append(f"cog {sub} needs --setup-timeout above the CLI's {CLI_DEFAULT_SETUP_TIMEOUT_S} s default")
    return found


def test_every_cog_command_in_the_docs_names_the_image_or_the_dockerfile() -> None:
    checked = 0
    bad = []
    for path in documents():
        for args in cog_commands(path.read_text()):
            checked += 1
            bad += [f"{path.relative_to(REPO_ROOT)}: cog {' '.join(args)}: {p}" for p in problems(args)]
    assert bad == []
    # the scan sees the README's commands: build, push, predict (several) and train (twice)
    assert checked >= 12


@pytest.mark.parametrize(
    ("command", "wrong"),
    [
        ("cog predict -i prompt=hi", True),  # README line 9 before this check
        ("cog train -i config=gpt2-medium-fp16", True),
        ("cog predict cog-triton -i prompt=hi", True),  # no setup timeout
        ("cog predict cog-triton --setup-timeout 300 -i prompt=hi", True),
        ("cog predict --setup-timeout 1800 -i prompt=hi -e COG_WEIGHTS=x", True),
        ("cog run -i prompt=hi --setup-timeout=1800", True),
        ("cog build -t cog-triton", True),
        ("cog push r8.im/a/b", True),
        ("cog serve", True),
        ("cog predict cog-triton --setup-timeout 1800 -i prompt=hi", False),
        ("cog run cog-triton --setup-timeout=3600 -i prompt=hi", False),
        ("cog train cog-triton -i config=x", False),
        ("cog build --dockerfile Dockerfile -t cog-triton", False),
        ("cog push r8.im/a/b --dockerfile Dockerfile", False),
        ("cog login", False),
    ],
)
def test_the_check_tells_right_from_wrong(command: str, wrong: bool) -> None:
    assert bool(problems(shlex.split(command)[1:])) is wrong


def test_commands_are_found_in_blocks_and_in_inline_code() -> None:
    text = (
        "Run `cog predict -i prompt=x` or `cog predict`.\n\n```bash\n"
        "cog predict cog-triton --setup-timeout 1800 \\\n  -i prompt=y   # a comment\necho cog predict\n```\n"
    )
    assert cog_commands(text) == [
        ["predict", "cog-triton", "--setup-timeout", "1800", "-i", "prompt=y"],
        ["predict", "-i", "prompt=x"],
    ]
