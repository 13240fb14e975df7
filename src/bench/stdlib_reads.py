"""Tool results no one here wrote: an agent's reads of the running Python's standard library.

``--results stdlib`` replaces the generated logs with what a coding agent reads while it
works: numbered slices of source files (``read_file``), grep hits with their file and line
(``grep``), and module documentation built from the source's own docstrings and signatures
(``module_docs``, as ``pydoc`` lays it out). The text is the standard library's, read at run
time from the files of the Python that runs the bench (found with ``importlib.util.find_spec``,
never imported), so it is the same for every run on one Python minor version.

The facts a later turn asks for are drawn from that text: names a read defines (functions,
classes, constants) and the ``file:line`` locations a grep found. A fact is a value that occurs
in its own lookup's result and in no other message of the conversation, so keeping it means
keeping that result or a record or summary that copied it.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

from ..adapters.tiktoken import TiktokenTokenizer

#: Modules whose source the reads come from: pure Python on every supported version (3.11 and later).
MODULES: Final = (
    "json.encoder",
    "json.decoder",
    "heapq",
    "bisect",
    "textwrap",
    "shlex",
    "fractions",
    "statistics",
    "difflib",
    "csv",
    "configparser",
    "argparse",
    "functools",
    "dataclasses",
    "enum",
    "ipaddress",
    "calendar",
    "tokenize",
    "tarfile",
    "gzip",
    "http.client",
    "urllib.parse",
    "email.utils",
    "html.parser",
    "pprint",
    "reprlib",
    "sched",
    "queue",
    "gettext",
    "base64",
    "plistlib",
    "fileinput",
    "tempfile",
    "shutil",
    "glob",
    "fnmatch",
    "traceback",
    "contextlib",
    "timeit",
    "optparse",
    "getopt",
    "colorsys",
    "uuid",
    "random",
    "selectors",
    "mimetypes",
    "graphlib",
    "quopri",
)
#: What the greps look for.
PATTERNS: Final = ("def ", "return ", "raise ", "self.", "if not ", "import ", "class ", "while ")


@cache
def _tokenizer() -> TiktokenTokenizer:
    return TiktokenTokenizer()


@cache
def line_tokens(line: str) -> int:
    """o200k_base tokens of one line of a read, its line break included: reads are sized as the bench counts."""
    return _tokenizer().count_tokens(line) + 1


#: The tools of a stdlib workload: (name, description, JSON schema of the arguments).
TOOLS: Final = (
    (
        "read_file",
        "Read a range of lines of a file of the Python standard library, numbered.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "start": {"type": "integer"}, "end": {"type": "integer"}},
            "required": ["path", "start", "end"],
        },
    ),
    (
        "grep",
        "Search files of the Python standard library for texts, one after the other; each hit is path:line:text.",
        {
            "type": "object",
            "properties": {
                "patterns": {"type": "array", "items": {"type": "string"}},
                "paths": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["patterns", "paths"],
        },
    ),
    (
        "module_docs",
        "Show the documentation of standard library modules: their docstrings, classes, functions and data.",
        {
            "type": "object",
            "properties": {"modules": {"type": "array", "items": {"type": "string"}}},
            "required": ["modules"],
        },
    ),
)


@dataclass(frozen=True, slots=True)
class Read:
    """One read an agent makes: the tool, its arguments, the text it returned, the user's request for it.

    Attributes:
        tool: ``read_file``, ``grep`` or ``module_docs``.
        arguments: The call's arguments.
        text: The result.
        ask: The user message that asks for it.
        candidates: Values in ``text`` a later turn may ask for (names, ``file:line`` locations), in order.
    """

    tool: str
    arguments: dict[str, object]
    text: str
    ask: str
    candidates: tuple[str, ...]


@cache
def _root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@cache
def source(module: str) -> tuple[str, str] | None:
    """``(path relative to the standard library, text)`` of ``module``'s source, or ``None`` without one."""
    spec = importlib.util.find_spec(module)
    origin = None if spec is None else spec.origin
    if origin is None or not Path(origin).is_file():
        return None
    path = Path(origin)
    try:
        relative = path.relative_to(_root()).as_posix()
    except ValueError:
        relative = path.name
    return relative, path.read_text(encoding="utf-8")


def available() -> list[str]:
    """The :data:`MODULES` this Python has as source files, in order."""
    return [module for module in MODULES if source(module) is not None]


_DEFINED: Final = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w{3,})")
_ASSIGNED: Final = re.compile(r"^\s*([A-Za-z_]\w*_\w+|[A-Z][A-Z0-9_]{3,})\s*=[^=]")


_NAME: Final = re.compile(r"\b[A-Za-z_]\w*_\w+\b")


def _names(lines: Sequence[str]) -> list[str]:
    """Names the lines define (functions, classes, constants, names with an underscore), then the other names
    with an underscore they use, each once, in order."""
    defined: list[str] = []
    used: list[str] = []
    for line in lines:
        match = _DEFINED.match(line) or _ASSIGNED.match(line)
        if match and len(match.group(1).strip("_")) >= 4:
            defined.append(match.group(1))
        used += [name for name in _NAME.findall(line) if len(name.strip("_")) >= 6]
    return list(dict.fromkeys([*defined, *used]))


def read_file(module: str, rng: random.Random, tokens: int) -> Read:
    """About ``tokens`` tokens of numbered consecutive lines of ``module``'s source, from a drawn line."""
    path, text = source(module) or ("", "")
    lines = [f"{number + 1:>6}\t{line}" for number, line in enumerate(text.split("\n"))]
    sizes = [line_tokens(line) for line in lines]
    last = len(lines)  # the latest start that still leaves a whole read
    tail = 0
    while last > 0 and tail < tokens:
        last -= 1
        tail += sizes[last]
    start = rng.randrange(max(last, 1))
    end = start
    size = 0
    while end < len(lines) and size < tokens:
        size += sizes[end]
        end += 1
    body = "\n".join(lines[start:end])
    lines = text.split("\n")
    ask = f"Read lines {start + 1}-{end} of {path} and keep what it defines at hand; I will ask about it later."
    arguments: dict[str, object] = {"path": path, "start": start + 1, "end": end}
    return Read("read_file", arguments, body, ask, tuple(_names(lines[start:end])))


def grep(modules: Sequence[str], patterns: Sequence[str], tokens: int) -> Read:
    """Hits of each pattern in turn in the modules' sources, ``path:line:text``, up to about ``tokens`` tokens."""
    hits: list[str] = []
    size = 0
    paths: list[str] = []
    searched: list[str] = []
    for pattern in patterns:
        if size >= tokens:
            break
        searched.append(pattern)
        for module in modules:
            if size >= tokens:
                break
            path, text = source(module) or ("", "")
            paths.append(path)
            for number, line in enumerate(text.split("\n"), start=1):
                if pattern in line:
                    hit = f"{path}:{number}:{line.rstrip()}"
                    hits.append(hit)
                    size += line_tokens(hit)
                    if size >= tokens:
                        break
    shown = ", ".join(repr(p.strip()) for p in searched)
    ask = (
        f"Search {', '.join(dict.fromkeys(paths))} for {shown} and keep the locations at hand; "
        "I will ask where things are later."
    )
    locations = list(dict.fromkeys(":".join(hit.split(":", 2)[:2]) for hit in hits))
    arguments: dict[str, object] = {"patterns": searched, "paths": list(dict.fromkeys(paths))}
    return Read("grep", arguments, "\n".join(hits), ask, tuple(locations))


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{node.name}({ast.unparse(node.args)})"


def _doc(text: str | None, indent: str) -> list[str]:
    return [f"{indent}{line}".rstrip() for line in (text or "").strip().split("\n")] if text else []


def _module_docs(module: str) -> tuple[str, list[str]]:
    """``pydoc``-style documentation of ``module`` from its source (no import), and the names it documents."""
    path, text = source(module) or ("", "")
    tree = ast.parse(text)
    head = (ast.get_docstring(tree) or "").split("\n", 1)[0]
    lines = ["NAME", f"    {module} - {head}".rstrip(" -"), "", "FILE", f"    {path}", ""]
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    data = [
        (target.id, ast.unparse(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper()
    ]
    names: list[str] = []
    if classes:
        lines.append("CLASSES")
        for node in classes:
            names.append(node.name)
            lines += [f"    class {node.name}", *_doc(ast.get_docstring(node), "     |  "), ""]
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and not member.name.startswith("_"):
                    names.append(member.name)
                    lines += [f"     |  {_signature(member)}", *_doc(ast.get_docstring(member), "     |      ")]
            lines.append("")
    if functions:
        lines.append("FUNCTIONS")
        for node in functions:
            names.append(node.name)
            lines += [f"    {_signature(node)}", *_doc(ast.get_docstring(node), "        "), ""]
    if data:
        lines.append("DATA")
        for name, value in data:
            names.append(name)
            lines.append(f"    {name} = {value[:120]}")
    return "\n".join(lines), names


def module_docs(modules: Sequence[str], tokens: int) -> Read:
    """The documentation of the first ``modules`` that fill about ``tokens`` tokens, one after the other."""
    parts: list[str] = []
    names: list[str] = []
    shown: list[str] = []
    size = 0
    for module in modules:
        docs, documented = _module_docs(module)
        kept: list[str] = []
        for line in docs.split("\n"):
            if size >= tokens:
                break
            kept.append(line)
            size += line_tokens(line)
        parts.append("\n".join(kept))
        names += documented
        shown.append(module)
        if size >= tokens:
            break
    text = "\n\n".join(parts)
    ask = f"Show me the documentation of {', '.join(shown)} and keep the names at hand; I will ask about them later."
    kept = [name for name in dict.fromkeys(names) if len(name) >= 4 and name in text]
    return Read("module_docs", {"modules": shown}, text, ask, tuple(kept))


def reads(seed: int, count: int, tokens: int) -> list[Read]:
    """``count`` reads of about ``tokens`` tokens each, drawn from ``seed`` (a file read, a grep, docs, in turn).

    The modules, in a drawn order, are dealt into ``count`` pools, one per read, so no two reads
    show the same module (with more reads than modules, pools repeat): a file read takes the first
    module of its pool whose source fills it, a grep searches its pool in order until it has enough
    hits, and docs document its pool's modules in order, up to the size.
    """
    rng = random.Random(f"{seed}:stdlib")
    modules = available()
    if not modules:
        raise RuntimeError("this Python has none of the standard library sources the stdlib workload reads")
    order = rng.sample(modules, len(modules))
    pools = [order[number::count] or [order[number % len(order)]] for number in range(count)]

    def fills(module: str) -> bool:
        text = (source(module) or ("", ""))[1]
        return sum(line_tokens(line) for line in text.split("\n")) >= tokens

    found: list[Read] = []
    for number, pool in enumerate(pools):
        kind = number % 3
        if kind == 0:
            found.append(read_file(next((m for m in pool if fills(m)), pool[0]), rng, tokens))
        elif kind == 1:
            found.append(grep(pool, rng.sample(PATTERNS, len(PATTERNS)), tokens))
        else:
            found.append(module_docs(pool, tokens))
    return found


def _whole(value: str, text: str) -> bool:
    """``value`` occurs in ``text``, and never as part of a longer word (so finding it means finding it)."""
    bounded = len(re.findall(rf"(?<![\w.]){re.escape(value)}(?![\w])", text))
    return bounded > 0 and bounded == text.count(value)


def facts_of(reads_: Sequence[Read], others: str, markers: int, seed: int) -> list[tuple[str, ...]]:
    """For each read, up to ``markers`` candidates that occur in its text and nowhere else (``others``, other reads).

    Drawn from ``seed`` among the candidates, spread over the text, in order of appearance.
    """
    chosen: list[tuple[str, ...]] = []
    for index, current in enumerate(reads_):
        elsewhere = "\n".join([others, *(r.text for k, r in enumerate(reads_) if k != index)])
        unique = [c for c in current.candidates if c not in elsewhere and _whole(c, current.text)]
        rng = random.Random(f"{seed}:facts:{index}")
        picked = sorted(rng.sample(range(len(unique)), min(markers, len(unique))))
        chosen.append(tuple(unique[i] for i in picked))
    return chosen
