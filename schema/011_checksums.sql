-- Migration 11: a checksum per stored block chunk and rollup row
-- (schema/storage.md, "Checksums"; daemon/integrity.h). `crc` is the
-- CRC32C of the row's key, its other fields and its blob, as a signed
-- 32-bit integer; rows written before this migration keep NULL and are
-- read unchecked, as before. ADD COLUMN only changes the schema: no row
-- is rewritten, so opening a database of a million steps stays instant.
ALTER TABLE block_chunks ADD COLUMN crc INTEGER;
ALTER TABLE rollups ADD COLUMN crc INTEGER;
ALTER TABLE rollup_totals ADD COLUMN crc INTEGER;
-- the raw frames of open blocks (a block's at most 64 steps a metric)
ALTER TABLE frames ADD COLUMN crc INTEGER;
