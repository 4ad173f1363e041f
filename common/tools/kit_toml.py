"""kit_toml: read the exercises' info.toml files on any Python from 3.9 on.

Python 3.11 and later read TOML with the standard library (tomllib); where `tomli` is installed
(the same parser, for older Pythons) it is used. A login node often has neither: its python3 may
be 3.9 or 3.10, and nothing can be installed there. For that case this module carries a reader of
the small part of TOML that info.toml uses, and refuses anything else with one line (so a new
construct in an info.toml fails loudly on old Pythons instead of being misread):

  * comments (# to the end of a line, outside strings) and blank lines;
  * [table], [table.sub] and [[array.of.tables]] headers;
  * key = value, with bare keys (A-Za-z0-9_-) or "quoted" keys;
  * values: "basic strings" (escapes \\" \\\\ \\n \\t), integers, true/false, and one-line arrays
    of those.

tests/unit (kit.toml_fallback) reads every info.toml with both this reader and tomllib and
requires the same result.
"""
import re

try:
    import tomllib as _toml  # Python 3.11+  # novermin
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        import tomli as _toml  # the same parser, packaged for older Pythons
    except ImportError:
        _toml = None


class TomlError(ValueError):
    pass


def load(f):
    """Parse an open binary file, as tomllib.load does."""
    if _toml is not None:
        return _toml.load(f)
    return loads_subset(f.read().decode("utf-8"))


_BARE = re.compile(r"[A-Za-z0-9_-]+")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def _unescape(body, where):
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or body[i + 1] not in _ESCAPES:
                raise TomlError(f"{where}: an escape the kit's TOML reader does not know")
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _key(text, where):
    """One key (bare or quoted) at the start of text: (key, rest)."""
    text = text.lstrip()
    m = _STRING.match(text)
    if m:
        return _unescape(m.group(1), where), text[m.end():]
    m = _BARE.match(text)
    if not m:
        raise TomlError(f"{where}: expected a key")
    return m.group(0), text[m.end():]


def _dotted(text, where):
    keys, rest = [], text
    while True:
        k, rest = _key(rest, where)
        keys.append(k)
        rest = rest.lstrip()
        if not rest.startswith("."):
            return keys, rest
        rest = rest[1:]


def _value(text, where):
    """One value at the start of text: (value, rest)."""
    text = text.lstrip()
    m = _STRING.match(text)
    if m:
        return _unescape(m.group(1), where), text[m.end():]
    if text.startswith("["):
        items, rest = [], text[1:].lstrip()
        while not rest.startswith("]"):
            item, rest = _value(rest, where)
            items.append(item)
            rest = rest.lstrip()
            if rest.startswith(","):
                rest = rest[1:].lstrip()
            elif not rest.startswith("]"):
                raise TomlError(f"{where}: an array must be on one line, its items split by commas")
        return items, rest[1:]
    for word, val in (("true", True), ("false", False)):
        if text.startswith(word):
            return val, text[len(word):]
    m = re.match(r"[+-]?[0-9]+(?![0-9.eE:_-])", text)
    if m:
        return int(m.group(0)), text[m.end():]
    raise TomlError(f"{where}: a value the kit's TOML reader does not know (strings, integers, "
                    "booleans and one-line arrays only; Python 3.11+ reads any TOML)")


def _table(root, keys, where, array=False):
    node = root
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if last and array:
            node = node.setdefault(k, [])
            if not isinstance(node, list):
                raise TomlError(f"{where}: {k} is not an array of tables")
            node.append({})
            return node[-1]
        node = node.setdefault(k, {})
        if isinstance(node, list):  # [a.b] below [[a]]: the newest element
            node = node[-1]
        if not isinstance(node, dict):
            raise TomlError(f"{where}: {k} is a value, not a table")
    return node


def loads_subset(text):
    root = {}
    current = root
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}"
        rest = line.strip()
        if not rest or rest.startswith("#"):
            continue
        if rest.startswith("[["):
            keys, rest = _dotted(rest[2:], where)
            if not rest.startswith("]]"):
                raise TomlError(f"{where}: expected ]]")
            current, rest = _table(root, keys, where, array=True), rest[2:]
        elif rest.startswith("["):
            keys, rest = _dotted(rest[1:], where)
            if not rest.startswith("]"):
                raise TomlError(f"{where}: expected ]")
            current, rest = _table(root, keys, where), rest[1:]
        else:
            keys, rest = _dotted(rest, where)
            rest = rest.lstrip()
            if not rest.startswith("="):
                raise TomlError(f"{where}: expected =")
            value, rest = _value(rest[1:], where)
            node = _table(current, keys[:-1], where) if len(keys) > 1 else current
            if keys[-1] in node:
                raise TomlError(f"{where}: {keys[-1]} is set twice")
            node[keys[-1]] = value
        rest = rest.strip()
        if rest and not rest.startswith("#"):
            raise TomlError(f"{where}: unexpected text after the value: {rest}")
    return root
