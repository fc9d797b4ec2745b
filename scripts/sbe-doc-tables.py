#!/usr/bin/env python3
"""Prints Markdown tables (messages with byte offsets, enums, sets) for an SBE schema.

Used to write the message reference sections of docs/protocol-*.md, so that the offsets in
the documents are computed from the schema rather than by hand:

    python3 scripts/sbe-doc-tables.py schemas/bourse-order-entry.xml
"""
import sys
import xml.etree.ElementTree as ET

SIZES = {"char": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4,
         "uint32": 4, "int64": 8, "uint64": 8, "float": 4, "double": 8}
NULLS = {"int8": "-128", "uint8": "255", "int16": "-32768", "uint16": "65535",
         "int32": "-2^31", "uint32": "2^32-1", "int64": "-2^63", "uint64": "2^64-1"}


def local(tag):
    return tag.split("}")[-1]


def main(path):
    root = ET.parse(path).getroot()
    types, enums, sets = {}, {}, {}
    for t in root.iter():
        kind = local(t.tag)
        if kind == "type" and t.get("primitiveType") and t.get("name"):
            types.setdefault(t.get("name"), t)
        elif kind == "enum":
            enums[t.get("name")] = t
        elif kind == "set":
            sets[t.get("name")] = t

    def describe(type_name, presence=None):
        if type_name in SIZES:
            return SIZES[type_name], type_name
        if type_name in enums:
            e = enums[type_name]
            opt = ", optional: null " + NULLS[e.get("encodingType")] if presence == "optional" else ""
            return SIZES[e.get("encodingType")], f"{e.get('encodingType')} enum {type_name}{opt}"
        if type_name in sets:
            s = sets[type_name]
            return SIZES[s.get("encodingType")], f"{s.get('encodingType')} set {type_name}"
        t = types[type_name]
        prim = t.get("primitiveType")
        length = int(t.get("length", "1"))
        size = SIZES[prim] * length
        text = f"{prim}[{length}]" if length > 1 else prim
        extra = []
        if t.get("presence") == "optional":
            extra.append(f"optional: null {NULLS[prim]}")
        if t.get("minValue") or t.get("maxValue"):
            extra.append(f"range {t.get('minValue', '')}..={t.get('maxValue', '')}")
        if extra:
            text += " (" + ", ".join(extra) + ")"
        return size, text

    def field_rows(parent, start):
        rows, offset = [], start
        for f in parent:
            if local(f.tag) != "field":
                continue
            size, text = describe(f.get("type"), f.get("presence"))
            desc = f.get("description") or ""
            rows.append(f"| {offset} | {size} | `{f.get('name')}` | {text} | {desc} |")
            offset += size
        return rows, offset

    header = "| offset | size | field | type | notes |\n|---:|---:|---|---|---|"
    for m in root:
        if local(m.tag) != "message":
            continue
        rows, block = field_rows(m, 0)
        desc = m.get("description")
        print(f"#### {m.get('name')} (templateId {m.get('id')}, blockLength {block})\n")
        if desc:
            print(desc + ".\n")
        if rows:
            print(header)
            print("\n".join(rows))
        else:
            print("The root block is empty (blockLength 0).")
        print()
        for g in m:
            if local(g.tag) != "group":
                continue
            grows, gblock = field_rows(g, 0)
            print(f"Repeating group `{g.get('name')}` follows the root block: a 3-byte group header "
                  f"(u16 blockLength = {gblock}, u8 numInGroup), then numInGroup entries of "
                  f"blockLength bytes each. Offsets are from the start of an entry.\n")
            print(header)
            print("\n".join(grows))
            print()

    print("#### Enums\n")
    for name, e in enums.items():
        values = ", ".join(f"{v.get('name')} = {v.text.strip()}" for v in e)
        print(f"- **{name}** ({e.get('encodingType')}): {values}. Any other value: unknown; "
              f"the decoder reports it as NullVal.")
    for name, s in sets.items():
        bits = ", ".join(f"bit {c.text.strip()} = {c.get('name')}" for c in s)
        print(f"- **{name}** ({s.get('encodingType')} bit set): {bits}.")
    print()


if __name__ == "__main__":
    main(sys.argv[1])
