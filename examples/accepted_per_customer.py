"""Accepted items per customer: a projection of your own, in your own table, kept by a follower.

python examples/accepted_per_customer.py run       # follow until Ctrl-C (or kill it)
python examples/accepted_per_customer.py rebuild   # clear the table and replay the feed
python examples/accepted_per_customer.py show
"""

import contextlib
import signal
import sys

from ledger import Follower, Ledger

TABLE = "CREATE TABLE IF NOT EXISTS accepted_per_customer (customer TEXT PRIMARY KEY, n INTEGER)"


def project(transitions, tx):  # in-database: runs in the transaction that moves the checkpoint
    for t in transitions:  # t.payload: the item's payload as it stood at this transition
        customer = (t.payload or {}).get("customer", "?")
        tx.execute(
            "INSERT INTO accepted_per_customer (customer, n) VALUES (?, 1) "
            "ON CONFLICT (customer) DO UPDATE SET n = accepted_per_customer.n + 1",
            (customer,),
        )


with Ledger.open() as lg:  # LEDGER_DSN, else ./ledger.db
    with lg.store.write() as tx:
        tx.execute(TABLE)
    follower = Follower(lg, "accepted-per-customer", project, kinds=["accept"], payloads=True)
    if sys.argv[1:] == ["rebuild"]:
        print(
            "replayed", follower.rebuild(lambda tx: tx.execute("DELETE FROM accepted_per_customer"))
        )
    elif sys.argv[1:] == ["show"]:
        with lg.store.read() as tx:
            for row in tx.fetchall(
                "SELECT customer, n FROM accepted_per_customer ORDER BY customer"
            ):
                print(row["customer"], row["n"])
    else:
        signal.signal(signal.SIGTERM, lambda *_: follower.stop())  # `kill`: stop after the batch
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C
            follower.run()
