-- postgres schema version 12: the Merkle tree. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS lg_merkle_leaves (
            leaf_index BIGINT PRIMARY KEY,
            position BIGINT NOT NULL UNIQUE,
            data BYTEA NOT NULL,
            gone SMALLINT NOT NULL DEFAULT 0
        );

CREATE TABLE IF NOT EXISTS lg_merkle_nodes (
            node BIGINT PRIMARY KEY,
            hash BYTEA NOT NULL
        );
