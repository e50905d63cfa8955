#!/usr/bin/env python3
"""Write the HTTP API's OpenAPI document to docs/openapi.json (a test checks it is current).

python scripts/export_openapi.py            # rewrite docs/openapi.json
python scripts/export_openapi.py --check    # exit 1 if docs/openapi.json is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ledger.http.app import openapi_text

DEFAULT_OUTPUT = ROOT / "docs" / "openapi.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="where to write (default: %(default)s)"
    )
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 when the file differs"
    )
    args = parser.parse_args(argv)
    text = openapi_text()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python scripts/export_openapi.py", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
