"""Events leaving and entering the store as files: the history file format
(`history_file`), export (`exports`), import and copy between stores (`imports`), and
archiving runs to verified files and restoring them (`archive`, `archive_file`,
`restore`).

May import `core`, `stores`, `projections`, `reads` and `commands`.
"""
