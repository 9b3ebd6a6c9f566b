#!/usr/bin/env python3
"""Writes stdlib-docs.txt: ~35 KB of English prose from the docstrings of pure-Python standard-library modules.

The text is committed, so kiln's and llama.cpp's perplexities are always measured on the same bytes; this script
only documents (and can regenerate) where it came from. Docstrings change between Python releases, so a rerun
under another version may differ: the committed file, not this script, is the reference.

Order: modules in the fixed list below; in each, the module docstring, then the docstrings of its public classes
and functions in name order. Docstrings are dedented and those shorter than 200 characters are skipped (they are
mostly signatures). Output stops at the first docstring boundary past 35,000 bytes.
"""

import importlib
import inspect
import sys

MODULES = [
    "argparse", "textwrap", "difflib", "heapq", "bisect", "contextlib", "dataclasses", "fractions",
    "functools", "statistics", "string", "tempfile", "threading", "shutil", "pathlib", "random",
    "logging", "json", "zipfile", "subprocess", "inspect", "unittest", "typing", "collections",
]
LIMIT = 35_000


def docs(mod):
    d = inspect.getdoc(mod)
    if d:
        yield d
    for name in sorted(vars(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if getattr(obj, "__module__", None) != mod.__name__:
            continue
        d = inspect.getdoc(obj)
        if d:
            yield d


def main():
    out = []
    size = 0
    for m in MODULES:
        for d in docs(importlib.import_module(m)):
            d = d.strip()
            if len(d) < 200 or not d.isascii():
                continue
            out.append(d)
            size += len(d) + 2
            if size >= LIMIT:
                break
        if size >= LIMIT:
            break
    path = sys.argv[1] if len(sys.argv) > 1 else "stdlib-docs.txt"
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()
