"""Mutation testing of the pure modules whose unit tests are fast (issue 17: "show that the tests bite").

    scripts/mutation [module ...] [--max-children N] [--work DIR] [--report-only]

For each module (default: all of MODULES) this copies the checkout (tracked and untracked, not ignored files)
into a scratch directory, runs mutmut 3 there over that one module with only that module's fast unit tests
(never the integration tests), and writes docs/mutation/<module>.md (summary and every surviving mutant that
is not listed as equivalent, with its diff) and docs/mutation/<module>.json, then the index
docs/mutation/README.md from all the .json files. The worktree itself is never mutated.

Equivalent mutants (no test can tell them from the original) are listed per module in
scripts/mutation_equivalents/<module>.txt, one `mutant-name: why it is equivalent` a line (indented lines
continue the reason). The score is
killed / (total - equivalent); a timeout counts as killed (the mutant made the tests hang: caught), a mutant
no selected test reaches counts as not killed. Target: >= 90 % per module.

mutmut is installed on first use into build/mutation-tools/mutmut-<version> (pip --target, from PyPI), not into
the project's virtual environment; it runs under the project's Python with that directory appended to sys.path,
so the project's own packages (pytest included) take precedence.

Not part of CI: a module takes minutes (about one pytest run per mutant that a test reaches).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT_VERSION = "3.8.1"
TOOLS = ROOT / "build" / "mutation-tools" / f"mutmut-{MUTMUT_VERSION}"
REPORTS = ROOT / "docs" / "mutation"
EQUIVALENTS = ROOT / "scripts" / "mutation_equivalents"
TARGET = 0.90

# module -> its fast unit tests (no integration tests: those are deselected with -m "not integration" too)
MODULES: dict[str, list[str]] = {
    "cog_triton/streaming/stop.py": ["tests/test_stop.py"],
    "cog_triton/streaming/detokenizer.py": ["tests/test_detokenizer.py"],
    "cog_triton/worker/inputs.py": ["tests/test_inputs.py"],
    # conversations (render_messages, encode_messages, template_roles) are tested with the guided-decoding ones;
    # only those (tokenizer only): the rest of test_guided.py runs torch, which a forked mutant run can hang on
    "cog_triton/streaming/prompt.py": ["tests/test_prompt.py"] + [
        f"tests/test_guided.py::test_{name}" for name in (
            "a_conversation_is_the_chat_templates_exact_tokens", "system_prompt_and_a_system_message_are_not_combined",
            "roles_are_checked_against_the_template", "special_tokens_in_message_content_stay_text",
            "a_template_that_refuses_system_messages_and_enforces_alternation",
            "template_roles_finds_the_roles_a_template_names", "messages_without_a_chat_template_are_refused",
        )
    ],
    "cog_triton/streaming/guided.py": ["tests/test_guided.py"],
    "tensorrtllm_backend/templates.py": ["tests/test_templates.py"],
}

# Tests that run torch or xgrammar (threads) cannot run in a child forked from a process that already ran them:
# the child can block for ever on a lock copied in its locked state (seen: a prompt.py mutant waiting on a futex
# with all of test_guided.py). For these, mutmut forks each mutant's run from a fork server that has only imported the
# tests (mutmut's process_isolation = forkserver).
FORKSERVER = {"cog_triton/streaming/guided.py"}

# mutmut's exit-code classes (mutmut/stats.py status_by_exit_code), folded into the report's columns
KILLED, SURVIVED, TIMEOUT, NO_TESTS = "killed", "survived", "timeout", "no tests"


def slug(module: str) -> str:
    """cog_triton/streaming/stop.py -> cog_triton.streaming.stop (the report and equivalents file name, and mutmut's name prefix)."""
    return module.removesuffix(".py").replace("/", ".")


def resolve_module(arg: str) -> str:
    """Accepts cog_triton/streaming/stop.py, cog_triton.streaming.stop or just stop."""
    for module in MODULES:
        if arg in (module, slug(module), Path(module).stem, Path(module).name):
            return module
    sys.exit(f"scripts/mutation: unknown module {arg!r}; known: {', '.join(MODULES)}")


def ensure_mutmut() -> None:
    if (TOOLS / "mutmut" / "__main__.py").is_file():
        return
    print(f"[mutation] installing mutmut {MUTMUT_VERSION} into {TOOLS}", flush=True)
    TOOLS.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="mutmut-", dir=TOOLS.parent))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(staging),
         f"mutmut=={MUTMUT_VERSION}"],
        check=True,
    )
    try:
        staging.rename(TOOLS)  # atomic: a second run at the same time sees all of it or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (TOOLS / "mutmut" / "__main__.py").is_file():
            raise


def checkout_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def make_scratch(module: str, scratch: Path) -> None:
    """A copy of the checkout with a mutmut configuration for this one module; build/ is linked, not copied."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    for rel in checkout_files():
        target = scratch / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    source_dir = Path(module).parent.as_posix()
    tops = sorted({Path(rel).parts[0] for rel in checkout_files() if len(Path(rel).parts) > 1} - {source_dir})
    tops += sorted(rel for rel in checkout_files() if len(Path(rel).parts) == 1 and rel.endswith(".py"))
    tests = MODULES[module]
    config = [
        "[mutmut]",
        f"source_paths = {source_dir}",
        f"only_mutate = {module}",
        "also_copy =\n" + "".join(f"    {t}\n" for t in tops),
        "pytest_add_cli_args_test_selection =\n" + "".join(f"    {t}\n" for t in tests),
        # no integration tests; no pytest cache written into the scratch copy
        "pytest_add_cli_args =\n    -m\n    not integration\n    -p\n    no:cacheprovider\n",
        f"process_isolation = {'forkserver' if module in FORKSERVER else 'fork'}",
    ]
    (scratch / "setup.cfg").write_text("\n".join(config))
    # mutmut reads [tool.mutmut] from pyproject.toml before setup.cfg; the checkout's has none (checked here)
    assert "[tool.mutmut]" not in (scratch / "pyproject.toml").read_text()
    # the tests find the default model under <repo>/build (cog_triton.settings.REPO_ROOT is mutants/ there)
    (scratch / "mutants").mkdir()
    (scratch / "mutants" / "build").symlink_to((ROOT / "build").resolve())


MUTMUT_MAIN = """
import sys
sys.path.append(sys.argv.pop(1))
from mutmut.__main__ import cli
cli()
"""

# run inside the scratch directory after `mutmut run`: every mutant's status, and each survivor's diff
COLLECT = """
import json, sys
sys.path.append(sys.argv[1])
from pathlib import Path
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
m = SourceFileMutationData(path=Path(sys.argv[2]))
m.load()
out = {}
for name, code in sorted(m.exit_code_by_key.items()):
    status = status_by_exit_code[code]
    diff = get_diff_for_mutant(name, path=m.path) if status != "killed" else ""
    out[name] = {"status": status, "exit_code": code, "diff": diff}
print(json.dumps(out))
"""


def run_module(module: str, work: Path, max_children: int) -> dict:
    scratch = work / slug(module)
    print(f"[mutation] {module}: scratch copy in {scratch}", flush=True)
    make_scratch(module, scratch)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # a test that starts Python (tests/test_templates.py runs scripts/fill_template.py) imports the mutated
    # module, which imports mutmut's trampoline: that process gets mutmut alone (not the pytest and other
    # packages beside it in TOOLS) on its path; the mutant under test reaches it through the environment
    shim = scratch / "mutmut-import"
    shim.mkdir()
    for entry in ("mutmut", f"mutmut-{MUTMUT_VERSION}.dist-info"):
        (shim / entry).symlink_to(TOOLS / entry)
    env["PYTHONPATH"] = str(shim)
    started = time.monotonic()
    log = scratch / "mutmut.log"
    with open(log, "w") as out:
        rc = subprocess.run(
            [sys.executable, "-c", MUTMUT_MAIN, str(TOOLS), "run", "--max-children", str(max_children)],
            cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT,
        ).returncode
    seconds = time.monotonic() - started
    if rc != 0:
        print(log.read_text()[-4000:])
        sys.exit(f"scripts/mutation: mutmut run failed for {module} (exit {rc}); log: {log}")
    collected = subprocess.run(
        [sys.executable, "-c", COLLECT, str(TOOLS), module], cwd=scratch, env=env, check=True,
        capture_output=True, text=True,
    ).stdout
    mutants = json.loads(collected)
    if not mutants:
        sys.exit(f"scripts/mutation: mutmut made no mutants of {module}; log: {log}")
    return {"module": module, "tests": MODULES[module], "seconds": round(seconds, 1),
            "mutmut": MUTMUT_VERSION, "mutants": mutants}


def load_equivalents(module: str) -> dict[str, str]:
    path = EQUIVALENTS / f"{slug(module)}.txt"
    if not path.is_file():
        return {}
    equivalents: dict[str, str] = {}
    name = ""
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and name:  # an indented line continues the reason above
            equivalents[name] += " " + line.strip()
            continue
        name, sep, why = line.partition(":")
        name = name.strip()
        if not sep or not name:
            sys.exit(f"{path}: expected 'mutant-name: why it is equivalent', got {line!r}")
        equivalents[name] = why.strip()
    for name, why in equivalents.items():
        if not why:
            sys.exit(f"{path}: {name} has no reason (say why no test can tell it from the original)")
    return equivalents


def summarize(result: dict) -> dict:
    module = result["module"]
    mutants = result["mutants"]
    equivalents = load_equivalents(module)
    status = {name: m["status"] for name, m in mutants.items()}
    counts = {k: sum(1 for s in status.values() if s == k) for k in (KILLED, SURVIVED, TIMEOUT, NO_TESTS)}
    other = len(status) - sum(counts.values())
    equivalent = [n for n in equivalents if status.get(n) in (SURVIVED, NO_TESTS)]
    # a name listed as equivalent that a test kills, or that no longer exists, is a stale entry: reported
    stale = sorted(n for n in equivalents if status.get(n) not in (SURVIVED, NO_TESTS))
    denominator = len(status) - len(equivalent)
    detected = counts[KILLED] + counts[TIMEOUT]
    score = detected / denominator if denominator else 1.0
    left = sorted(n for n, s in status.items() if s not in (KILLED, TIMEOUT) and n not in equivalents)
    return {
        "module": module, "tests": result["tests"], "seconds": result["seconds"], "mutmut": result["mutmut"],
        "total": len(status), "killed": counts[KILLED], "timeout": counts[TIMEOUT], "survived": counts[SURVIVED],
        "no_tests": counts[NO_TESTS], "other": other, "equivalent": len(equivalent),
        "score": round(score, 4), "meets_target": score >= TARGET,
        "not_killed": {n: {"status": status[n], "diff": mutants[n]["diff"]} for n in left},
        "equivalents": {n: equivalents[n] for n in sorted(equivalent)},
        "stale_equivalents": stale,
        "mutants": mutants,  # kept so --report-only can rescore with a new equivalents file
    }


def write_module_report(summary: dict) -> None:
    module = summary["module"]
    name = slug(module)
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"{name}.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    mark = "meets" if summary["meets_target"] else "**below**"
    lines = [
        f"# Mutation report: `{module}`",
        "",
        f"Made by `scripts/mutation {name}` (mutmut {summary['mutmut']}) with only "
        + ", ".join(f"`{t}`" for t in summary["tests"]) + f"; the run took {summary['seconds']:.0f} s.",
        "",
        "| total | killed | timeout | survived | no tests | equivalent | killed / (total - equivalent) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {summary['total']} | {summary['killed']} | {summary['timeout']} | {summary['survived']} "
        f"| {summary['no_tests']} | {summary['equivalent']} | {summary['score']:.1%} ({mark} the "
        f"{TARGET:.0%} target) |",
        "",
        "A timeout counts as killed; equivalent mutants are listed with their reason in "
        f"`scripts/mutation_equivalents/{name}.txt`.",
        "",
    ]
    if summary["stale_equivalents"]:
        lines += ["## Stale entries in the equivalents file (killed now, or no such mutant)", ""]
        lines += [f"- `{n}`" for n in summary["stale_equivalents"]] + [""]
    lines += [f"## Surviving mutants not listed as equivalent ({len(summary['not_killed'])})", ""]
    if not summary["not_killed"]:
        lines += ["None.", ""]
    for n, m in summary["not_killed"].items():
        lines += [f"### `{n}` ({m['status']})", "", "```diff", m["diff"], "```", ""]
    lines += [f"## Equivalent mutants ({summary['equivalent']})", ""]
    lines += [f"- `{n}`: {why}" for n, why in summary["equivalents"].items()] or ["None."]
    (REPORTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def write_index() -> None:
    rows = []
    for path in sorted(REPORTS.glob("*.json")):
        s = json.loads(path.read_text())
        rows.append(
            f"| [`{s['module']}`]({path.stem}.md) | {s['total']} | {s['killed']} | {s['timeout']} "
            f"| {s['survived'] + s['no_tests']} | {s['equivalent']} | {s['score']:.1%} "
            f"| {'yes' if s['meets_target'] else '**no**'} | {s['seconds']:.0f} s |"
        )
    missing = [m for m in MODULES if not (REPORTS / f"{slug(m)}.json").is_file()]
    text = [
        "# Mutation testing",
        "",
        "`scripts/mutation [module ...]` (not in CI: minutes per module) mutates each pure module with mutmut and",
        "runs only that module's fast unit tests against every mutant, in a scratch copy of the checkout.",
        f"Score: killed / (total - equivalent), a timeout counted as killed; target {TARGET:.0%} per module.",
        "Equivalent mutants, with the reason, are in `scripts/mutation_equivalents/`.",
        "This page is rewritten from the per-module `.json` files on every run (`--report-only` rewrites it alone).",
        "",
        "| module | total | killed | timeout | not killed | equivalent | score | target met | run time |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
        *rows,
        "",
    ]
    if missing:
        text += ["Not run yet: " + ", ".join(f"`{m}`" for m in missing), ""]
    (REPORTS / "README.md").write_text("\n".join(text))


def rescore(module: str) -> None:
    """Rewrite a module's report from its stored .json with the current equivalents file (no mutmut run)."""
    path = REPORTS / f"{slug(module)}.json"
    if not path.is_file():
        return
    write_module_report(summarize(json.loads(path.read_text())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="default: " + " ".join(MODULES))
    parser.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new temporary directory)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite docs/mutation/ from the stored results and the equivalents files")
    args = parser.parse_args()
    modules = [resolve_module(m) for m in args.modules] or list(MODULES)
    if args.report_only:
        for module in modules:
            rescore(module)
        write_index()
        return
    ensure_mutmut()
    work = args.work or Path(tempfile.mkdtemp(prefix="cog-triton-mutation-"))
    for module in modules:
        result = run_module(module, work, args.max_children)
        summary = summarize(result)
        write_module_report(summary)
        write_index()
        print(
            f"[mutation] {module}: {summary['total']} mutants, {summary['killed']} killed, {summary['timeout']} "
            f"timeout, {summary['survived']} survived, {summary['no_tests']} no tests, {summary['equivalent']} "
            f"equivalent: {summary['score']:.1%} in {summary['seconds']:.0f} s", flush=True,
        )
    print(f"[mutation] reports in {REPORTS.relative_to(ROOT)}; scratch copies in {work}")


if __name__ == "__main__":
    main()
