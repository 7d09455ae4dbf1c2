"""Sphinx extension of Tarantella's docs: pages generated from the code.

- environment.md: its table of TNT_* variables is replaced, at build time, by
  `tarantella.common.config.markdown_table()` (the C core's numeric settings
  come from core/src/params.c through the binding). The copy in the Markdown
  file is for readers on GitHub; test/common/test_docs.py keeps it equal.
- docstrings: their Markdown code fences (```python ... ```) become
  reStructuredText code blocks, which autodoc renders as code.
- `tnt-parser-epilog`: the examples that end `tntrun --help` (the parser's
  epilog), as typed; sphinx-argparse would run their lines together.
- text in single backquotes that reaches docutils' default role (in the
  parser's help, for one) is shown as code, never as a book title.
- pages written in another branch (`tnt_optional_pages` in conf.py): until
  the page exists, its toctree entry is left out and links to it become
  plain text, so that the site builds before and after that branch merges.
"""
import importlib
import os
import re

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util import logging

logger = logging.getLogger(__name__)

TABLE_HEADER = "| variable | default | meaning |"


def _environment_table(app, docname, source):
    if docname != "environment":
        return
    from tarantella.common import config

    lines = source[0].split("\n")
    try:
        start = lines.index(TABLE_HEADER)
    except ValueError:
        raise ExtensionError(f"docs/environment.md has no table starting {TABLE_HEADER!r}: "
                             "the generated table has nowhere to go") from None
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines[start:end] = config.markdown_table().split("\n")
    source[0] = "\n".join(lines)


def _missing_optional_pages(app, docname, source):
    for page in app.config.tnt_optional_pages:
        if os.path.exists(os.path.join(app.srcdir, page + ".md")):
            continue
        relative = os.path.relpath(page, os.path.dirname(docname) or ".")
        before = source[0]
        # a toctree entry is a line of its own; a link is [text](page.md#anchor)
        source[0] = re.sub(rf"^{re.escape(relative)}\n", "", source[0], flags=re.M)
        source[0] = re.sub(rf"\[([^\]]*)\]\({re.escape(relative)}\.md(#[^)]*)?\)", r"\1",
                           source[0])
        if source[0] != before:
            logger.info(f"{docname}: {page}.md does not exist yet: its links are plain text")


def _docstring_fences(app, what, name, obj, options, lines):
    out, language = [], None
    for line in lines:
        stripped = line.strip()
        if language is None and stripped.startswith("```"):
            language = stripped[3:].strip() or "text"
            indent = line[:len(line) - len(line.lstrip())]
            out += [f"{indent}.. code-block:: {language}", ""]
        elif language is not None and stripped == "```":
            language = None
            out.append("")
        elif language is not None:
            out.append(f"{indent}   {line[len(indent):]}" if line.strip() else "")
        else:
            out.append(line)
    if language is not None:
        raise ExtensionError(f"docstring of {name}: a ``` code fence is not closed")
    lines[:] = out


class ParserEpilog(SphinxDirective):
    """```{tnt-parser-epilog} module:function``` -- the epilog of the parser
    that module.function() returns, as a literal block."""
    required_arguments = 1

    def run(self):
        module, _, function = self.arguments[0].partition(":")
        parser = getattr(importlib.import_module(module), function)()
        return [nodes.literal_block(parser.epilog, parser.epilog)]


def _title_references_as_code(app, doctree):
    for node in list(doctree.findall(nodes.title_reference)):
        node.replace_self(nodes.literal(node.astext(), node.astext()))


def setup(app):
    app.add_directive("tnt-parser-epilog", ParserEpilog)
    app.connect("doctree-read", _title_references_as_code)
    app.connect("autodoc-process-docstring", _docstring_fences)
    app.add_config_value("tnt_optional_pages", [], "env")
    app.connect("source-read", _environment_table)
    app.connect("source-read", _missing_optional_pages)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
