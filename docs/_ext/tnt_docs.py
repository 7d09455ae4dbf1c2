"""Sphinx extension of Tarantella's docs: pages generated from the code.

- environment.md: its table of TNT_* variables is replaced, at build time, by
  `tarantella.common.config.markdown_table()` (the C core's numeric settings
  come from core/src/params.c through the binding). The copy in the Markdown
  file is for readers on GitHub; test/common/test_docs.py keeps it equal.
"""
from sphinx.errors import ExtensionError

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


def setup(app):
    app.connect("source-read", _environment_table)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
