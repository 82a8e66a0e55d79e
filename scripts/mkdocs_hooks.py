"""MkDocs hooks (mkdocs.yml): the site is docs/ with README.md as its home page, and
SECURITY.md and CHANGELOG.md, which stay at the top of the tree where GitHub and readers look
for them. Every page's links are written for GitHub (relative to the file in the tree); here
each one that leads to a page of the site is rewritten to that page, and any other is left
as it is, for `mkdocs build --strict` to refuse if it leads nowhere."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

# A file at the top of the tree -> its page in the site.
TOP = {"README.md": "index.md", "SECURITY.md": "security.md", "CHANGELOG.md": "changelog.md"}
DOCS = "docs/"

# An inline link's target: `](target)` or `](target#anchor)`, outside a code span's reach
# (no documentation writes `](` in code).
_LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]*)?\)")


def on_files(files, config):
    top = Path(config.config_file_path).parent
    for name, page in TOP.items():
        files.append(File.generated(config, page, abs_src_path=str(top / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    in_site = page.file.src_uri
    in_tree = next((name for name, uri in TOP.items() if uri == in_site), DOCS + in_site)

    def rewrite(found: re.Match) -> str:
        target, anchor = found.group(1), found.group(2) or ""
        if not target or ":" in target or target.startswith("/"):
            return found.group(0)  # an anchor of this page, a URL, or absolute: as written
        path = posixpath.normpath(posixpath.join(posixpath.dirname(in_tree), target))
        if path in TOP:
            path = TOP[path]
        elif path.startswith(DOCS):
            path = path[len(DOCS):]
        else:
            return found.group(0)
        return f"]({posixpath.relpath(path, posixpath.dirname(in_site) or '.')}{anchor})"

    return _LINK.sub(rewrite, markdown)
