"""Hostile grammars from issue 35, shared by the checker, pool and server tests."""

from __future__ import annotations

import json


def chained_defs(links: int) -> str:
    """A schema whose `$defs` each nest the next: 1000 links (75 KB) crash llguidance 1.9."""
    defs = {
        f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


def lark_chain(rules: int) -> str:
    rows = [f'r{i}: "a" r{i + 1}' for i in range(rules)]
    return "\n".join(["start: r0", *rows, f'r{rules}: "b"'])


def gbnf_chain(rules: int) -> str:
    rows = [f'r{i} ::= "a" r{i + 1}' for i in range(rules)]
    return "\n".join(["root ::= r0", *rows, f'r{rules} ::= "b"'])
