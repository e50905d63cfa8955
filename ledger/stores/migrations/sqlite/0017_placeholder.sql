-- PLACEHOLDER, drop at merge: stands for schema version 17, added on another branch.
SELECT 1;
