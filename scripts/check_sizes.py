#!/usr/bin/env python3
"""Lists source files over a line limit and functions over a length limit.

Usage: check_sizes.py [--file-lines N] [--function-lines N] DIR...

A function is a brace body opened at namespace, class or file scope whose header (the text
since the previous ';', '{' or '}') holds a parenthesis and is not a namespace, class,
struct, union or enum: free functions, member functions and constructors. Lambdas and
nested blocks count towards the function around them. Comments, string and character
literals are skipped before the braces are counted. The length is the number of lines from
the header's first line to the closing brace. Exits 1 when anything is over a limit.
"""
import argparse
import os
import re
import sys

SOURCE_EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp")
CONTAINER = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern\s+\"C\")\b", re.S)


def strip(text):
    """The text with comments and literals blanked out (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of every function body at namespace or class scope."""
    code = strip(text)
    # Preprocessor lines do not end a header.
    code = re.sub(r"(?m)^[ \t]*#.*$", lambda m: " " * len(m.group(0)), code)
    stack = []  # per open brace: ("scope" | "function" | "other", start line, name)
    header_start = 0
    found = []
    line = 1
    for pos, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            header = code[header_start:pos]
            in_function = any(kind != "scope" for kind, _, _ in stack)
            if in_function:
                stack.append(("other", line, ""))
            elif CONTAINER.match(header) or "(" not in header or re.search(r"=\s*$", header):
                stack.append(("scope", line, ""))
            else:
                name = re.search(r"([~\w:]+(?:\s*<[^()]*>)?)\s*\([^()]*", header.split("(")[0] + "(")
                stripped = header.lstrip()
                first = line - stripped.count("\n")
                found_name = name.group(1) if name else "?"
                stack.append(("function", first, found_name))
            header_start = pos + 1
        elif c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    found.append((name, first, line))
            header_start = pos + 1
        elif c == ";":
            header_start = pos + 1
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-lines", type=int, default=700)
    ap.add_argument("--function-lines", type=int, default=80)
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    offenders = 0
    for top in args.dirs:
        if not os.path.isdir(top):
            continue
        for root, _, files in sorted(os.walk(top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_EXTENSIONS):
                    continue
                path = os.path.join(root, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
                if lines > args.file_lines:
                    print(f"file     {path}: {lines} lines (limit {args.file_lines})")
                    offenders += 1
                for name, first, last in functions(text):
                    length = last - first + 1
                    if length > args.function_lines:
                        print(f"function {path}:{first}: {name}: {length} lines (limit {args.function_lines})")
                        offenders += 1
    print(f"{offenders} over the limits" if offenders else "all within the limits")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
