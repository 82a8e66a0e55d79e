"""Follow symbolic links to files outside every root: `follow LINK...` uses links planted before
the launch; `create TARGET...` makes absolute, relative and `..`-chain links at run time first.
Reading the target, or writing through the link, is an escape."""

import os

from _common import ARGS, attempt, read, write


def write_through(link):
    """Append to the file it leads to, or create a file in the directory it leads to."""
    if os.path.isdir(link):
        write(os.path.join(link, "planted"))
        return "created inside"
    write(link, mode="ab")
    return "appended"


def through(link):
    attempt(f"read via {link}", lambda: read(link) if not os.path.isdir(link) else
            os.listdir(link))
    attempt(f"write via {link}", lambda: write_through(link))


mode, *paths = ARGS
links = paths
if mode == "create":
    links = []
    for index, target in enumerate(paths):
        depth = os.getcwd().count("/")
        for kind, value in (("abs", target), ("rel", os.path.relpath(target)),
                            ("dotdot", "../" * depth + target.lstrip("/"))):
            link = f"link-{kind}-{index}"
            os.symlink(value, link)
            links.append(link)
for link in links:
    through(link)
