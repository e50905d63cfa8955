-- sqlite schema version 12: the Merkle tree. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS lg_merkle_leaves (
            leaf_index INTEGER PRIMARY KEY,
            position INTEGER NOT NULL UNIQUE,
            data BLOB NOT NULL,
            gone INTEGER NOT NULL DEFAULT 0
        );

CREATE TABLE IF NOT EXISTS lg_merkle_nodes (
            node INTEGER PRIMARY KEY,
            hash BLOB NOT NULL
        );
