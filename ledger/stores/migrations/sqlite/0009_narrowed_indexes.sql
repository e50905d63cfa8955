-- sqlite schema version 9: narrowed indexes. Released: never edit; add a new version.

SELECT 1;
