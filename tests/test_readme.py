"""The README (and docs/) say what the code does: their Python runs, every flag their commands
use exists, every output they show is what the command prints, every relative link resolves.

Conventions the documents follow, so that this file can read them:
- A ```python block that starts with `import` is a program and is run (every README block
  is one); other docs blocks are fragments that continue the prose. `# -> TEXT` in a Python
  block is what it prints, in that order.
- In ```bash blocks, `#  -> TEXT` lines under a command are what that command prints; in
  ```console blocks, `$ COMMAND` lines are followed by what it prints. Such commands are run
  (in a scratch copy of the repository, `../shared` beside it as in CI) and compared, except
  that a relative difference in scientific notation (`2.9e-07`) may differ from machine to
  machine: only its format is compared.
- `<!-- not run: REASON -->` on the line before a fence: the block is not run (its commands'
  flags are still checked); `<!-- slow: REASON -->`: its commands are run as slow tests.
Failures name the document and line.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parents[1]  # not resolved: a checkout reached through a link keeps its ../
SHARED = ROOT.parent / "shared"  # ../shared/data beside the clone, as in CI
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
DOCUMENTS = [*DOCS, ROOT / "weights" / "README.md"]  # flags and links checked in all of them
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
SLOW = re.compile(r"<!--\s*slow\b")
CLAIM = re.compile(r"^\s*#\s*->\s?(.*)$")  # `#  -> printed text`
INLINE_CLAIM = re.compile(r"#\s*->\s?(.*)$")  # `print(x)  # -> printed text`
SCIENTIFIC = re.compile(r"\d\.\de[-+]\d\d")  # a relative difference: machine-dependent
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
SCRIPTS = ("train.py", "evaluate.py")  # run as files; benchmarks/*.py too
MODULES = ("vit.train", "vit.evaluate", "vit.predict", "vit.export", "vit.benchmark")
# the console scripts of a pip install (pyproject.toml's [project.scripts]): vit-train -> vit.train
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CONSOLE_SCRIPTS = {name: entry.split(":")[0] for name, entry in PROJECT["scripts"].items()}
MAX_README_LINES = 300


@dataclass
class Block:
    """A fenced code block: where it is, its language, its lines, why it is not run (if so)."""

    document: Path
    line: int  # 1-based line of the first line inside the fence
    language: str
    lines: list[str]
    not_run: str | None = None
    slow: bool = False

    def where(self, offset: int = 0) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line + offset}"


@dataclass
class Command:
    """One shell command of a document, its flags' owner, and the output shown under it."""

    where: str
    text: str  # the whole command line, continuations joined
    target: str | None  # "train.py", "vit.train", "vit.predict", "benchmarks/x.py", ...
    args: list[str]
    claims: list[str] = field(default_factory=list)
    exact: bool = False  # a console block: the lines are compared with their indentation
    not_run: str | None = None
    slow: bool = False


def code_blocks(document: Path) -> list[Block]:
    blocks, current, previous = [], None, ""
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        if current is None and line.startswith("```"):
            skip = NOT_RUN.search(previous)
            current = Block(
                document,
                line=number + 1,
                language=line[3:].strip(),
                lines=[],
                not_run=skip and skip.group(1),
                slow=SLOW.search(previous) is not None,
            )
        elif current is not None and line.startswith("```"):
            blocks.append(current)
            current = None
        elif current is not None:
            current.lines.append(line)
        previous = line
    return blocks


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(offset of the first physical line, text) with `\\` continuations joined."""
    joined, start, parts = [], None, []
    for offset, line in enumerate(block.lines):
        if start is None:
            start = offset
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        joined.append((start, " ".join([*parts, line])))
        start, parts = None, []
    return joined


def expand_variables(text: str) -> str:
    """$DATA and ${DATA} become the placeholder DATA: flags are checked, not paths."""
    return re.sub(r"\$\{?(\w+)\}?", r"\1", text)


def target_of(words: list[str]) -> tuple[str | None, list[str]]:
    """Which command a shell segment runs (train.py also under torchrun and scripts/train.sh,
    whose arguments are train.py's) and the arguments it passes."""
    while words and re.fullmatch(r"\w+=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return None, []
    if words[0] == "bash" and words[1:2] == ["scripts/train.sh"]:
        return "train.py", words[2:]
    if words[0] in CONSOLE_SCRIPTS:  # vit-train ...: vit.train's flags
        return CONSOLE_SCRIPTS[words[0]], words[1:]
    is_python = Path(words[0]).name.startswith("python") or words[0] == "torchrun"
    if not is_python:
        return None, []
    for i, word in enumerate(words[1:], start=1):
        if word == "-m" and i + 1 < len(words) and words[i + 1] in MODULES:
            return words[i + 1], words[i + 2 :]
        if word in SCRIPTS or (word.startswith("benchmarks/") and word.endswith(".py")):
            return word, words[i + 1 :]
    return None, []


def shell_segments(text: str) -> list[list[str]]:
    lexer = shlex.shlex(expand_variables(text), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    segments: list[list[str]] = [[]]
    for word in lexer:
        if word in SHELL_OPERATORS:
            segments.append([])
        elif not word.startswith((">", "2>")):
            segments[-1].append(word)
    return [s for s in segments if s]


def commands_of(block: Block) -> list[Command]:
    """Every command of a shell block, with the output lines shown under it."""
    console = block.language == "console"
    commands: list[Command] = []
    for offset, text in logical_lines(block):
        claim = CLAIM.match(text)
        if console and not text.startswith("$ "):
            if commands and text.strip():
                commands[-1].claims.append(text.rstrip())
            continue
        if claim and not console:
            if commands:
                commands[-1].claims.append(claim.group(1).strip())
            continue
        line = text[2:] if console else text
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for words in shell_segments(line) or [[]]:
            target, args = target_of(words)
            commands.append(
                Command(
                    block.where(offset),
                    text=line,
                    target=target,
                    args=args,
                    exact=console,
                    not_run=block.not_run,
                    slow=block.slow,
                )
            )
    return commands


def all_commands(documents: list[Path]) -> list[Command]:
    return [
        command
        for document in documents
        for block in code_blocks(document)
        if block.language in ("bash", "console", "sh", "shell")
        for command in commands_of(block)
    ]


def python_blocks(documents: list[Path]) -> list[Block]:
    """The Python programs of the documents: every block that starts with an import."""
    return [
        block
        for document in documents
        for block in code_blocks(document)
        if block.language == "python"
        and block.lines
        and block.lines[0].startswith(("import ", "from "))
    ]


# -- the parsers of the commands -------------------------------------------------------------
class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


_PARSERS: dict[str, argparse.ArgumentParser] = {}


def parser_of(target: str) -> argparse.ArgumentParser:
    """The command's argparse parser, without running the command: its `build_parser()` if it
    has one, else the parser its `main()` builds, caught at `parse_args`."""
    if target in _PARSERS:
        return _PARSERS[target]
    if target in MODULES:
        module = importlib.import_module(target)
    else:
        name = "readme_" + re.sub(r"\W", "_", target)
        spec = importlib.util.spec_from_file_location(name, ROOT / target)
        module = importlib.util.module_from_spec(spec)
        with pytest.MonkeyPatch.context() as patch:
            # as `python benchmarks/x.py` runs it: its own folder first, for its sibling modules
            patch.syspath_prepend(str((ROOT / target).parent))
            spec.loader.exec_module(module)
    if hasattr(module, "build_parser"):
        parser = module.build_parser()
    else:

        def capture(self, *args, **kwargs):
            raise _Captured(self)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(argparse.ArgumentParser, "parse_args", capture)
            patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
            patch.setattr(sys, "argv", [target])
            try:
                module.main()
            except _Captured as caught:
                parser = caught.parser
            else:
                raise AssertionError(f"{target}: main() returned without parsing its flags")
    _PARSERS[target] = parser
    return parser


def flags(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if re.match(r"--?[A-Za-z]", a)]


def shows_an_error(command: Command) -> bool:
    return any("error:" in claim for claim in command.claims)


CHECKED = [c for c in all_commands(DOCUMENTS) if c.target is not None]


@pytest.mark.parametrize("command", CHECKED, ids=[c.where for c in CHECKED])
def test_every_flag_a_command_uses_exists(command):
    parser = parser_of(command.target)
    known = parser._option_string_actions
    unknown = [flag for flag in flags(command.args) if flag not in known]
    assert not unknown, (
        f"{command.where}: {command.target} has no {', '.join(unknown)}: {command.text}"
    )
    if shows_an_error(command):  # a documented mistake: it must fail, checked by running it
        return
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(command.args)
        except SystemExit:
            pytest.fail(
                f"{command.where}: {command.target} refuses {command.text!r}: {stderr.getvalue()}"
            )


def test_the_commands_are_found():
    """The parser of this file sees the README's four commands (a test that reads nothing
    would pass on any README)."""
    targets = {c.target for c in all_commands([README])}
    assert {"train.py", "evaluate.py", "vit.predict", "vit.export"} <= targets


def test_a_console_script_or_module_is_checked_as_the_command_it_runs():
    """`vit-train ...` and `python -m vit.evaluate ...` in a document are checked against
    vit.train's and vit.evaluate's flags, as `python train.py ...` is against train.py's."""
    assert target_of(["vit-train", "--epochs", "4"]) == ("vit.train", ["--epochs", "4"])
    assert target_of(["python", "-m", "vit.evaluate", "--knn"]) == ("vit.evaluate", ["--knn"])
    assert parser_of("vit.train").prog == parser_of("train.py").prog == "train.py"


def inline_programs(documents: list[Path]) -> dict[str, str]:
    """The `python -c CODE` of the documents' shell blocks: {where: CODE}."""
    found = {}
    for command in all_commands(documents):
        for words in shell_segments(command.text):
            if Path(words[0]).name.startswith("python") and "-c" in words[:-1]:
                found[command.where] = words[words.index("-c") + 1]
    return found


INLINE = inline_programs(DOCUMENTS)


@pytest.mark.parametrize("where", INLINE)
def test_every_inline_program_imports_what_it_names(where):
    """`python -c "from vit import precision"` failed as printed (the module is
    vit.inference.precision): each one-liner's imports are run (the rest may need a GPU)."""
    program = ast.parse(INLINE[where])
    imports = [node for node in program.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"{where}: {INLINE[where]!r} imports nothing"
    try:
        exec(compile(ast.Module(imports, type_ignores=[]), where, "exec"), {})
    except ImportError as e:
        pytest.fail(f"{where}: {INLINE[where]!r}: {e}")


# -- what the commands print -----------------------------------------------------------------
def same_line(claim: str, printed: str, exact: bool) -> bool:
    claim, printed = (
        (claim.rstrip(), printed.rstrip()) if exact else (claim.strip(), printed.strip())
    )
    pattern = SCIENTIFIC.pattern.join(re.escape(part) for part in SCIENTIFIC.split(claim))
    return re.fullmatch(pattern, printed) is not None


def missing_claims(claims: list[str], printed: list[str], exact: bool) -> list[str]:
    """The claims that are not, in order, among the printed lines."""
    lines = iter(printed)
    return [c for c in claims if not any(same_line(c, p, exact) for p in lines)]


def test_an_output_the_command_does_not_print_is_caught():
    """What the README once said predict prints, against what it prints; a relative difference
    may change with the machine, the words around it may not."""
    printed = ["wrote 10000 predictions to preds.csv"]
    assert missing_claims(["wrote 10000 predictions, 80.21% correct"], printed, exact=False)
    assert not missing_claims(["  wrote 10000 predictions to preds.csv"], printed, exact=False)
    assert missing_claims(["  wrote 10000 predictions to preds.csv"], printed, exact=True)
    onnx = "--onnx: wrote a.onnx; onnxruntime logits vs ours: max relative difference {}"
    assert not missing_claims([onnx.format("6.9e-07")], [onnx.format("2.9e-07")], exact=False)
    assert missing_claims([onnx.format("6.9e-07")], [onnx.format("2.9e-06 (x)")], exact=False)
    assert missing_claims(["b", "a"], ["a", "b"], exact=False) == ["a"]  # order counts


def scratch_checkout(tmp_path: Path) -> Path:
    """tmp/repo with every top-level entry of the repository linked in, and tmp/shared: files a
    command writes (cifar10.onnx, eval-*/) land in tmp/repo, paths print as in the README."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv"):
            (repo / entry.name).symlink_to(entry.resolve())
    if SHARED.exists():
        (tmp_path / "shared").symlink_to(SHARED.resolve())
    return repo


def run_command(text: str, cwd: Path) -> list[str]:
    python = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{python}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT.resolve()), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",  # stdout and stderr in the order a terminal shows them
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        ["bash", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600,
    )  # fmt: skip
    return done.stdout.splitlines()


# weights/README.md's outputs come from the 27-minute training run it describes: not re-run
SHOWN = [c for c in all_commands(DOCS) if c.claims]


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, id=c.where, marks=[pytest.mark.slow] if c.slow else []) for c in SHOWN],
)
def test_every_output_shown_is_what_the_command_prints(command, tmp_path):
    if command.not_run:
        pytest.skip(f"{command.where}: not run: {command.not_run}")
    if "../shared/" in command.text and not SHARED.exists():
        pytest.skip(f"{command.where} needs {SHARED}")
    printed = run_command(command.text, scratch_checkout(tmp_path))
    missing = missing_claims(command.claims, printed, command.exact)
    assert not missing, (
        f"{command.where}: `{command.text}` does not print {missing}; it printed:\n"
        + "\n".join(printed[-30:])
    )


# -- the Python ------------------------------------------------------------------------------
PROGRAMS = python_blocks(DOCUMENTS)


@pytest.mark.parametrize("block", PROGRAMS, ids=[b.where() for b in PROGRAMS])
def test_python_blocks_run_and_print_what_they_show(block, monkeypatch, capsys, one_thread):
    if block.not_run:
        pytest.skip(f"{block.where()}: not run: {block.not_run}")
    source = "\n".join(block.lines)
    if "../shared/" in source and not SHARED.exists():
        pytest.skip(f"{block.where()} needs {SHARED}")
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exec(compile(source, block.where(), "exec"), {"__name__": "__readme__"})
    claims = [m.group(1).strip() for line in block.lines if (m := INLINE_CLAIM.search(line))]
    printed = capsys.readouterr().out.splitlines()
    missing = missing_claims(claims, printed, exact=False)
    assert not missing, f"{block.where()}: does not print {missing}; it printed {printed}"


def test_every_readme_python_block_is_a_program_that_runs():
    blocks = [b for b in code_blocks(README) if b.language == "python"]
    assert blocks, "README.md shows no Python"
    assert all(b in PROGRAMS and not b.not_run for b in blocks), [b.where() for b in blocks]


# -- links and shape -------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(document: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    slugs: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose_lines(document):
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = counts.get(slug, 0)
            slugs.add(f"{slug}-{count}" if count else slug)
            counts[slug] = count + 1
    return slugs


def prose_lines(document: Path) -> list[tuple[int, str]]:
    """The (line number, text) of a document outside its code fences."""
    lines, fenced = [], False
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


LINKS = [
    (document, number, target)
    for document in DOCUMENTS
    for number, line in prose_lines(document)
    for target in LINK.findall(re.sub(r"`[^`]*`", "", line))
    if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
]


@pytest.mark.parametrize(
    "document, number, target", LINKS, ids=[f"{d.relative_to(ROOT)}:{n}" for d, n, _ in LINKS]
)
def test_relative_links_resolve(document, number, target):
    where = f"{document.relative_to(ROOT)}:{number}"
    path, _, anchor = target.partition("#")
    linked = (document.parent / path) if path else document
    assert linked.exists(), f"{where}: {target} does not exist"
    if anchor and linked.suffix == ".md":
        assert anchor in anchors(linked), f"{where}: {linked.name} has no heading #{anchor}"


def test_links_are_found():
    assert any(d == README and t.startswith("docs/") for d, _, t in LINKS)


def test_ci_runs_the_readme_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    scripts = [line for line in ci if line.startswith("bash scripts/")]
    readme = {
        text.split("#")[0].strip() for b in code_blocks(README) for _, text in logical_lines(b)
    }
    assert scripts and all(line in readme for line in scripts), scripts


def test_readme_is_short_and_its_first_screen_says_what_it_is():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    first_screen = "\n".join(lines[:40])
    for family in ("DINOv2", "CLIP", "SigLIP", "DeiT", "MAE"):
        assert family in first_screen, f"the README's first screen does not name {family}"
    activate = next(i for i, line in enumerate(lines) if "source .venv/bin/activate" in line)
    first_python = next(i for i, line in enumerate(lines) if re.match(r"\s*python ", line))
    assert activate < first_python, (
        "a bare `python` command comes before `source .venv/bin/activate`"
    )
