"""The domain, with no I/O: the states and the rule tables, the `Run` and `Item`
aggregates and their events, the typed errors, the public value types (views), the
manifest, the input checks, redaction, and the conversion of aggregates to and from
their row form.

Imports nothing from the rest of `ledger`; every other room may import it.
"""
