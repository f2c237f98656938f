"""The README and docs/ point at things that exist: links, commands, scripts, modules and settings.

Relative links (files and ``#anchors``, GitHub's heading slugs), every ``scripts/...`` path and
``python -m`` module named in a command or code span, and every ``COG_TRITON_*`` name are checked
against the repository; docs/settings.md must be exactly what the settings object generates; the
architecture's module map names every module, and only modules that exist.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from cog_triton.settings import REPO_ROOT, settings_markdown, variables

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("**/*.md"))]
#: The README is what a newcomer reads in a few minutes; the rest is in docs/.
README_MAX_WORDS = 1500

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def _prose(text: str) -> str:
    """The text without fenced code blocks (links inside code are not links)."""
    return FENCE.sub("", text)


def _code(text: str) -> list[str]:
    """Fenced blocks' lines and inline code spans: where commands and names are written."""
    lines = [line for block in FENCE.findall(text) for line in block.splitlines()]
    return lines + CODE_SPAN.findall(_prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _prose(path.read_text()), flags=re.M)
    return {slug(h) for h in headings}


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(_prose(path.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_exists(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {_rel(resolved)}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_documented_script_and_module_exists(page: Path) -> None:
    missing = []
    for line in _code(page.read_text()):
        for script in re.findall(r"(?<![\w./-])((?:\.?/)?scripts/[\w./-]*[\w-])", line):
            if not (REPO_ROOT / script.removeprefix("./")).exists():
                missing.append(script)
        for module in re.findall(r"python3? -m ([\w.]+)", line):
            if module not in ("pytest", "pip", "venv") and importlib.util.find_spec(module) is None:
                missing.append(f"python -m {module}")
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_setting_name_is_a_setting(page: Path) -> None:
    fields = set(variables())
    unknown = []
    for name, star in re.findall(r"(COG_TRITON_[A-Z0-9_]*[A-Z0-9])(_?\*)?", page.read_text()):
        if star:  # a family: COG_TRITON_ADAPTER_*
            if not any(field.startswith(name) for field in fields):
                unknown.append(name + star)
        elif name not in fields:
            unknown.append(name)
    assert unknown == []


def test_the_settings_page_is_generated_from_the_settings_object() -> None:
    page = (DOCS / "settings.md").read_text()
    assert page == settings_markdown(), "regenerate: .venv/bin/python -m cog_triton.settings > docs/settings.md"
    missing = [variable for variable in variables() if f"`{variable}`" not in page]
    assert missing == []


def test_the_readme_is_short_and_links_every_docs_page() -> None:
    text = README.read_text()
    assert len(text.split()) <= README_MAX_WORDS
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README)}
    unlinked = [_rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


def test_the_architecture_has_mermaid_diagrams_github_renders() -> None:
    for page in (README, DOCS / "architecture.md"):
        blocks = re.findall(r"```mermaid\n(.*?)```", page.read_text(), re.S)
        assert blocks, _rel(page)
        assert all(re.match(r"\s*(flowchart|graph|sequenceDiagram)\b", block) for block in blocks)


def _section(path: Path, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of the same or a higher level."""
    text = path.read_text()
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert match, f"{_rel(path)} has no heading {heading!r}"
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[match.end():], flags=re.M)
    return text[match.end(): match.end() + end.start()] if end else text[match.end():]


def test_the_re_audit_names_the_pinned_releases() -> None:
    """docs/engines.md's re-audit table states the image, Triton, TensorRT-LLM and xgrammar of the pin, so a
    later pin that leaves the table behind fails here."""
    from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE_TAG, TRITON_SERVER_VERSION, XGRAMMAR_VERSION

    audit = _section(DOCS / "engines.md", f"TensorRT-LLM {TENSORRT_LLM_VERSION} re-audit")
    rows = [line for line in audit.splitlines() if line.startswith("| ")]
    assert rows[0].split("|")[1:5] == [" fact ", " 1.1.0 (`tritonserver:26.02`) ", f" {TENSORRT_LLM_VERSION} "
                                       f"(`tritonserver:{TRITON_IMAGE_TAG.split('-')[0]}`) ", " source "]
    assert len(rows) > 10 and all(row.count("|") == 5 for row in rows), "every row has fact, 1.1.0, 1.2.1, source"
    assert TRITON_SERVER_VERSION in audit and XGRAMMAR_VERSION in audit and "376f7e1b" in audit


@pytest.mark.parametrize(
    ("page", "heading"), [(README, "On a GPU"), (DOCS / "engines.md", None), (DOCS / "deploy.md", None)]
)
def test_users_are_told_to_rebuild_engines_with_the_pinned_tensorrt_llm(page: Path, heading: str | None) -> None:
    """Where users look before serving an engine, the pinned image and the rebuild with its TensorRT-LLM are named
    (setup() refuses engines of another version: tensorrtllm_backend/manifest.py)."""
    from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE_TAG

    text = " ".join((_section(page, heading) if heading else page.read_text()).split())
    assert TRITON_IMAGE_TAG in text
    assert re.search(rf"rebuilt with (TensorRT-LLM )?{re.escape(TENSORRT_LLM_VERSION)}", text), _rel(page)


PACKAGES = ("cog_triton", "tensorrtllm_backend", "common")


def test_the_module_map_names_every_module_and_only_real_ones() -> None:
    """docs/architecture.md's Modules section lists every module of the three packages (a subpackage by its
    name, each of its modules too), and every dotted name in it is a module or an attribute of one."""
    text = (DOCS / "architecture.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b((?:%s)(?:\.[A-Za-z_]+)+)" % "|".join(PACKAGES), section))
    modules = set()
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if len(parts) > 1:
                modules.add(".".join(parts))
    listed = set()
    for name in named:
        module, _, attribute = name.rpartition(".")
        if name not in modules and attribute[:1].isupper():  # cog_triton.worker.service.LLMService
            name = module
        assert name in modules, f"{name} in the module map is not a module"
        listed.add(name)
    assert sorted(modules - listed) == []
