#!/usr/bin/env python3
"""Moves C++ code to kiln's Keras-style names (issue 30, section 3).

    kiln::Dense                      -> kiln::layers::DenseImpl (the class)
    std::make_shared<Dense>(64)      -> layers::Dense(64)        (the holder)
    DenseOptions                     -> layers::DenseOptions
    Input({784})                     -> layers::Input({784})
    Model, Sequential, Functional    -> models::Model, models::SequentialImpl, ...
    KILN_REGISTER_LAYER(Dense)       -> KILN_REGISTER_LAYER_AS(Dense, layers::DenseImpl)

Usage:
    scripts/migrate_names.py            # kiln's own tree (run from anywhere)
    scripts/migrate_names.py FILE...    # your code: .h/.cc/.cpp files, or .md (```cpp blocks)

It is idempotent: a second run changes nothing. String literals, comments
and preprocessor lines are left alone, so class_name() strings ("Dense") and
saved configs do not change. `auto d = std::make_shared<Dense>(...)` becomes
the holder `layers::Dense(...)` unless `d` is later used as a shared_ptr
(.reset(), .use_count(), a *_pointer_cast or a weak_ptr); then it stays
`std::make_shared<layers::DenseImpl>(...)`. On kiln's tree it also moves the
classes into their namespaces (wrapping each class in `namespace layers {`),
declares each holder next to its class and writes the compat headers
(kiln/layers/legacy_names.h, kiln/models/legacy_names.h) that keep the old
spellings compiling, deprecated, for one release.
"""

import os
import re
import shutil
import subprocess
import sys

# Layer classes that get an XImpl class and an X holder.
LAYERS = """ReLU LeakyReLU PReLU Softmax Activation MultiHeadAttention Resizing RandomFlip
RandomTranslation RandomRotation RandomZoom CategoryEncoding Hashing IntegerLookup Conv1D Conv2D
Conv2DTranspose DepthwiseConv2D SeparableConv2D Dense Dropout EinsumDense Embedding
GroupNormalization InputLayer Masking Add Subtract Multiply Average Maximum Minimum Concatenate
SpatialDropout2D GaussianNoise BatchNormalization LayerNormalization MaxPooling1D AveragePooling1D
MaxPooling2D AveragePooling2D GlobalAveragePooling1D GlobalAveragePooling2D GlobalMaxPooling1D
GlobalMaxPooling2D Rescaling Normalization LSTM GRU SimpleRNN Bidirectional TimeDistributed Flatten
Reshape UpSampling2D ZeroPadding2D Cropping2D Permute RepeatVector StringLookup TextVectorization""".split()
# Names that only change namespace: abstract bases, Options, non-Layer helpers.
LAYERS_SAME = """Conv ImageLayer RandomAffineLayer ElementwiseMerge Pooling GlobalPooling RecurrentLayer
ReLUOptions LeakyReLUOptions SoftmaxOptions MultiHeadAttentionOptions
ConvOptions Conv2DTransposeOptions DepthwiseConv2DOptions DenseOptions DropoutOptions EmbeddingOptions
GroupNormalizationOptions SpatialDropout2DOptions BatchNormalizationOptions LayerNormalizationOptions
PoolingOptions GlobalPoolingOptions RecurrentOptions SeparableConv2DOptions Conv1DOptions Conv2DOptions
PReLUOptions ActivationOptions ResizingOptions RandomFlipOptions RandomTranslationOptions RandomRotationOptions
RandomZoomOptions CategoryEncodingOptions IntegerLookupOptions HashingOptions EinsumDenseOptions MaskingOptions
MergeOptions ConcatenateOptions RescalingOptions NormalizationOptions FlattenOptions ReshapeOptions
UpSampling2DOptions PermuteOptions ZeroPadding2DOptions Cropping2DOptions RepeatVectorOptions
StringLookupOptions""".split()
LAYER_FUNCTIONS = ["Input"]
MODELS = ["Sequential", "Functional"]
MODELS_SAME = ["Model", "SequentialItem"]
CALLBACKS = """EarlyStopping ModelCheckpoint CSVLogger ReduceLROnPlateau LearningRateScheduler BackupAndRestore
TensorBoard LambdaCallback TerminateOnNaN ProgbarLogger""".split()
CALLBACKS_SAME = """Callback CallbackList HistoryCallback EarlyStoppingOptions ModelCheckpointOptions CSVLoggerOptions
ReduceLROnPlateauOptions BackupAndRestoreOptions TensorBoardOptions""".split()
# kiln::data (Keras's tf.data role): the Dataset pipeline; the readers are there already.
DATA_SAME = ["Dataset", "DatasetIterator"]
# Holder options that the class's constructors do not show as `X(const Options&`.
HOLDER_OPTIONS = {"Sequential": "std::initializer_list<SequentialItem>"}

NAMESPACE = {}
NEW = {}
for names, ns, impl in ((LAYERS, "layers", True), (LAYERS_SAME + LAYER_FUNCTIONS, "layers", False),
                        (MODELS, "models", True), (MODELS_SAME, "models", False),
                        (CALLBACKS, "callbacks", True), (CALLBACKS_SAME, "callbacks", False),
                        (DATA_SAME, "data", False)):
    for n in names:
        NAMESPACE[n] = ns
        NEW[n] = n + "Impl" if impl else n
HOLDERS = set(LAYERS) | set(MODELS) | set(CALLBACKS)
# The folders whose headers define the names (kiln's tree only).
DEFINING_DIRS = {"layers": "kiln/layers", "models": "kiln/models", "callbacks": "kiln/training", "data": "kiln/data"}
TEST_MACROS = {"TEST", "TEST_F", "TEST_P", "TYPED_TEST", "TYPED_TEST_P", "TYPED_TEST_SUITE",
               "INSTANTIATE_TEST_SUITE_P", "FRIEND_TEST", "KILN_LAYER_HOLDER", "KILN_REGISTER_LAYER_AS"}

TOKEN = re.compile(
    r"""(?P<comment>//[^\n]*|/\*.*?\*/)
      |(?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^(\s"]*)\(.*?\)(?P=delim)")
      |(?P<str>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*")
      |(?P<num>\.?\d(?:[\w.]|'(?=\w)|[eEpP][+-])*)
      |(?P<chr>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')
      |(?P<pp>^[ \t]*\#(?:\\\n|[^\n])*)
      |(?P<id>[A-Za-z_]\w*)
      |(?P<ws>\s+)
      |(?P<op>::|->|.)""",
    re.S | re.M | re.X)


def tokens(text):
    out = []
    for m in TOKEN.finditer(text):
        kind = m.lastgroup if m.lastgroup != "delim" else "raw"
        if m.group("raw") is not None:
            kind = "raw"
        out.append((kind, m.group(0), m.start(), m.end()))
    return out


def significant(toks):
    return [t for t in toks if t[0] not in ("ws", "comment", "pp")]


def qualify(name, path):
    """The new spelling of `name` as seen from namespace path `path`."""
    ns = NAMESPACE[name]
    inside = len(path) >= 2 and path[0] == "kiln" and path[1] == ns
    return NEW[name] if inside else ns + "::" + NEW[name]


def holder(name, path):
    ns = NAMESPACE[name]
    inside = len(path) >= 2 and path[0] == "kiln" and path[1] == ns
    return name if inside else ns + "::" + name


def rewrite_code(text):
    """Renames in C++ source text; returns the new text."""
    toks = significant(tokens(text))
    # Names whose XImpl this text defines were migrated already: inside their
    # namespace, a plain `Dense` there is the holder.
    done = set(re.findall(r"^(?:class|struct) (\w+)Impl\b", text, re.M))
    edits = []  # (start, end, replacement)
    stack = []  # per open brace: list of namespace names it opens, or None
    pending_ns = None
    skip_until = -1  # index of a token up to which renaming is off (test macro args)
    i = 0
    n = len(toks)

    def path():
        p = []
        for s in stack:
            if s:
                p.extend(s)
        return p

    def tok(j):
        return toks[j][1] if 0 <= j < n else ""

    while i < n:
        kind, t, start, end = toks[i]
        if t == "namespace" and kind == "id":
            j = i + 1
            names = []
            while tok(j) not in ("{", ";", "=", ""):
                if toks[j][0] == "id" and tok(j) != "inline":
                    names.append(tok(j))
                j += 1
            if tok(j) == "{":
                pending_ns = names or [""]
            i += 1
            continue
        if t == "{":
            stack.append(pending_ns)
            pending_ns = None
            i += 1
            continue
        if t == "}":
            if stack:
                stack.pop()
            i += 1
            continue
        if kind != "id":
            i += 1
            continue
        if t in TEST_MACROS and tok(i + 1) == "(":
            depth = 0
            j = i + 1
            while j < n:
                if tok(j) == "(":
                    depth += 1
                elif tok(j) == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            skip_until = j
            i += 1
            continue
        if i <= skip_until or t not in NEW:
            i += 1
            continue
        prev, prev2, prev3 = tok(i - 1), tok(i - 2), tok(i - 3)
        p = path()
        if prev in (".", "->") or (t in done and qualify(t, p) == NEW[t] and prev != "::"):
            i += 1
            continue
        if t == "KILN_REGISTER_LAYER":
            i += 1
            continue
        # KILN_REGISTER_LAYER(Dense) keeps the registry key "Dense".
        if prev == "(" and prev2 == "KILN_REGISTER_LAYER" and tok(i + 1) == ")":
            edits.append((toks[i - 2][2], toks[i + 1][3],
                          "KILN_REGISTER_LAYER_AS(%s, %s)" % (t, qualify(t, p))))
            i += 2
            continue
        if prev == "::":
            if prev2 == "kiln":  # kiln::Dense
                if (tok(i - 3) == "<" and tok(i - 4) == "make_shared" and t in HOLDERS and tok(i + 1) == ">"
                        and tok(i + 2) == "("):
                    s = toks[i - 6][2] if tok(i - 5) == "::" and tok(i - 6) == "std" else toks[i - 4][2]
                    edits.append((s, toks[i + 1][3], "kiln::%s::%s" % (NAMESPACE[t], t)))
                    i += 2
                    continue
                edits.append((start, end, NAMESPACE[t] + "::" + NEW[t]))
            elif prev2 == t or (prev2 == "~" and tok(i - 3) == "::" and tok(i - 4) == t):
                pass  # handled below
            elif prev2 in NEW and prev2 == t:
                pass
            i += 1
            continue
        if prev == "~" and prev2 == "::" and prev3 == t:  # Dense::~Dense
            edits.append((start, end, NEW[t]))
            i += 1
            continue
        if tok(i + 1) == "::" and tok(i + 2) == t and tok(i + 3) == "(":  # Dense::Dense(
            edits.append((start, toks[i + 2][3], qualify(t, p) + "::" + NEW[t]))
            i += 3
            continue
        # Forward declarations: class Dense;
        if prev in ("class", "struct") and tok(i + 1) == ";" and prev2 != "friend":
            if qualify(t, p) != NEW[t]:
                edits.append((toks[i - 1][2], toks[i + 1][3],
                              "namespace %s { %s %s; }" % (NAMESPACE[t], prev, NEW[t])))
            i += 2
            continue
        # std::make_shared<Dense>(...) -> layers::Dense(...)
        if (t in HOLDERS and prev == "<" and prev2 == "make_shared" and tok(i + 1) == ">" and tok(i + 2) == "("
                and holder_ok(text, toks, i)):
            s = toks[i - 4][2] if prev3 == "::" and tok(i - 4) == "std" else toks[i - 2][2]
            edits.append((s, toks[i + 1][3], holder(t, p)))
            i += 2
            continue
        edits.append((start, end, qualify(t, p)))
        i += 1
    for s, e, r in sorted(edits, reverse=True):
        text = text[:s] + r + text[e:]
    return collapse_deref(collapse_options(text))


def after_close(text, j, open_, close):
    """The index after the `close` that matches an `open_` just before j; -1 if none."""
    depth = 1
    while j < len(text) and depth:
        depth += {open_: 1, close: -1}.get(text[j], 0)
        j += 1
    return j if depth == 0 else -1


def rewrite_each(text, pat, fn):
    """Applies fn(text, match) -> (new text, resume position) or None at each match of pat."""
    pos = 0
    while True:
        m = pat.search(text, pos)
        if not m:
            return text
        done = fn(text, m)
        text, pos = done if done else (text, m.end())


def collapse_deref(text):
    """(*layers::Dense(64))(x) -> layers::Dense(64)(x): a holder calls like its layer."""

    def one(text, m):
        if m.group(2) not in HOLDERS:
            return None
        j = after_close(text, m.end(), "(", ")")
        if j < 0 or text[j:j + 2] != ")(":
            return None
        return text[:m.start()] + text[m.start() + 2:j] + text[j + 1:], m.start()

    return rewrite_each(text, re.compile(r"\(\*((?:(?:kiln::)?(?:layers|models|callbacks)::)(\w+))\("), one)


def collapse_options(text):
    """layers::Dense(layers::DenseOptions{...}) -> layers::Dense({...}), as Keras reads."""

    def one(text, m):
        if m.group(2) not in HOLDERS or m.group(2) != m.group(4) or m.group(4) + "Options" not in NAMESPACE:
            return None
        j = after_close(text, m.end(), "{", "}")
        if j < 0 or not text[j:].lstrip().startswith(")"):
            return None
        start = m.start(3) if m.group(3) else m.start(4)
        return text[:start] + text[m.end() - 1:], start

    return rewrite_each(text, re.compile(r"\b((?:layers|models|callbacks)::)?(\w+)\(\s*"
                                         r"((?:kiln::)?(?:layers|models|callbacks)::)?(\w+)Options\{"), one)


def holder_ok(text, toks, i):
    """False when `auto v = std::make_shared<X>(...)` is later used as a shared_ptr."""
    j = i - 1
    while j >= 0 and toks[j][1] not in ("=", ";", "{", "}", "(", ","):
        j -= 1
    if j < 1 or toks[j][1] != "=" or toks[j - 1][0] != "id":
        return True
    var = toks[j - 1][1]
    rest = text[toks[i][3]:]
    if re.search(r"\b%s\s*(\.reset\s*\(|\.use_count\s*\()" % re.escape(var), rest):
        return False
    if re.search(r"_pointer_cast\s*<[^;]*>\s*\(\s*%s\s*\)" % re.escape(var), rest):
        return False
    if re.search(r"weak_ptr<[^;]*%s\b" % re.escape(var), rest):
        return False
    if re.search(r"std::shared_ptr<[^;>]*>\s*&\s*\w+\s*=\s*%s\b" % re.escape(var), rest):
        return False
    return True


# --- kiln's own definition headers ------------------------------------------

CLASS_HEAD = re.compile(r"^(class|struct)\s+(\w+)\b(?![^\n]*;\s*$)")
FUNC_HEAD = re.compile(r"^(?:KerasTensor\s+(Input)\(|using (\w+) = )")


def wrap_definitions(text, ns):
    """Wraps the top-level definitions of `ns`'s names in `namespace ns {`, and
    declares each holder after its class. Idempotent."""
    if ("namespace %s {" % ns) in text or ("namespace kiln::%s {" % ns) in text:
        return text, []
    lines = text.split("\n")
    blocks = []  # (first, last) line indices
    defined = []
    k = 0
    while k < len(lines):
        m = CLASS_HEAD.match(lines[k]) or FUNC_HEAD.match(lines[k])
        name = m.group(2) if m and m.re is CLASS_HEAD else (m and (m.group(1) or m.group(2)))
        if name and NAMESPACE.get(name) == ns:
            e = k
            closer = "};" if m.re is CLASS_HEAD else None
            while e < len(lines) and not (lines[e].startswith(closer) if closer else lines[e].rstrip().endswith(";")):
                e += 1
            b = k
            while b > 0 and lines[b - 1].startswith("//"):
                b -= 1
            blocks.append((b, e, name))
            defined.append(name)
            k = e + 1
            continue
        k += 1
    if not blocks:
        return text, []
    groups = [[blocks[0]]]
    for blk in blocks[1:]:
        gap = lines[groups[-1][-1][1] + 1:blk[0]]
        if all(not l.strip() or l.startswith("//") for l in gap):
            groups[-1].append(blk)
        else:
            groups.append([blk])
    out = []
    k = 0
    for group in groups:
        out.extend(lines[k:group[0][0]])
        out.append("namespace %s {" % ns)
        out.append("")
        for b, e, name in group:
            out.extend(lines[b:e + 1])
            if name in HOLDERS:
                opts = HOLDER_OPTIONS.get(name)
                if not opts:
                    mo = re.search(r"\b%s\((?:const )?(\w+Options)&? \w+[ =){}]" % name, "\n".join(lines[b:e + 1]))
                    opts = mo.group(1) if mo else "void"
                out.append("KILN_LAYER_HOLDER(%s, %s);" % (name, opts))
            k = e + 1
            nxt = [x for x in group if x[0] > b]
            if nxt:
                out.extend(lines[k:nxt[0][0]])
                k = nxt[0][0]
        out.append("")
        out.append("}  // namespace %s" % ns)
    out.extend(lines[k:])
    return "\n".join(out), defined


def legacy_guard(ns, header):
    return "KILN_LEGACY_%s_%s" % (ns.upper(), re.sub(r"\W", "_", header).upper())


def legacy_header(ns, folder, sections):
    """The compat header: old kiln:: spellings, deprecated, per defining header."""
    example = next((n for n, _ in sorted(NAMESPACE.items()) if NAMESPACE[n] == ns and n in HOLDERS), None)
    if example:
        what = ["// release: `kiln::%s` is `kiln::%s::%sImpl` and warns; Options and" % (example, ns, example),
                "// helper names are plain aliases. Generated by scripts/migrate_names.py,"]
    else:
        what = ["// release: deprecated aliases of the kiln::%s names. Generated by scripts/migrate_names.py," % ns]
    lines = ["// Old spellings from before kiln::%s (issue 30), kept compiling for one" % ns] + what + [
             "// which also moves user code to the new names. Each public header of",
             "// %s defines KILN_LEGACY_<HEADER> and includes this file at its end" % folder,
             "// (no #pragma once: each section opens once its header is complete).",
             ""]
    for header, names in sections:
        guard = legacy_guard(ns, header)
        lines.append("#if defined(%s) && !defined(%s_DONE)" % (guard, guard))
        lines.append("#define %s_DONE" % guard)
        lines.append("namespace kiln {")
        for name in names:
            if name == "Input":
                lines.append('[[deprecated("use kiln::layers::Input")]] inline KerasTensor Input(')
                lines.append('    const Shape& shape, at::ScalarType dtype = at::kFloat, const std::string& name = "") {')
                lines.append("  return layers::Input(shape, dtype, name);")
                lines.append("}")
            elif name.endswith("Options") or name == "SequentialItem":
                lines.append("using %s = %s::%s;" % (name, ns, name))
            elif name in HOLDERS:
                lines.append('using %s [[deprecated("use kiln::%s::%s, or kiln::%s::%s for the class")]] = %s::%s;'
                             % (name, ns, name, ns, NEW[name], ns, NEW[name]))
            else:
                lines.append('using %s [[deprecated("use kiln::%s::%s")]] = %s::%s;' % (name, ns, name, ns, name))
        lines.append("}  // namespace kiln")
        lines.append("#endif")
        lines.append("")
    return "\n".join(lines)


def migrate_tree(root):
    changed = []
    for ns, folder in DEFINING_DIRS.items():
        sections = []
        d = os.path.join(root, folder)
        for f in sorted(os.listdir(d)):
            if not f.endswith(".h") or f in ("legacy_names.h", "layer_holder.h"):
                continue
            p = os.path.join(d, f)
            text = open(p).read()
            new, defined = wrap_definitions(text, ns)
            if not defined:
                m = re.search(r"#define (KILN_LEGACY_\w+)\n#include \"%s/legacy_names.h\"" % folder, text)
                if m:  # already migrated: recover its section
                    heads = re.findall(r"^(?:(?:class|struct) (\w+?)(?:Impl)?\b(?![^\n]*;\s*$)|KerasTensor (Input)\(|"
                                       r"using (\w+) = )", text, re.M)
                    defined = ["".join(h) for h in heads]
                    defined = [x for x in defined if NAMESPACE.get(x) == ns]
            if defined:
                sections.append((f, defined))
                tail = '\n#define %s\n#include "%s/legacy_names.h"\n' % (legacy_guard(ns, f), folder)
                if tail not in new:
                    new = new.rstrip("\n") + "\n" + tail
                if "layer_holder.h" not in new and any(x in HOLDERS for x in defined):
                    new = re.sub(r'(#include "kiln/[^"]*"\n)(?!#include "kiln)', r'\1#include "kiln/layers/layer_holder.h"\n',
                                 new, count=1)
            if new != text:
                open(p, "w").write(new)
        legacy = os.path.join(d, "legacy_names.h")
        content = legacy_header(ns, folder, sections)
        if shutil.which("clang-format"):  # compare as the tree keeps it
            content = subprocess.run(["clang-format", "--assume-filename=" + legacy], input=content, text=True,
                                     capture_output=True, check=True, cwd=root).stdout
        if not os.path.exists(legacy) or open(legacy).read() != content:
            open(legacy, "w").write(content)
            changed.append(legacy)
    files = []
    for top in ("kiln", "tools", "examples", "bench", "fuzz"):
        for dirpath, _, fs in os.walk(os.path.join(root, top)):
            for f in fs:
                if f.endswith((".h", ".cc", ".cpp")) and f not in ("legacy_names.h", "layer_holder.h"):
                    files.append(os.path.join(dirpath, f))
    for top in ("README.md", "docs"):
        p = os.path.join(root, top)
        if os.path.isfile(p):
            files.append(p)
        elif os.path.isdir(p):
            files += [os.path.join(p, f) for f in os.listdir(p) if f.endswith(".md")]
    changed += migrate_files(sorted(files))
    # The tree stays formatted as .clang-format says (longer names, sorted includes).
    cpp = [p for p in changed if p.endswith((".h", ".cc", ".cpp"))]
    if cpp and shutil.which("clang-format"):
        subprocess.run(["clang-format", "-i"] + cpp, check=True)
    return changed


def rewrite_markdown(text):
    return re.sub(r"(```(?:cpp|c\+\+)\n)(.*?)(```)", lambda m: m.group(1) + rewrite_code(m.group(2)) + m.group(3),
                  text, flags=re.S)


def migrate_files(paths):
    changed = []
    for p in paths:
        text = open(p).read()
        if "migrate_names: skip" in text:
            continue
        new = rewrite_markdown(text) if p.endswith(".md") else rewrite_code(text)
        if new != text:
            open(p, "w").write(new)
            changed.append(p)
    return changed


def main(argv):
    if len(argv) > 1:
        changed = migrate_files(argv[1:])
    else:
        changed = migrate_tree(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for p in changed:
        print(p)


if __name__ == "__main__":
    main(sys.argv)
