"""Write through a hard link planted in the workspace to an outside file, and create new hard
links to an outside file and to a read-only root's file: any success is an escape."""

import os

from _common import ARGS, attempt, write

planted, outside_file, read_only_file = ARGS
attempt(f"write via planted link {planted}", lambda: write(planted, mode="ab"))
for source in (outside_file, read_only_file):
    name = "stolen-" + os.path.basename(source)
    if attempt(f"link {source}", lambda s=source, n=name: os.link(s, n)):
        attempt(f"write via new link to {source}", lambda n=name: write(n, mode="ab"))
