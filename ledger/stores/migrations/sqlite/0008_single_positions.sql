-- sqlite schema version 8: single positions. Released: never edit; add a new version.

SELECT 1;
