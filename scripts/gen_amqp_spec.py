#!/usr/bin/env python3
"""Generate amqp/spec.py (the AMQP 0-9-1 method catalogue) and amqp/properties.py (the basic
content properties codec) from the spec XML.

Theory of operation: the XML is parsed into plain records (constants, domains, classes,
methods, fields), a short table of RabbitMQ errata is applied, and every method becomes a
Python class with straight-line `struct` code for encoding and a module-level decoder
function. Consecutive fixed-size fields (including the length prefix of the string that
follows them) are merged into one precompiled `struct.Struct`, consecutive bits are packed
into octets (spec 4.2.5.2), and reserved fields are written as zeros and skipped when read.
Nothing in the output depends on dict or set iteration order of the generator's process,
so the output is byte-for-byte deterministic and a test regenerates it and expects no diff.

The content properties are the basic class's fields; their codec is generated the same way,
one straight-line branch per property in flag-bit order (see "Content properties" below).

Usage: gen_amqp_spec.py [--spec PATH] [--output PATH] [--properties-output PATH] [--check]
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import keyword
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT / "amqp" / "spec_xml" / "amqp0-9-1-rabbitmq-extended.xml"
DEFAULT_OUTPUT = REPO_ROOT / "amqp" / "spec.py"
DEFAULT_PROPERTIES_OUTPUT = REPO_ROOT / "amqp" / "properties.py"

# RabbitMQ errata applied on top of the XML. Each entry cites where RabbitMQ differs.
# rabbitmq-codegen's amqp-rabbitmq-0.9.1.json defines NO-ROUTE (312), which RabbitMQ uses in
# basic.return for unroutable mandatory messages; the XML omits it.
EXTRA_CONSTANTS = (("no-route", 312, "soft-error"),)
# The full 0-9-1 spec and rabbitmq-codegen mark basic.recover synchronous with reply
# basic.recover-ok; the stripped XML lost the attribute and the <response> element.
METHOD_ERRATA = {
    "basic.recover": {"synchronous": True, "responses": ("basic.recover-ok",)},
}
# RabbitMQ's extensions to class connection that the XML lacks (rabbitmq-codegen's
# amqp-rabbitmq-0.9.1.json): resource alarms (blocked/unblocked) and update-secret.
EXTRA_METHODS = (
    # (class, method name, method id, synchronous, responses, fields as (name, wire type))
    ("connection", "blocked", 60, False, (), (("reason", "shortstr"),)),
    ("connection", "unblocked", 61, False, (), ()),
    (
        "connection",
        "update-secret",
        70,
        True,
        ("connection.update-secret-ok",),
        (("new-secret", "longstr"), ("reason", "shortstr")),
    ),
    ("connection", "update-secret-ok", 71, True, (), ()),
)
# The XML calls the 14th basic property "reserved"; RabbitMQ and every client call it
# cluster-id (it is deprecated but still carried on the wire).
PROPERTY_RENAMES = {"reserved": "cluster-id"}

# wire type -> struct code, for the fixed-size types; then type hints and zero defaults
FIXED_CODES = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
TYPE_HINTS = {
    "octet": "int",
    "short": "int",
    "long": "int",
    "longlong": "int",
    "timestamp": "int",
    "shortstr": "str",
    "longstr": "bytes | str",
    "bit": "bool",
    "table": "FieldTable | None",
}
DEFAULTS = {
    "octet": "0",
    "short": "0",
    "long": "0",
    "longlong": "0",
    "timestamp": "0",
    "shortstr": '""',
    "longstr": 'b""',
    "bit": "False",
    "table": "None",
}


@dataclasses.dataclass
class Field:
    name: str  # spec name, dashes
    type: str  # resolved wire type
    reserved: bool

    @property
    def py(self) -> str:
        return python_name(self.name)


@dataclasses.dataclass
class Method:
    class_name: str
    class_id: int
    name: str
    method_id: int
    synchronous: bool
    content: bool
    responses: tuple[str, ...]
    fields: list[Field]

    @property
    def full_name(self) -> str:
        return f"{self.class_name}.{self.name}"

    @property
    def cls(self) -> str:
        return camel(self.class_name) + camel(self.name)

    @property
    def index(self) -> int:
        return self.class_id << 16 | self.method_id

    @property
    def args(self) -> list[Field]:
        return [f for f in self.fields if not f.reserved]


@dataclasses.dataclass
class Spec:
    frame_constants: list[tuple[str, int]]
    reply_codes: list[tuple[str, int, str]]
    methods: list[Method]
    basic_properties: list[Field]


def bytes_literal(data: bytes) -> str:
    return 'b"' + "".join(f"\\x{b:02x}" for b in data) + '"'


def assign_tuple(indent: str, lhs: str, items: list[str]) -> list[str]:
    """`lhs = (items)`, on one line if it fits in 99 columns, else one item per line."""
    one = f"{indent}{lhs} = {tuple_literal(items)}"
    if len(one) <= 99:
        return [one]
    return [f"{indent}{lhs} = ("] + [f"{indent}    {item}," for item in items] + [f"{indent})"]


def tuple_literal(items: list[str]) -> str:
    if not items:
        return "()"
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def python_name(name: str) -> str:
    py = name.replace("-", "_").replace(" ", "_")
    return py + "_" if keyword.iskeyword(py) else py


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def parse_spec(path: Path) -> Spec:
    root = ET.parse(path).getroot()
    domains = {d.get("name"): d.get("type") for d in root.findall("domain")}

    def resolve(el: ET.Element) -> str:
        wire = el.get("type") or domains[el.get("domain")]
        # a domain may be defined in terms of another domain
        while wire in domains and domains[wire] != wire:
            wire = domains[wire]
        assert wire in TYPE_HINTS, f"unknown wire type {wire}"
        return wire

    frame_constants = []
    reply_codes = []
    for c in root.findall("constant"):
        name, value = c.get("name"), int(c.get("value"))
        if name.startswith("frame-") and c.get("class") is None:
            frame_constants.append((name, value))
        else:
            reply_codes.append((name, value, c.get("class", "")))
    known = {code for _, code, _ in reply_codes}
    for name, value, cls in EXTRA_CONSTANTS:
        if value not in known:
            reply_codes.append((name, value, cls))
    reply_codes.sort(key=lambda item: item[1])

    methods = []
    basic_properties = []
    for c in root.findall("class"):
        class_name, class_id = c.get("name"), int(c.get("index"))
        if class_name == "basic":
            for f in c.findall("field"):
                name = PROPERTY_RENAMES.get(f.get("name"), f.get("name"))
                basic_properties.append(Field(name, resolve(f), False))
        for m in c.findall("method"):
            name = m.get("name")
            full = f"{class_name}.{name}"
            errata = METHOD_ERRATA.get(full, {})
            responses = tuple(f"{class_name}.{r.get('name')}" for r in m.findall("response"))
            methods.append(
                Method(
                    class_name=class_name,
                    class_id=class_id,
                    name=name,
                    method_id=int(m.get("index")),
                    synchronous=errata.get("synchronous", m.get("synchronous") == "1"),
                    content=m.get("content") == "1",
                    responses=errata.get("responses", responses),
                    fields=[Field(f.get("name"), resolve(f), f.get("reserved") == "1") for f in m.findall("field")],
                )
            )
    for class_name, name, method_id, synchronous, responses, fields in EXTRA_METHODS:
        class_id = next(m.class_id for m in methods if m.class_name == class_name)
        if any(m.class_name == class_name and m.name == name for m in methods):
            continue
        methods.append(
            Method(
                class_name=class_name,
                class_id=class_id,
                name=name,
                method_id=method_id,
                synchronous=synchronous,
                content=False,
                responses=responses,
                fields=[Field(f, t, False) for f, t in fields],
            )
        )
    methods.sort(key=lambda m: (m.class_id, m.method_id))
    assert len(basic_properties) == 14, "basic has 14 properties"
    return Spec(frame_constants, reply_codes, methods, basic_properties)


# ---------------------------------------------------------------------------------------
# Code generation. A method's wire layout becomes a list of items:
#   ("fixed", code, encode_expr, decode_target, bit_run)
#       one struct code; decode_target None = padding to skip; bit_run = the bit fields
#       packed into this octet, or None
#   ("shortstr" | "longstr", field)                the data after a length prefix
#   ("table", field)
# where strings contribute their length prefix as a preceding "fixed" item.


class StructRegistry:
    """Module-level precompiled structs, one per distinct format, in first-use order."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def get(self, fmt: str) -> str:
        if fmt not in self.names:
            self.names[fmt] = "_S_" + fmt.replace("x", "X")
        return self.names[fmt]

    def render(self) -> list[str]:
        return [f'{name} = Struct(">{fmt}")' for fmt, name in self.names.items()]


def layout(method: Method) -> list[tuple]:
    items: list[tuple] = []
    fields = method.fields
    i = 0
    n_bits = 0
    while i < len(fields):
        f = fields[i]
        if f.type == "bit":
            # consecutive bits share octets, eight to an octet (spec 4.2.5.2)
            run = []
            while i < len(fields) and fields[i].type == "bit" and len(run) < 8:
                run.append(fields[i])
                i += 1
            terms = [f"({1 << k} if self.{b.py} else 0)" for k, b in enumerate(run) if not b.reserved]
            # a lone term needs no parentheses (they would be extraneous in a pack() argument)
            expr = " | ".join(terms) if len(terms) > 1 else terms[0][1:-1] if terms else "0"
            var = f"bits{n_bits}"
            n_bits += 1
            target = var if terms else None
            items.append(("fixed", "B", expr, target, run))
            continue
        i += 1
        if f.type in FIXED_CODES:
            code = FIXED_CODES[f.type]
            if f.reserved:
                items.append(("fixed", code, "0", None, None))
            else:
                items.append(("fixed", code, f"self.{f.py}", f"obj.{f.py}", None))
        elif f.type == "shortstr":
            if f.reserved:
                items.append(("fixed", "B", "0", f"n_{f.py}", None))
            else:
                items.append(("fixed", "B", f"len(v_{f.py})", f"n_{f.py}", None))
            items.append(("shortstr", f))
        elif f.type == "longstr":
            if f.reserved:
                items.append(("fixed", "I", "0", f"n_{f.py}", None))
            else:
                items.append(("fixed", "I", f"len(v_{f.py})", f"n_{f.py}", None))
            items.append(("longstr", f))
        elif f.type == "table":
            if f.reserved:
                raise AssertionError("reserved table fields do not occur in 0-9-1")
            items.append(("table", f))
        else:  # pragma: no cover - resolve() asserted the type
            raise AssertionError(f.type)
    return items


def group(items: list[tuple], encoding: bool = False) -> list[tuple]:
    """Merge runs of fixed items into ("struct", [fixed items]) entries. When encoding, a
    reserved string contributes only its zero length prefix, so it does not break a run."""
    out: list[tuple] = []
    for item in items:
        if encoding and item[0] in ("shortstr", "longstr") and item[1].reserved:
            continue
        if item[0] == "fixed":
            if out and out[-1][0] == "struct":
                out[-1][1].append(item)
            else:
                out.append(("struct", [item]))
        else:
            out.append(item)
    return out


def is_literal(expr: str) -> bool:
    return expr.isdigit()


def gen_encode(method: Method, structs: StructRegistry) -> list[str]:
    body: list[str] = []
    for f in method.args:
        if f.type == "shortstr":
            body.append(f"v_{f.py} = self.{f.py}.encode()")
            body.append(f"if len(v_{f.py}) > 255:")
            body.append(f'    raise ValueError("{method.full_name} {f.py} is longer than 255 bytes")')
        elif f.type == "longstr":
            body.append(f"v_{f.py} = self.{f.py}")
            # isinstance rather than an exact class test: the type checker narrows on it, and
            # longstr fields are only in the handshake (start, start-ok, secure, update-secret)
            body.append(f"if isinstance(v_{f.py}, str):")
            body.append(f"    v_{f.py} = v_{f.py}.encode()")
    header = [("fixed", "H", str(method.class_id), None, None), ("fixed", "H", str(method.method_id), None, None)]
    parts: list[str] = []
    for entry in group(header + layout(method), encoding=True):
        if entry[0] == "struct":
            fixed = entry[1]
            fmt = "".join(item[1] for item in fixed)
            exprs = [item[2] for item in fixed]
            if all(is_literal(e) for e in exprs):
                parts.append(bytes_literal(struct.pack(">" + fmt, *(int(e) for e in exprs))))
            else:
                parts.append(f"{structs.get(fmt)}.pack({', '.join(exprs)})")
        elif entry[0] in ("shortstr", "longstr"):
            parts.append(f"v_{entry[1].py}")
        elif entry[0] == "table":
            parts.append(f"encode_table(self.{entry[1].py})")
    if len(parts) == 1:
        result = [f"return {parts[0]}"]
    else:
        result = ['return b"".join(('] + [f"    {p}," for p in parts] + ["))"]
    lines = ["def encode(self) -> bytes:"]
    if any("pack(" in p for p in parts):
        # struct.error for an out-of-range integer becomes ValueError, like the length checks
        lines.append("    try:")
        lines += ["        " + line for line in body + result]
        lines.append("    except StructError as exc:")
        lines.append(f'        raise ValueError(f"cannot encode {method.full_name}: {{exc}}") from None')
    else:
        lines += ["    " + line for line in body + result]
    return lines


def gen_decode(method: Method, structs: StructRegistry) -> list[str]:
    """A decoder reads from offset 4 (after class and method ids) and must end exactly at
    len(buf). Only the final length check is needed to catch overruns: offsets only grow, a
    read past the end raises struct.error or IndexError, and a string slice that runs past the
    end leaves the offset beyond len(buf)."""
    fn = f"_decode_{method.class_name}_{python_name(method.name)}"
    lines = [f"def {fn}(buf: ReadBuffer) -> {method.cls}:"]
    entries = group(layout(method))
    static = all(e[0] == "struct" for e in entries)
    off: int | None = 4  # known statically until the first variable-length item
    total = 4 + sum(struct.calcsize(">" + "".join(i[1] for i in e[1])) for e in entries if e[0] == "struct")
    if static:
        lines.append(f"    if len(buf) != {total}:")
        lines.append("        raise ValueError")
    lines.append(f"    obj = _new({method.cls})")
    bit_fields: list[tuple[str, list[Field]]] = []
    for entry in entries:
        if entry[0] == "struct":
            fixed = entry[1]
            fmt = "".join(item[1] if item[3] is not None else "x" * struct.calcsize(">" + item[1]) for item in fixed)
            size = struct.calcsize(">" + fmt)
            targets = [item[3] for item in fixed if item[3] is not None]
            for item in fixed:
                if item[4] is not None and item[3] is not None:
                    bit_fields.append((item[3], item[4]))
            where = str(off) if off is not None else "off"
            if not targets:
                pass  # only reserved padding: nothing to read, just advance
            elif fmt == "B":
                lines.append(f"    {targets[0]} = buf[{where}]")
            else:
                lhs = ", ".join(targets) + ("," if len(targets) == 1 else "")
                lines.append(f"    {lhs} = {structs.get(fmt)}.unpack_from(buf, {where})")
            if off is not None:
                off += size
            else:
                lines.append(f"    off += {size}")
        elif entry[0] in ("shortstr", "longstr"):
            f = entry[1]
            if off is not None:
                lines.append(f"    off = {off}")
                off = None
            if f.reserved:
                lines.append(f"    off += n_{f.py}")
                continue
            lines.append(f"    end = off + n_{f.py}")
            if entry[0] == "shortstr":
                lines.append(f'    obj.{f.py} = str(buf[off:end], "utf-8")')
            else:
                lines.append(f"    obj.{f.py} = bytes(buf[off:end])")
            lines.append("    off = end")
        elif entry[0] == "table":
            f = entry[1]
            where = str(off) if off is not None else "off"
            lines.append(f"    obj.{f.py}, off = decode_table(buf, {where})")
            off = None
    if not static:
        final = str(off) if off is not None else "off"
        lines.append(f"    if {final} != len(buf):")
        lines.append("        raise ValueError")
    for var, run in bit_fields:
        for k, b in enumerate(run):
            if not b.reserved:
                lines.append(f"    obj.{b.py} = ({var} & {1 << k}) != 0")
    lines.append("    return obj")
    return lines


def gen_class(method: Method, structs: StructRegistry) -> list[str]:
    args = method.args
    lines = [f"class {method.cls}(Method):"]
    lines.append(f'    """{method.full_name} ({method.class_id}, {method.method_id})"""')
    lines.append("")
    lines += assign_tuple("    ", "__slots__", [f'"{f.py}"' for f in args])
    lines.append(f"    CLASS_ID = {method.class_id}")
    lines.append(f"    METHOD_ID = {method.method_id}")
    lines.append(f"    INDEX = 0x{method.index:08X}")
    lines.append(f'    NAME = "{method.full_name}"')
    lines.append(f"    SYNCHRONOUS = {method.synchronous}")
    lines.append(f"    HAS_CONTENT = {method.content}")
    lines += assign_tuple("    ", "RESPONSES", [f'"{r}"' for r in method.responses])
    lines += assign_tuple("    ", "FIELDS", [f'("{f.py}", "{f.type}")' for f in args])
    lines.append("")
    if args:
        lines.append("    def __init__(")
        lines.append("        self,")
        lines.append("        *,")
        for f in args:
            lines.append(f"        {f.py}: {TYPE_HINTS[f.type]} = {DEFAULTS[f.type]},")
        lines.append("    ) -> None:")
        for f in args:
            if f.type == "table":
                # None default avoids a shared mutable dict; store a fresh one
                lines.append(f"        self.{f.py} = {{}} if {f.py} is None else {f.py}")
            else:
                lines.append(f"        self.{f.py} = {f.py}")
        lines.append("")
    lines.append("    def __eq__(self, other: object) -> bool:")
    lines.append("        if other.__class__ is not self.__class__:")
    lines.append("            return NotImplemented")
    if args:
        lines.append("        return (")
        for k, f in enumerate(args):
            lines.append(f"            {'and ' if k else ''}self.{f.py} == other.{f.py}")
        lines.append("        )")
    else:
        lines.append("        return True")
    lines.append("")
    # mutable and compared by value, so unhashable (the ignore: typeshed types __hash__ as a method)
    lines.append("    __hash__ = None  # type: ignore[assignment]")
    lines.append("")
    lines.append("    def __repr__(self) -> str:")
    if args:
        inner = ", ".join(f"{f.py}={{self.{f.py}!r}}" for f in args)
        lines.append(f'        return f"{method.cls}({inner})"')
    else:
        lines.append(f'        return "{method.cls}()"')
    lines.append("")
    lines += ["    " + line for line in gen_encode(method, structs)]
    return lines


def render(spec: Spec, spec_name: str) -> str:
    structs = StructRegistry()
    classes: list[str] = []
    decoders: list[str] = []
    for m in spec.methods:
        classes += gen_class(m, structs) + ["", ""]
        decoders += gen_decode(m, structs) + ["", ""]

    out = [
        f"# Generated by scripts/gen_amqp_spec.py from {spec_name}. Do not edit.",
        '"""AMQP 0-9-1 method catalogue with RabbitMQ extensions, generated from the spec XML.',
        "",
        "Every method is a class with its spec facts (ids, synchronous, responses, content) and a",
        "straight-line `encode()` producing the method frame payload. `decode_method(payload)` maps",
        "the first four bytes (class id << 16 | method id, read as one big-endian u32) to a",
        "specialised decoder that reads fields with precompiled structs at fixed offsets where it",
        "can. Any malformed payload raises DecodeError: unknown methods 540, everything else 502.",
        "Reserved fields (ticket, capabilities, insist, known-hosts, out-of-band, channel-id,",
        "cluster-id of get-empty) are not attributes: they are written as zeros and skipped on read.",
        "RabbitMQ errata applied by the generator: NO_ROUTE (312) added, basic.recover is",
        "synchronous with reply basic.recover-ok, the 14th basic property is cluster_id.",
        '"""',
        "",
        "from collections.abc import Callable",
        "from struct import Struct",
        "from struct import error as StructError",
        "from typing import ClassVar",
        "",
        "from .errors import DecodeError",
        "from .values import FieldTable, ReadBuffer, decode_table, encode_table",
        "",
        "_new = object.__new__",
        "",
    ]
    for name, value in spec.frame_constants:
        out.append(f"{python_name(name).upper()} = {value}")
    out.append("")
    for name, value, _ in spec.reply_codes:
        out.append(f"{python_name(name).upper()} = {value}")
    out.append("")
    out.append("# code -> RabbitMQ's name for it, as used in reply texts (\"NOT_FOUND - no queue 'q'\")")
    out.append("REPLY_NAMES: dict[int, str] = {")
    for name, _value, _ in spec.reply_codes:
        out.append(f'    {python_name(name).upper()}: "{python_name(name).upper()}",')
    out.append("}")
    for cls_name, label in (("soft-error", "SOFT_ERRORS"), ("hard-error", "HARD_ERRORS")):
        codes = ", ".join(python_name(n).upper() for n, _, c in spec.reply_codes if c == cls_name)
        out.append(f"# {cls_name}s close the {'channel' if cls_name == 'soft-error' else 'connection'}")
        out.append(f"{label}: frozenset[int] = frozenset(({codes}))")
    out.append("")
    out.append("# (python name, wire type, property flag bit) in wire order (spec 4.2.6.1)")
    out.append("BASIC_PROPERTIES: tuple[tuple[str, str, int], ...] = (")
    for k, f in enumerate(spec.basic_properties):
        out.append(f'    ("{f.py}", "{f.type}", 0x{1 << (15 - k):04X}),')
    out.append(")")
    out.append("")
    struct_pos = len(out)
    out += [
        "",
        "class Method:",
        '    """What every method class below has: its spec facts and `encode()`. The classes derive',
        "    from it so that code handling any method can say so (`Method`, `type[Method]`); it has",
        "    no slots and no state. Instances compare by value and are unhashable: `__hash__ = None`,",
        '    which needs a type: ignore[assignment] as typeshed declares __hash__ a method."""',
        "",
        "    __slots__ = ()",
        "    CLASS_ID: ClassVar[int]",
        "    METHOD_ID: ClassVar[int]",
        "    INDEX: ClassVar[int]  # CLASS_ID << 16 | METHOD_ID",
        '    NAME: ClassVar[str]  # e.g. "basic.publish"',
        "    SYNCHRONOUS: ClassVar[bool]",
        "    HAS_CONTENT: ClassVar[bool]",
        "    RESPONSES: ClassVar[tuple[str, ...]]  # names of the methods that answer it",
        "    FIELDS: ClassVar[tuple[tuple[str, str], ...]]  # (python name, wire type), reserved ones left out",
        "",
        "    def encode(self) -> bytes:",
        '        """The method frame payload: class id, method id, arguments."""',
        "        raise NotImplementedError",
        "",
        "",
    ]
    out += classes
    out += decoders
    out.append("METHODS_BY_INDEX: dict[int, type[Method]] = {")
    for m in spec.methods:
        out.append(f"    {m.cls}.INDEX: {m.cls},")
    out.append("}")
    out.append("METHODS_BY_NAME: dict[str, type[Method]] = {cls.NAME: cls for cls in METHODS_BY_INDEX.values()}")
    out.append("_DECODERS: dict[int, Callable[[ReadBuffer], Method]] = {")
    for m in spec.methods:
        out.append(f"    {m.cls}.INDEX: _decode_{m.class_name}_{python_name(m.name)},")
    out.append("}")
    out.append("")
    out.append('_S_INDEX = Struct(">I")')
    out.append("")
    out += [
        "",
        "def decode_method(payload: ReadBuffer) -> Method:",
        '    """Decode a method frame payload (bytes or memoryview) into a method instance."""',
        "    try:",
        "        (index,) = _S_INDEX.unpack_from(payload, 0)",
        "    except StructError:",
        '        raise DecodeError(SYNTAX_ERROR, "malformed method frame: shorter than 4 bytes") from None',
        "    decoder = _DECODERS.get(index)",
        "    if decoder is None:",
        "        raise DecodeError(",
        '            NOT_IMPLEMENTED, f"unknown method class {index >> 16} method {index & 0xFFFF}"',
        "        )",
        "    try:",
        "        return decoder(payload)",
        "    except (StructError, IndexError, ValueError):",
        "        # ValueError covers UnicodeDecodeError and the decoders' own length checks",
        "        name = METHODS_BY_INDEX[index].NAME",
        '        raise DecodeError(SYNTAX_ERROR, f"malformed method frame for {name}") from None',
        "    except DecodeError as exc:",
        "        name = METHODS_BY_INDEX[index].NAME",
        '        raise DecodeError(SYNTAX_ERROR, f"malformed method frame for {name}: {exc.reply_text}") from None',
        "",
    ]
    out[struct_pos:struct_pos] = structs.render() + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Content properties: amqp/properties.py. The basic class's <field>s are the properties of a
# content header, in flag-bit order: the first is bit 15, the next bit 14, and so on; bit 0
# says another flag word follows (spec 4.2.6.1). Each property becomes one straight-line
# branch of the encoder and of the decoder. The decoder tests the flags of a group of
# PROPERTY_GROUP_SIZE properties at once before testing them one by one, and sets an absent
# group to None with one chained assignment: a publish usually sets a few of the 14, so it
# pays one test per absent group rather than one per absent property.

PROPERTY_GROUP_SIZE = 4
PROPERTY_TYPE_HINTS = {
    "shortstr": "str",
    "table": "FieldTable",
    "octet": "int",
    "short": "int",
    "long": "int",
    "longlong": "int",
    "timestamp": "int",
}
# The server asks these of every publish (is it persistent?): each gets a `<name>_of(raw)`
# that skips the properties before it by their length prefixes instead of decoding them.
FAST_OCTET_ACCESSORS = ("delivery_mode",)


def property_flag(k: int) -> int:
    return 1 << (15 - k)


def unused_bits(props: list[Field]) -> str:
    """The flag bits between the last property and the continuation bit, as a phrase."""
    low = 15 - len(props)
    return "bit 1 has" if low == 1 else f"bits {low} to 1 have"


def gen_property_encode(props: list[Field], structs: StructRegistry) -> list[str]:
    lines = [
        "def encode_properties(props: BasicProperties) -> bytes:",
        '    """The property list (flag word + present values) of a content header."""',
        "    flags = 0",
        '    parts: list[bytes] = [b""]  # the flag word, once known',
        "    try:",
    ]
    for k, f in enumerate(props):
        # an absent property costs one attribute test: most are absent
        lines.append(f"        if props.{f.py} is not None:")
        lines.append(f"            flags |= 0x{property_flag(k):04X}")
        if f.type == "shortstr":
            lines.append(f"            v = props.{f.py}.encode()")
            lines.append("            if len(v) > 255:")
            lines.append(f'                raise ValueError(f"{f.py} is {{len(v)}} bytes, the shortstr limit is 255")')
            lines.append("            parts.append(_OCTETS[len(v)])")
            lines.append("            parts.append(v)")
        elif f.type == "table":
            lines.append(f"            parts.append(encode_table(props.{f.py}))")
        else:
            lines.append(f"            parts.append({structs.get(FIXED_CODES[f.type])}.pack(props.{f.py}))")
    lines += [
        "    except StructError as exc:",
        '        raise ValueError(f"cannot encode basic properties: {exc}") from None',
        f"    # {len(props)} properties fit one flag word, so the continuation bit is never set",
        f"    parts[0] = {structs.get('H')}.pack(flags)",
        '    return b"".join(parts)',
    ]
    return lines


def gen_property_decode_one(k: int, f: Field, structs: StructRegistry, indent: str) -> list[str]:
    lines = [f"{indent}if flags & 0x{property_flag(k):04X}:"]
    inner = indent + "    "
    if f.type == "shortstr":
        lines.append(f"{inner}end = off + 1 + raw[off]")
        lines.append(f"{inner}p.{f.py} = raw[off + 1 : end].decode()")
        lines.append(f"{inner}off = end")
    elif f.type == "table":
        lines.append(f"{inner}p.{f.py}, off = decode_table(raw, off)")
    elif f.type == "octet":
        lines.append(f"{inner}p.{f.py} = raw[off]")
        lines.append(f"{inner}off += 1")
    else:
        code = FIXED_CODES[f.type]
        lines.append(f"{inner}(p.{f.py},) = {structs.get(code)}.unpack_from(raw, off)")
        lines.append(f"{inner}off += {struct.calcsize('>' + code)}")
    lines.append(f"{indent}else:")
    lines.append(f"{inner}p.{f.py} = None")
    return lines


def gen_property_decode(props: list[Field], structs: StructRegistry) -> list[str]:
    lines = [
        "def decode_properties(raw: ReadBuffer) -> BasicProperties:",
        '    """Parse a property list (bytes or memoryview starting at the flag word)."""',
        "    try:",
        "        if raw.__class__ is not bytes:",
        "            raw = bytes(raw)  # bytes.decode() is the cheapest UTF-8 read; a memoryview has none",
        "        flags = raw[0] << 8 | raw[1]",
        "        off = _after_flag_words(raw, strict=True) if flags & 1 else 2",
        f"        # {unused_bits(props)} no property; RabbitMQ ignores {'it' if len(props) == 14 else 'them'}, and so do we",
        "        p = _new(BasicProperties)",
    ]
    for start in range(0, len(props), PROPERTY_GROUP_SIZE):
        group_props = props[start : start + PROPERTY_GROUP_SIZE]
        mask = sum(property_flag(k) for k in range(start, start + len(group_props)))
        lines.append(f"        if flags & 0x{mask:04X}:")
        for k, f in enumerate(group_props, start):
            lines += gen_property_decode_one(k, f, structs, "            ")
        lines.append("        else:")
        lines.append("            " + " = ".join(f"p.{f.py}" for f in group_props) + " = None")
    lines += [
        "        # a string slice that ran past the end leaves off beyond len(raw)",
        "        if off != len(raw):",
        '            raise ValueError("property list length mismatch")',
        "        return p",
        "    except (StructError, IndexError, ValueError):",
        "        # ValueError covers UnicodeDecodeError and the length check",
        '        raise DecodeError(SYNTAX_ERROR, "malformed content header properties") from None',
        "    except DecodeError as exc:",
        '        raise DecodeError(SYNTAX_ERROR, f"malformed content header properties: {exc.reply_text}") from None',
    ]
    return lines


def gen_fast_accessor(props: list[Field], name: str, structs: StructRegistry) -> list[str]:
    k = next(i for i, f in enumerate(props) if f.py == name)
    assert props[k].type == "octet", "a fast accessor reads one octet"
    flag = property_flag(k)
    lines = [
        f"def {name}_of(raw: ReadBuffer) -> int:",
        f'    """{name} of an encoded property list (0 if absent), without decoding the rest: the',
        f'    at most {k} properties before it are skipped by their lengths."""',
        "    if len(raw) < 2:",
        "        return 0",
        "    flags = raw[0] << 8 | raw[1]",
        f"    if not flags & 0x{flag:04X}:",
        "        return 0",
        "    try:",
        "        off = _after_flag_words(raw, strict=False) if flags & 1 else 2",
    ]
    for j, f in enumerate(props[:k]):
        lines.append(f"        if flags & 0x{property_flag(j):04X}:")
        if f.type == "shortstr":
            lines.append("            off += 1 + raw[off]")
        elif f.type == "table":  # a u32 length, then the table
            lines.append(f"            off += 4 + {structs.get('I')}.unpack_from(raw, off)[0]")
        elif f.type == "octet":
            lines.append("            off += 1")
        else:
            lines.append(f"            off += {struct.calcsize('>' + FIXED_CODES[f.type])}")
    lines += [
        "        return raw[off]",
        "    except (StructError, IndexError):",
        '        raise DecodeError(SYNTAX_ERROR, "malformed content header properties") from None',
    ]
    return lines


def gen_properties_class(props: list[Field]) -> list[str]:
    lines = [
        "class BasicProperties:",
        f'    """The {len(props)} basic-class content properties; each is None when absent."""',
        "",
        "    __slots__ = (",
    ]
    lines += [f'        "{f.py}",' for f in props]
    lines += ["    )", "", "    def __init__(", "        self,", "        *,"]
    for f in props:
        note = "  # noqa: A002 - the spec's name for the property" if hasattr(builtins, f.py) else ""
        lines.append(f"        {f.py}: {PROPERTY_TYPE_HINTS[f.type]} | None = None,{note}")
    lines.append("    ) -> None:")
    lines += [f"        self.{f.py} = {f.py}" for f in props]
    lines += [
        "",
        "    def __eq__(self, other: object) -> bool:",
        "        if other.__class__ is not self.__class__:",
        "            return NotImplemented",
        "        return (",
    ]
    for k, f in enumerate(props):
        lines.append(f"            {'and ' if k else ''}self.{f.py} == other.{f.py}")
    lines += [
        "        )",
        "",
        "    # compared by value, so unhashable (the ignore: typeshed declares __hash__ a method)",
        "    __hash__ = None  # type: ignore[assignment]",
        "",
        "    def __repr__(self) -> str:",
        '        present = ", ".join(',
        '            f"{name}={getattr(self, name)!r}" for name in self.__slots__ if getattr(self, name) is not None',
        "        )",
        '        return f"BasicProperties({present})"',
    ]
    return lines


def render_properties(spec: Spec, spec_name: str) -> str:
    props = spec.basic_properties
    assert len(props) <= 15, "the codec writes one flag word: bit 0 is the continuation bit"
    for f in props:
        assert f.type in PROPERTY_TYPE_HINTS, f"no property codec for wire type {f.type}"
    structs = StructRegistry()
    body = gen_properties_class(props) + ["", ""]
    body += gen_property_encode(props, structs) + ["", ""]
    body += gen_property_decode(props, structs) + ["", ""]
    for name in FAST_OCTET_ACCESSORS:
        body += gen_fast_accessor(props, name, structs) + ["", ""]
    header_struct = structs.get("HHQ")
    out = [
        f"# Generated by scripts/gen_amqp_spec.py from {spec_name}. Do not edit.",
        '"""Basic content properties and the content header frame payload, generated from the spec XML.',
        "",
        "Theory of operation: a content header payload is class-id u16, weight u16 (always 0),",
        "body-size u64, then the property list: 16-bit flag words, most significant bit first, one",
        'bit per property in spec order, bit 0 meaning "another flag word follows" (spec 4.2.6.1),',
        "followed by the values of the present properties only. The broker normally keeps the",
        "property list as opaque bytes (`props_raw`) and relays it untouched, so headers are parsed",
        "only when something needs them; `decode_properties` / `encode_properties` do the parse.",
        'None means "absent": an empty string or table is a present, empty property.',
        "The generator writes both directions out property by property, in flag-bit order, from the",
        "basic class's fields, rather than looping over a descriptor table, because this sits on",
        "the publish/deliver hot path; the decoder first tests the flags of a group of properties,",
        "so an absent group costs one test. Headers are field tables with RabbitMQ's errata",
        '(values.py); the 14th property, "reserved" in the XML, is cluster_id as in RabbitMQ.',
        '"""',
        "",
        "from struct import Struct",
        "from struct import error as StructError",
        "",
        "from .errors import DecodeError",
        "from .spec import SYNTAX_ERROR",
        "from .values import FieldTable, ReadBuffer, decode_table, encode_table",
        "",
        "# property flag bits (spec 4.2.6.1): the first property is bit 15",
    ]
    out += [f"{f.py.upper()}_FLAG = 0x{property_flag(k):04X}" for k, f in enumerate(props)]
    out.append("")
    struct_pos = len(out)
    out += [
        "_OCTETS = tuple(bytes((n,)) for n in range(256))  # a shortstr's length prefix, without a pack",
        "_new = object.__new__",
        "",
        "",
    ]
    out += body
    out += [
        "def _after_flag_words(raw: ReadBuffer, strict: bool) -> int:",
        '    """The offset after the continuation flag words (spec 4.2.6.1), which are rare. They can',
        f"    only carry bits of properties beyond the {len(props)} that basic defines: the decoder (strict)",
        '    accepts them when empty so the stream stays in sync, and refuses them otherwise."""',
        "    off = 2",
        "    while True:  # bounded by the buffer: a read past its end raises IndexError",
        "        more = raw[off] << 8 | raw[off + 1]",
        "        off += 2",
        "        if strict and more & 0xFFFE:",
        '            raise DecodeError(SYNTAX_ERROR, "unknown basic property flags set")',
        "        if not more & 1:",
        "            return off",
        "",
        "",
        "def encode_content_header(class_id: int, body_size: int, props_raw: bytes) -> bytes:",
        '    """Content header frame payload: class id, weight 0, body size, property list."""',
        f"    return {header_struct}.pack(class_id, 0, body_size) + props_raw",
        "",
        "",
        "def decode_content_header(payload: ReadBuffer) -> tuple[int, int, bytes]:",
        '    """Split a content header payload into (class id, body size, raw property list).',
        '    The weight field is ignored (spec: must be zero, unused)."""',
        "    if len(payload) < 14:",
        '        raise DecodeError(SYNTAX_ERROR, "content header frame shorter than 14 bytes")',
        f"    class_id, _weight, body_size = {header_struct}.unpack_from(payload, 0)",
        "    return class_id, body_size, bytes(payload[12:])",
        "",
    ]
    out[struct_pos:struct_pos] = structs.render()
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--properties-output", type=Path, default=DEFAULT_PROPERTIES_OUTPUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if an output is stale")
    args = parser.parse_args(argv)
    spec = parse_spec(args.spec)
    outputs = (
        (args.output, render(spec, args.spec.name)),
        (args.properties_output, render_properties(spec, args.spec.name)),
    )
    if args.check:
        stale = 0
        for path, text in outputs:
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                print(f"{path} is out of date; run scripts/gen_amqp_spec.py", file=sys.stderr)
                stale = 1
        return stale
    for path, text in outputs:
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
