"""Checkpoints of tables (DESIGN D8). Sharded: saving and loading tables (tables), the shard
file format (format), the manifest that makes a checkpoint exist (manifest), the load's read
plan (load), saves and restores that rank 0 runs alone (join), checksums (checksum) and the
files' storage (storage). SOK v2's own files: their layout (sok_format), writing and reading
them (sok_write, sok_read) and the marker that makes such a dump exist (sok_marker). The names
below are the ones the rest of sok1x calls."""
from sok1x.engine.checkpoint.tables import (  # noqa: F401  (the package's door)
    CHUNK_ENV, DEFAULT_CHUNK_MB, MANIFEST_NAME, MOST_SAVER_SHARDS, chunk_bytes, dump_tables,
    file_name, incremental_tables, load_shards, load_tables, ready_tables, save_shards,
    saver_shard_name, shard_file_name,
)
