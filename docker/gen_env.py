#!/usr/bin/env python3
"""Write docker/.env from docker/.env.example, every empty value filled with a fresh secret.

    python docker/gen_env.py            # refuses to overwrite an existing docker/.env
    python docker/gen_env.py --print    # to stdout instead (e.g. into a secret manager)

The file is created readable by its owner only. Values already set in the example (user
names, settings) are kept as they are.
"""
from __future__ import annotations

import os
import re
import secrets
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^(?P<key>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")
SECRET_BYTES = 24  # 48 hex characters: URL-safe, shell-safe


def fill(example: str) -> str:
    out = []
    for line in example.splitlines():
        match = LINE.match(line)
        if match and not match["value"]:
            line = f"{match['key']}={secrets.token_hex(SECRET_BYTES)}"
        out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = fill((HERE / ".env.example").read_text())
    if argv == ["--print"]:
        sys.stdout.write(text)
        return 0
    if argv:
        print("usage: gen_env.py [--print]", file=sys.stderr)
        return 2
    target = HERE / ".env"
    if target.exists():
        print(f"{target} exists; delete it first to rotate every secret", file=sys.stderr)
        return 1
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
