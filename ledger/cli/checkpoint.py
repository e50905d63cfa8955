"""`ledger checkpoint ...`: signed checkpoints of the ledger's Merkle tree and proofs against
them (ledger/service/checkpoints.py; key and note formats in ledger/core/note.py).

    ledger checkpoint keygen NAME --out DIR       DIR/NAME.key (mode 0600), DIR/NAME.vkey
    ledger checkpoint sign --key FILE [--out FILE] [--origin TEXT]
    ledger checkpoint sign --key FILE --every 60s --to DIR|URL [--count N]   ship on a schedule
    ledger checkpoint prove --index I --size N    an inclusion proof (JSON)
    ledger checkpoint prove --from N1 --to N2     a consistency proof (JSON)
    ledger checkpoint prove --run RUN [--size N | --checkpoint FILE]   a run's events, proved
    ledger checkpoint check-proof PROOF --checkpoint FILE... --vkey FILE...   offline

The private key comes from `--key` or `$LEDGER_CHECKPOINT_KEY` (the key's text) and is
never written to the database. `ledger verify --checkpoint FILE --vkey FILE` checks the
ledger against signed checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ledger.cli.app import _emit_json, _ledger, app

checkpoint_app = typer.Typer(
    cls=TyperGroup,
    no_args_is_help=True,
    help="Signed checkpoints of the ledger's Merkle tree, and proofs against them.",
)
app.add_typer(checkpoint_app, name="checkpoint")

KEY_ENV = "LEDGER_CHECKPOINT_KEY"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(f"cannot read the {what} {path}: {e.strerror}") from None


@checkpoint_app.command("keygen")
def keygen(
    name: Annotated[str, typer.Argument(help="The key's name (no '+' or spaces), e.g. a host")],
    out: Annotated[Path, typer.Option("--out", help="Directory for NAME.key and NAME.vkey")],
) -> None:
    """Make an Ed25519 signing key: NAME.key (private, mode 0600) and NAME.vkey (to share)."""
    from ledger.core.note import NoteError, Signer

    try:
        signer = Signer.generate(name)
    except NoteError as e:
        raise _fail(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    key_path, vkey_path = out / f"{name}.key", out / f"{name}.vkey"
    if key_path.exists():
        raise _fail(f"{key_path} exists; a key is never overwritten")
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(signer.text() + "\n")
    vkey_path.write_text(signer.verifier().text() + "\n", encoding="utf-8")
    typer.echo(f"private key  {key_path} (keep it off the ledger's machine)")
    typer.echo(f"verifier key {vkey_path}: {signer.verifier().text()}")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise _fail(f"--every takes a duration such as 60s, 5m or 1h, not {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2) or "s"]


@checkpoint_app.command("sign")
def sign(
    ctx: typer.Context,
    key: Annotated[
        Path | None,
        typer.Option("--key", help=f"The private key file (else ${KEY_ENV} holds the key)"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the checkpoint here")] = None,
    origin: Annotated[
        str | None,
        typer.Option("--origin", help="The log's name in the checkpoint (default run-ledger/<id>)"),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option("--every", help="Sign and ship on a schedule (60s, 5m, 1h) until stopped"),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="--every: a directory (one file each, and latest) or a URL to POST to"
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="--every: stop after this many ticks")
    ] = None,
) -> None:
    """Sign a checkpoint of the tree over the readable events (its size and root hash);
    with --every, sign and ship one every interval to --to (skipped when the tree did not
    grow) until SIGINT or SIGTERM."""
    from ledger.core.note import Signer
    from ledger.service.checkpoints import sign as sign_tree

    if key is not None:
        text = _read(key, "key file")
    elif os.environ.get(KEY_ENV):
        text = os.environ[KEY_ENV]
    else:
        raise _fail(f"give --key FILE or set ${KEY_ENV}")
    if every is None:
        if to is not None or count is not None:
            raise _fail("--to and --count go with --every")
        with _ledger(ctx) as lg:
            note = sign_tree(lg, text, origin)
        if out is None:
            typer.echo(note, nl=False)
        else:
            out.write_text(note, encoding="utf-8")
            typer.echo(f"checkpoint {out}: {note.splitlines()[1]} events", err=True)
        return
    if to is None or out is not None:
        raise _fail("--every ships to --to DIR|URL (not --out)")
    _ship(ctx, Signer.parse(text), to, origin, _seconds(every), count)


def _ship(
    ctx: typer.Context, signer: Any, to: str, origin: str | None, every_s: float, count: int | None
) -> None:
    from ledger.feed.shipping import Shipper, Tick, ship_every

    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    def said(t: Tick) -> None:
        if t.error is not None:
            typer.echo(f"not shipped ({t.error}); trying again next tick", err=True)
        elif t.shipped:
            typer.echo(f"checkpoint of {t.size} events -> {t.where}", err=True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _ledger(ctx) as lg:
            ship_every(Shipper(lg, signer, to, origin), every_s, stop, count, said)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@checkpoint_app.command("prove")
def prove(
    ctx: typer.Context,
    index: Annotated[int | None, typer.Option("--index", help="Inclusion: the leaf")] = None,
    size: Annotated[
        int | None, typer.Option("--size", help="Inclusion or --run: the tree size")
    ] = None,
    first: Annotated[int | None, typer.Option("--from", help="Consistency: the older size")] = None,
    second: Annotated[int | None, typer.Option("--to", help="Consistency: the newer size")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Every event of this run, each with its proof")
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="--run: prove against this checkpoint's size"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document")] = True,
) -> None:
    """An inclusion proof (--index, --size), a consistency proof (--from, --to), or a run's
    events with their inclusion proofs (--run, against --size or --checkpoint, default the
    tree now), as JSON; `check-proof` checks any of them offline."""
    from ledger.core.note import Checkpoint, NoteError
    from ledger.service.checkpoints import consistency, inclusion, run_proof

    inc = index is not None
    con = first is not None or second is not None
    if [inc, con, run is not None].count(True) != 1:
        raise _fail("give --index and --size, --from and --to, or --run")
    if checkpoint is not None:
        if run is None:
            raise _fail("--checkpoint goes with --run")
        if size is not None:
            raise _fail("give --size or --checkpoint, not both")
        text = _read(checkpoint, "checkpoint")
        try:
            size = Checkpoint.parse(text.split("\n\n")[0] + "\n").size
        except (ValueError, NoteError) as e:
            raise _fail(f"{checkpoint} is not a checkpoint: {e}") from None
    with _ledger(ctx) as lg:
        if run is not None:
            proof = run_proof(lg, run, size)
        elif inc:
            if index is None or size is None:
                raise _fail("an inclusion proof needs --index and --size")
            proof = inclusion(lg, index, size)
        else:
            if first is None or second is None:
                raise _fail("a consistency proof needs --from and --to")
            proof = consistency(lg, first, second)
    _emit_json(proof)


@checkpoint_app.command("check-proof")
def check_proof(
    proof: Annotated[Path, typer.Argument(help="The proof's JSON file (from prove)")],
    checkpoint: Annotated[
        list[Path], typer.Option("--checkpoint", help="A signed checkpoint file (repeatable)")
    ],
    vkey: Annotated[list[Path], typer.Option("--vkey", help="A verifier key file (repeatable)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document")] = False,
) -> None:
    """Offline: check a proof against signed checkpoints (exit 1 when it does not hold)."""
    from ledger.service.checkpoints import check_proof as check

    result = check(
        _read(proof, "proof"),
        [_read(p, "checkpoint") for p in checkpoint],
        [_read(p, "verifier key").strip() for p in vkey],
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(("ok " if result["ok"] else "FAILED ") + result["detail"])
    if not result["ok"]:
        raise typer.Exit(1)


def read_checkpoint_args(
    checkpoints: list[Path] | None, vkeys: list[Path] | None
) -> tuple[list[str] | None, list[str] | None]:
    """`ledger verify --checkpoint FILE... --vkey FILE...`: the files' texts."""
    if not checkpoints:
        if vkeys:
            raise _fail("--vkey goes with --checkpoint")
        return None, None
    if not vkeys:
        raise _fail("--checkpoint needs --vkey: the key the checkpoints must be signed by")
    return [_read(p, "checkpoint") for p in checkpoints], [
        _read(p, "verifier key").strip() for p in vkeys
    ]
