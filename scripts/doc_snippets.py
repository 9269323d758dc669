#!/usr/bin/env python3
"""Writes every ```cpp block of README.md and docs/*.md to OUT_DIR as its own
translation unit (<doc>_<n>.cc), so the build compiles each one (CMake target
kiln_doc_snippets). Usage: doc_snippets.py SOURCE_DIR OUT_DIR. Prints the
files written, one per line; removes stale ones."""
import glob, os, re, sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
docs = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
written = []
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.relpath(doc, src))[0])
    for n, m in enumerate(re.finditer(r"^```cpp\n(.*?)^```", text, re.S | re.M)):
        line = text.count("\n", 0, m.start()) + 2
        body = f'#line {line} "{os.path.relpath(doc, src)}"\n' + m.group(1)
        path = os.path.join(out, f"{stem}_{n}.cc")
        if not os.path.exists(path) or open(path).read() != body:
            with open(path, "w") as f:
                f.write(body)
        written.append(path)
for stale in set(glob.glob(os.path.join(out, "*.cc"))) - set(written):
    os.remove(stale)
print("\n".join(written))
