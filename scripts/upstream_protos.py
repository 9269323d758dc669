#!/usr/bin/env python3
"""Reads .proto text (proto2/proto3) and describes its wire surface as JSON, so
that kiln's copies of public .proto files can be checked field-for-field
against the upstream files they copy (kiln issue 15 section 3).

What is parsed: the package; messages (nested ones too) with every field by
name and number, oneof members and map<> fields included; enums (nested ones
too) with every value; services with each RPC's request and response type;
reserved numbers and names. Options, imports and comments are read past.
Names are fully qualified ("tensorflow.serving.PredictRequest",
"tensorflow.TensorShapeProto.Dim"); type references are resolved with
protobuf's scoping rules against every file given in the same run.

Commands (standard library only; run with /usr/bin/python3):

  parse FILE...
      Print the description of the files: {"files": {path: {"package",
      "messages", "enums", "services"}}, "messages": {...}, "enums": {...},
      "services": {...}, "field_types": {...}, "reserved": {...}}.

  build --upstream DIR --kiln DIR --sources SOURCES.json -o OUT.json
      DIR trees hold the same relative paths (kiln's layout). For every
      message, enum and service that kiln's copy of a file defines, write the
      upstream description (what proto/upstream_fields.json holds), plus what
      the upstream files define that kiln's copies do not ("upstream_only").
      SOURCES.json maps each relative path to {"repo", "path", "commit"} and
      an optional "note"; it is copied into OUT's "sources".

  compare --kiln DIR --expected proto/upstream_fields.json [--markdown]
      Compare kiln's copies with the checked-in upstream description and list
      every deviation (missing or extra messages, fields, values and RPCs,
      different numbers, names, types and packages). Exit status 1 if any.

Example:
  /usr/bin/python3 scripts/upstream_protos.py compare --kiln proto \\
      --expected proto/upstream_fields.json
"""
import argparse
import json
import os
import re
import sys

SCALARS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32",
    "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string",
    "bytes",
}

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))
  | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<symbol>[{}()\[\]<>;=,.:-])
    """,
    re.VERBOSE | re.DOTALL,
)


class ProtoSyntaxError(Exception):
    pass


def tokenize(text, path):
    tokens = []
    pos = 0
    line = 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ProtoSyntaxError(
                "%s:%d: unexpected character %r" % (path, line, text[pos]))
        kind = m.lastgroup
        value = m.group(kind)
        if kind not in ("ws", "line_comment", "block_comment"):
            tokens.append((kind, value, line))
        line += value.count("\n")
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent over one file's tokens; fills a file description."""

    def __init__(self, tokens, path):
        self.tokens = tokens
        self.i = 0
        self.path = path
        self.package = ""
        # Raw declarations; type names are resolved after every file is read.
        self.messages = []  # (full_name, scope, fields, reserved)
        self.enums = []  # (full_name, values)
        self.services = []  # (full_name, scope, rpcs)

    # -- token helpers ------------------------------------------------------
    def peek(self, k=0):
        j = self.i + k
        return self.tokens[j][1] if j < len(self.tokens) else None

    def next(self):
        if self.i >= len(self.tokens):
            raise ProtoSyntaxError("%s: unexpected end of file" % self.path)
        tok = self.tokens[self.i]
        self.i += 1
        return tok[1]

    def expect(self, value):
        line = self.tokens[self.i][2] if self.i < len(self.tokens) else "EOF"
        got = self.next()
        if got != value:
            raise ProtoSyntaxError("%s:%s: expected %r, got %r" %
                                   (self.path, line, value, got))

    def skip_statement(self):
        """Skips to the end of a statement: a ';' or a balanced {...}."""
        depth = 0
        while True:
            t = self.next()
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    return
            elif t == ";" and depth == 0:
                return

    def skip_brackets(self):
        """Skips a [...] option list if one follows."""
        if self.peek() == "[":
            depth = 0
            while True:
                t = self.next()
                if t == "[":
                    depth += 1
                elif t == "]":
                    depth -= 1
                    if depth == 0:
                        return

    def number(self):
        t = self.next()
        if t == "-":
            t = "-" + self.next()
        if t == "max":
            return 536870911
        return int(t, 0)

    # -- grammar ------------------------------------------------------------
    def parse_file(self):
        while self.i < len(self.tokens):
            t = self.peek()
            if t == "package":
                self.next()
                self.package = self.next()
                self.expect(";")
            elif t == "message":
                self.parse_message(self.package)
            elif t == "enum":
                self.parse_enum(self.package)
            elif t == "service":
                self.parse_service()
            elif t == ";":
                self.next()
            else:  # syntax, edition, import, option, extend
                self.skip_statement()

    def qualify(self, scope, name):
        return scope + "." + name if scope else name

    def parse_message(self, scope):
        self.expect("message")
        full = self.qualify(scope, self.next())
        fields = {}  # name -> (number, type)
        reserved = {"numbers": [], "names": []}
        self.messages.append((full, full, fields, reserved))
        self.expect("{")
        self.parse_message_body(full, fields, reserved)

    def parse_message_body(self, full, fields, reserved):
        while True:
            t = self.peek()
            if t == "}":
                self.next()
                if self.peek() == ";":
                    self.next()
                return
            if t == "message":
                self.parse_message(full)
            elif t == "enum":
                self.parse_enum(full)
            elif t == "oneof":
                self.next()
                self.next()  # oneof name
                self.expect("{")
                while self.peek() != "}":
                    if self.peek() in ("option", ";"):
                        self.skip_statement()
                    else:
                        self.parse_field(fields)
                self.next()
            elif t == "reserved":
                self.parse_reserved(reserved)
            elif t in ("option", "extensions", "extend", ";"):
                self.skip_statement()
            else:
                self.parse_field(fields)

    def parse_reserved(self, reserved):
        self.expect("reserved")
        while True:
            t = self.peek()
            if t == ";":
                self.next()
                return
            if t == ",":
                self.next()
                continue
            if t.startswith('"') or t.startswith("'"):
                reserved["names"].append(self.next()[1:-1])
                continue
            lo = self.number()
            hi = lo
            if self.peek() == "to":
                self.next()
                hi = self.number()
            reserved["numbers"].append([lo, hi])

    def parse_field(self, fields):
        t = self.next()
        label = ""
        if t in ("repeated", "optional", "required"):
            label = t
            t = self.next()
        if t == "map":
            self.expect("<")
            key = self.next()
            self.expect(",")
            value = self.next()
            self.expect(">")
            ftype = ("map", key, value)
        elif t == "group":
            raise ProtoSyntaxError("%s: proto2 groups are not supported" %
                                   self.path)
        else:
            ftype = (label or "singular", t)
        name = self.next()
        self.expect("=")
        number = self.number()
        self.skip_brackets()
        self.expect(";")
        if name in fields:
            raise ProtoSyntaxError("%s: field %s defined twice" %
                                   (self.path, name))
        fields[name] = (number, ftype)

    def parse_enum(self, scope):
        self.expect("enum")
        full = self.qualify(scope, self.next())
        values = {}
        self.enums.append((full, values))
        self.expect("{")
        while True:
            t = self.peek()
            if t == "}":
                self.next()
                if self.peek() == ";":
                    self.next()
                return
            if t in ("option", "reserved", ";"):
                self.skip_statement()
                continue
            name = self.next()
            self.expect("=")
            values[name] = self.number()
            self.skip_brackets()
            self.expect(";")

    def parse_service(self):
        self.expect("service")
        full = self.qualify(self.package, self.next())
        rpcs = {}
        self.services.append((full, self.package, rpcs))
        self.expect("{")
        while True:
            t = self.peek()
            if t == "}":
                self.next()
                if self.peek() == ";":
                    self.next()
                return
            if t != "rpc":
                self.skip_statement()
                continue
            self.next()
            name = self.next()
            self.expect("(")
            req_stream = self.peek() == "stream"
            if req_stream:
                self.next()
            req = self.next()
            self.expect(")")
            self.expect("returns")
            self.expect("(")
            resp_stream = self.peek() == "stream"
            if resp_stream:
                self.next()
            resp = self.next()
            self.expect(")")
            if self.peek() == "{":
                self.skip_statement()
            else:
                self.expect(";")
            rpcs[name] = (req, req_stream, resp, resp_stream)


def _resolve(name, scope, known, package=""):
    """Protobuf name lookup: innermost scope outwards; '.x' is absolute.

    A one-part name defined in none of the files read (a type from an import
    that was not read) is taken to be in the file's own package.
    """
    if name.startswith("."):
        return name[1:]
    first = name.split(".")[0]
    parts = scope.split(".") if scope else []
    while True:
        prefix = ".".join(parts)
        candidate = prefix + "." + first if prefix else first
        if candidate in known:
            return (prefix + "." + name) if prefix else name
        if not parts:
            break
        parts.pop()
    if "." not in name and package:
        return package + "." + name
    return name  # not defined in the files read (e.g. google.protobuf.Any)


def _type_string(ftype, scope, known, package):
    if ftype[0] == "map":
        key = ftype[1]
        value = ftype[2] if ftype[2] in SCALARS else _resolve(
            ftype[2], scope, known, package)
        return "map<%s, %s>" % (key, value)
    label, base = ftype
    if base not in SCALARS:
        base = _resolve(base, scope, known, package)
    return base if label in ("singular", "optional") else label + " " + base


def describe(paths, names=None):
    """Parses the files and returns their description (see module doc).

    names: the key to use for each path in "files" (default: the path).
    """
    parsers = []
    for idx, path in enumerate(paths):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        p = _Parser(tokenize(text, path), path)
        p.parse_file()
        parsers.append((names[idx] if names else path, p))
    known = set()
    for _, p in parsers:
        known.update(m[0] for m in p.messages)
        known.update(e[0] for e in p.enums)
        known.update(s[0] for s in p.services)
        parts = p.package.split(".") if p.package else []
        for n in range(1, len(parts) + 1):  # packages are scopes too
            known.add(".".join(parts[:n]))
    out = {"files": {}, "messages": {}, "enums": {}, "services": {},
           "field_types": {}, "reserved": {}}
    for key, p in parsers:
        out["files"][key] = {
            "package": p.package,
            "messages": [m[0] for m in p.messages],
            "enums": [e[0] for e in p.enums],
            "services": [s[0] for s in p.services],
        }
        for full, scope, fields, reserved in p.messages:
            out["messages"][full] = {n: v[0] for n, v in fields.items()}
            out["field_types"][full] = {
                n: _type_string(v[1], scope, known, p.package)
                for n, v in fields.items()
            }
            if reserved["numbers"] or reserved["names"]:
                out["reserved"][full] = reserved
        for full, values in p.enums:
            out["enums"][full] = dict(values)
        for full, scope, rpcs in p.services:
            out["services"][full] = {
                n: [("stream " if r[1] else "") +
                    _resolve(r[0], scope, known, p.package),
                    ("stream " if r[3] else "") +
                    _resolve(r[2], scope, known, p.package)]
                for n, r in rpcs.items()
            }
    return out


def _proto_files(root):
    found = []
    for dirpath, _, filenames in os.walk(root):
        for fn in filenames:
            if fn.endswith(".proto"):
                found.append(os.path.relpath(os.path.join(dirpath, fn), root))
    return sorted(found)


def kiln_copies(root):
    """kiln's copies of public files: everything but kiln's own protos."""
    return [p for p in _proto_files(root)
            if not p.startswith(("kiln" + os.sep, "kiln_onnx" + os.sep))]


def build(upstream_root, kiln_root, sources):
    rels = kiln_copies(kiln_root)
    missing = [r for r in rels if not os.path.exists(
        os.path.join(upstream_root, r))]
    if missing:
        raise SystemExit("no upstream text for: " + ", ".join(missing))
    no_source = [r for r in rels if r not in sources]
    if no_source:
        raise SystemExit("no source recorded for: " + ", ".join(no_source))
    up = describe([os.path.join(upstream_root, r) for r in rels], rels)
    kiln = describe([os.path.join(kiln_root, r) for r in rels], rels)
    out = {
        "comment": (
            "Upstream field numbers for every message, enum and service "
            "that kiln's copies under proto/ define (kiln issue 15 section "
            "3). Written by scripts/upstream_protos.py build from the "
            "upstream texts listed in 'sources'; do not edit by hand. See "
            "docs/WIRE_COMPAT.md."),
        "sources": {r: sources[r] for r in rels},
        "files": {},
        "messages": {},
        "enums": {},
        "services": {},
        "field_types": {},
        "reserved": {},
        "upstream_only": {"messages": {}, "enums": {}, "services": {}},
    }
    for r in rels:
        ufile = up["files"][r]
        out["files"][r] = {
            "package": ufile["package"],
            "defines": ufile["messages"] + ufile["enums"] + ufile["services"],
        }
        kfile = kiln["files"][r]
        for kind in ("messages", "enums", "services"):
            for name in ufile[kind]:
                if name in kfile[kind]:
                    out[kind][name] = up[kind][name]
                    if kind == "messages":
                        out["field_types"][name] = up["field_types"][name]
                        if name in up["reserved"]:
                            out["reserved"][name] = up["reserved"][name]
                else:
                    out["upstream_only"][kind][name] = up[kind][name]
    return out


def compare(kiln_root, expected):
    """Returns a list of (file, kind, text) deviations of kiln from upstream."""
    rels = kiln_copies(kiln_root)
    kiln = describe([os.path.join(kiln_root, r) for r in rels], rels)
    devs = []
    owner = {}
    for r, f in kiln["files"].items():
        for kind in ("messages", "enums", "services"):
            for name in f[kind]:
                owner[name] = r
    for r in expected["files"]:
        if r not in kiln["files"]:
            devs.append((r, "missing file", "kiln has no copy of %s" % r))
            continue
        if kiln["files"][r]["package"] != expected["files"][r]["package"]:
            devs.append((r, "package", "package %s, upstream %s" % (
                kiln["files"][r]["package"],
                expected["files"][r]["package"])))
    for r in kiln["files"]:
        if r not in expected["files"]:
            devs.append((r, "unlisted file",
                         "%s is not in the upstream list" % r))
    up_only = expected.get("upstream_only", {})
    missing_types = set(up_only.get("messages", {}))
    for name in up_only.get("messages", {}):
        if name.rsplit(".", 1)[0] in missing_types:
            continue  # reported with the enclosing message
        nested = sorted(n[len(name) + 1:] for n in missing_types
                        if n.startswith(name + "."))
        devs.append((_file_of(name, expected), "missing message",
                     "upstream message %s is not in kiln's copy%s" % (
                         name, " (nor its nested %s)" % ", ".join(nested)
                         if nested else "")))
    for name in up_only.get("enums", {}):
        if name.rsplit(".", 1)[0] in missing_types:
            continue
        devs.append((_file_of(name, expected), "missing enum",
                     "upstream enum %s is not in kiln's copy" % name))
    for name in up_only.get("services", {}):
        devs.append((_file_of(name, expected), "missing service",
                     "upstream service %s is not in kiln's copy" % name))

    for name, efields in expected["messages"].items():
        kfields = kiln["messages"].get(name)
        if kfields is None:
            devs.append((_file_of(name, expected), "missing message",
                         "message %s is gone from kiln's copy" % name))
            continue
        f = owner[name]
        by_number = {v: n for n, v in kfields.items()}
        for field, num in efields.items():
            if field in kfields:
                if kfields[field] != num:
                    devs.append((f, "different number",
                                 "%s.%s is %d, upstream %d" %
                                 (name, field, kfields[field], num)))
                else:
                    et = expected["field_types"][name][field]
                    kt = kiln["field_types"][name][field]
                    if et != kt:
                        devs.append((f, "different type",
                                     "%s.%s (= %d) is `%s`, upstream `%s`" %
                                     (name, field, num, kt, et)))
            elif num in by_number and by_number[num] not in efields:
                devs.append((f, "different name",
                             "%s field %d is `%s`, upstream `%s`" %
                             (name, num, by_number[num], field)))
            else:
                devs.append((f, "missing field",
                             "%s.%s = %d (%s) is not in kiln's copy" %
                             (name, field, num,
                              expected["field_types"][name][field])))
        exp_reserved = expected.get("reserved", {}).get(name, {})
        for lo, hi in kiln["reserved"].get(name, {}).get("numbers", []):
            for num in range(lo, min(hi, lo + 1000) + 1):
                if num in efields.values():
                    continue  # reported as a missing field
                if any(a <= num <= b
                       for a, b in exp_reserved.get("numbers", [])):
                    continue
                devs.append((f, "kiln-only reserved number",
                             "%s reserves %d; upstream neither uses nor "
                             "reserves it" % (name, num)))
        exp_numbers = set(efields.values())
        for field, num in kfields.items():
            if field in efields:
                continue
            if num in exp_numbers and num in by_number:
                continue  # reported above as a different name
            devs.append((f, "kiln-only field",
                         "%s.%s = %d (%s) is not upstream" %
                         (name, field, num,
                          kiln["field_types"][name][field])))

    for name, evalues in expected["enums"].items():
        kvalues = kiln["enums"].get(name)
        if kvalues is None:
            devs.append((_file_of(name, expected), "missing enum",
                         "enum %s is gone from kiln's copy" % name))
            continue
        f = owner[name]
        for value, num in evalues.items():
            if value not in kvalues:
                devs.append((f, "missing enum value",
                             "%s.%s = %d is not in kiln's copy" %
                             (name, value, num)))
            elif kvalues[value] != num:
                devs.append((f, "different number",
                             "%s.%s is %d, upstream %d" %
                             (name, value, kvalues[value], num)))
        for value, num in kvalues.items():
            if value not in evalues:
                devs.append((f, "kiln-only enum value",
                             "%s.%s = %d is not upstream" %
                             (name, value, num)))

    for name, erpcs in expected["services"].items():
        krpcs = kiln["services"].get(name)
        if krpcs is None:
            devs.append((_file_of(name, expected), "missing service",
                         "service %s is gone from kiln's copy" % name))
            continue
        f = owner[name]
        for rpc, types in erpcs.items():
            if rpc not in krpcs:
                devs.append((f, "missing RPC", "%s.%s(%s) returns (%s)" %
                             (name, rpc, types[0], types[1])))
            elif krpcs[rpc] != types:
                devs.append((f, "different RPC types",
                             "%s.%s is (%s) -> (%s), upstream (%s) -> (%s)" %
                             (name, rpc, krpcs[rpc][0], krpcs[rpc][1],
                              types[0], types[1])))
        for rpc, types in krpcs.items():
            if rpc not in erpcs:
                devs.append((f, "kiln-only RPC", "%s.%s(%s) returns (%s)" %
                             (name, rpc, types[0], types[1])))

    listed = set(expected["messages"]) | set(expected["enums"]) | set(
        expected["services"])
    for kind in ("messages", "enums", "services"):
        for name in kiln[kind]:
            if name not in listed:
                devs.append((owner[name], "kiln-only " + kind[:-1],
                             "%s is defined by kiln but not upstream" % name))
    return devs


def _file_of(name, expected):
    for r, info in expected["files"].items():
        if name in info["defines"]:
            return r
    return "?"


def main(argv):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parse")
    p.add_argument("files", nargs="+")
    b = sub.add_parser("build")
    b.add_argument("--upstream", required=True)
    b.add_argument("--kiln", required=True)
    b.add_argument("--sources", required=True)
    b.add_argument("-o", "--output", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--kiln", required=True)
    c.add_argument("--expected", required=True)
    c.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)

    if args.cmd == "parse":
        json.dump(describe(args.files), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.cmd == "build":
        with open(args.sources, encoding="utf-8") as f:
            sources = json.load(f)
        out = build(args.upstream, args.kiln, sources)
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print("%s: %d messages, %d enums, %d services (+ %d upstream-only "
              "messages, %d enums)" % (
                  args.output, len(out["messages"]), len(out["enums"]),
                  len(out["services"]),
                  len(out["upstream_only"]["messages"]),
                  len(out["upstream_only"]["enums"])))
        return 0
    with open(args.expected, encoding="utf-8") as f:
        expected = json.load(f)
    devs = compare(args.kiln, expected)
    devs.sort(key=lambda d: (d[0], d[1], d[2]))
    if args.markdown:
        current = None
        for f, kind, text in devs:
            if f != current:
                print("\n### %s\n" % f)
                current = f
            print("- **%s**: %s" % (kind, text))
    else:
        for f, kind, text in devs:
            print("%s: %s: %s" % (f, kind, text))
    print("%d deviations" % len(devs), file=sys.stderr)
    return 1 if devs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
