"""The code blocks of the documentation pages (docs/**/*.md), and their marks.

A fenced block is code when its language is python or a shell; every such
block is run by test_code_blocks.py unless the HTML comment right above it
(blank lines allowed between) says otherwise:

    <!-- not-runnable: REASON -->     not run, and the reason is required
    <!-- file: NAME -->               a python block written to NAME in the
                                      page's folder, for the page's shell
                                      blocks to run (one of them must name it)
    <!-- requires: COMMAND -->        run only where COMMAND is on PATH (a
                                      visible warning otherwise)
    <!-- run-by: TEST_FILE -->        run by that test file, which must hold
                                      the block's exact text in its COMMANDS

Display-only blocks carry another language (text, or none); a language that
is neither code nor known display is an error, so nothing slips through.
"""
import dataclasses
import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOCS = os.path.join(REPO, "docs")

PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console"}
DISPLAY = {"", "text", "none", "json", "c"}
MARKS = ("not-runnable", "file", "requires", "run-by")

_FENCE = re.compile(r"^(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.M | re.S)
_MARK = re.compile(r"<!--\s*(?P<kind>[\w-]+)\s*:\s*(?P<value>.*?)\s*-->\Z", re.S)


@dataclasses.dataclass
class Block:
    page: str   # relative to docs/, e.g. "tutorials/resnet.md"
    line: int   # of the opening fence, 1-based
    kind: str   # "python", "shell", "display" or "directive"
    language: str
    text: str
    mark: str = None   # one of MARKS, or None
    value: str = None  # the mark's value

    @property
    def id(self):
        return f"{self.page}:{self.line}"


def pages():
    """Every Markdown page of the site, relative to docs/."""
    found = glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
    return sorted(os.path.relpath(p, DOCS) for p in found
                  if not os.path.relpath(p, DOCS).startswith("_"))


# the README's blocks run as the pages' do (it is not a page of the site), named from docs/
README = os.path.relpath(os.path.join(REPO, "README.md"), DOCS)


def code_pages():
    """The pages whose code blocks the tests run: the site's and the README."""
    return pages() + [README]


def _kind(info):
    info = info.strip()
    if info.startswith("{"):
        directive, _, argument = info.partition("}")
        if directive[1:] in ("code-block", "code", "sourcecode"):
            info = argument.strip()
        else:
            return "directive", directive[1:]
    language = info.split()[0].lower() if info.split() else ""
    if language in PYTHON:
        return "python", language
    if language in SHELL:
        return "shell", language
    if language in DISPLAY:
        return "display", language
    raise ValueError(f"unknown code block language {language!r}: add it to doc_blocks.py as code "
                     "(PYTHON, SHELL) or as display only (DISPLAY)")


def blocks(page):
    """The fenced blocks of one page, in order."""
    with open(os.path.join(DOCS, page)) as f:
        text = f.read()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            kind, language = _kind(m.group("info"))
        except ValueError as e:
            raise ValueError(f"{page}:{line}: {e}") from None
        block = Block(page, line, kind, language, m.group("body"))
        before = text[:m.start()].rstrip()  # the comment right above, blank lines allowed
        mark = _MARK.match(before[before.rfind("<!--"):]) if before.endswith("-->") else None
        if mark:
            if mark.group("kind") not in MARKS:
                raise ValueError(f"{page}:{line}: unknown mark <!-- {mark.group('kind')}: ... -->; "
                                 f"known: {', '.join(MARKS)}")
            block.mark, block.value = mark.group("kind"), mark.group("value")
        out.append(block)
    return out


def all_blocks():
    return [b for page in pages() for b in blocks(page)]


def literal_includes(page):
    """The files a page includes with {literalinclude}, relative to the repository."""
    out = []
    with open(os.path.join(DOCS, page)) as f:
        text = f.read()
    for m in re.finditer(r"^```\{literalinclude\}\s+(\S+)", text, re.M):
        path = os.path.normpath(os.path.join(DOCS, os.path.dirname(page), m.group(1)))
        out.append(os.path.relpath(path, REPO))
    return out


def docstring_blocks(objects):
    """(name, code) of the ```python fences in the docstrings of `objects`
    ({name: object}) and of their public methods defined in Tarantella."""
    import inspect

    seen, out = set(), []

    def add(name, obj):
        doc = inspect.getdoc(obj) or ""
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", doc, re.M | re.S):
            code = m.group(2)
            if m.group(1) in PYTHON and code not in seen:
                seen.add(code)
                out.append((name, code))

    for name, obj in objects.items():
        add(name, obj)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    add(f"{name}.{attr}", member)
    return out


def fences_in_docstrings(source):
    """The ```python fences of every docstring of a Python source file (read, not imported)."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            out += [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", doc, re.M | re.S)
                    if m.group(1) in PYTHON]
    return out


# `tnt.NAME` in the pages that names no attribute, on purpose: the original Tarantella's names
# that migration.md lists as not available or renamed (each must stay absent: once one
# exists, its entry goes), placeholders, and the names of the core's requests
NOT_ATTRIBUTES = {
    "tnt.Group", "tnt.Allreduce", "tnt.Allgatherv", "tnt.Broadcast", "tnt.Barrier",
    "tnt.ReductionOp", "tnt.SynchCommunicator", "tnt.PipelineCommunicator",
    "tnt.distributed_optimizers", "tnt.get_group_master_rank", "tnt.is_group_master_rank",
    "tnt.global_tnt_config", "tnt.logger", "tnt.data.Dataset", "tnt.models.model_from_yaml",
    "tnt.keras.losses.ZeroLoss", "tnt.keras.metrics.ZeroMetric",  # migration.md
    "tnt.NAME",                                                 # reference/python.md
    "tnt.call",                                                 # a request's name
    "tnt.overlap",                                              # an optimizer's name (keras.md)
}

# a dotted name after `tnt.`, not one of a request's names that go on (`tnt.step.<i>`,
# `tnt.tape@thread`, `'tnt.metrics'`)
_CITED = re.compile(r"(?<![\w.'\"])tnt(?:\.[A-Za-z_]\w*)+(?![\w.@<'\"])")


def cited_names():
    """{`tnt.X.Y`: [where]} for every such name in the prose and the python blocks of the
    pages and of the README (not in display blocks: a timeline shows request names)."""
    sources = [(p, os.path.join(DOCS, p)) for p in code_pages()]
    out = {}
    for page, path in sources:
        with open(path) as f:
            text = f.read()
        for m in _FENCE.finditer(text):  # display blocks out, keeping the lines' count
            try:
                kind = _kind(m.group("info"))[0]
            except ValueError:
                continue
            if kind not in ("python",):
                text = text[:m.start()] + re.sub(r"[^\n]", " ", m.group(0)) + text[m.end():]
        for m in _CITED.finditer(text):
            out.setdefault(m.group(0), []).append(f"{page}:{text.count(chr(10), 0, m.start()) + 1}")
    return out


def launcher_from_source(folder):
    """With TNT_TEST_RUNNER_FROM_SOURCE set (as test/runner reads it), a folder holding
    `tntrun` and `tarantella` commands that run this checkout's runner/, to put first on
    PATH; else None (the installed commands run). Without it, a second checkout (a git
    worktree) tested the launcher that the editable install maps to the first one."""
    if not os.environ.get("TNT_TEST_RUNNER_FROM_SOURCE"):
        return None
    import shlex
    import sys

    os.makedirs(folder, exist_ok=True)
    shim = os.path.join(folder, "shim")
    if not os.path.exists(shim):
        os.mkdir(shim)
        os.symlink(os.path.join(REPO, "runner"), os.path.join(shim, "runner"))
    for name in ("tntrun", "tarantella"):
        boot = (f"import sys; sys.argv[0] = {name!r}; import tarantella; "
                f"tarantella.__path__.append({shim!r}); "
                "from tarantella.runner.cli import main; sys.exit(main())")
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nPYTHONPATH={shlex.quote(REPO)}${{PYTHONPATH:+:$PYTHONPATH}} "
                    f"exec {shlex.quote(sys.executable)} -c {shlex.quote(boot)} \"$@\"\n")
        os.chmod(path, 0o755)
    return folder
