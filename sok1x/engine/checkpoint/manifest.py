"""The manifest of a sharded checkpoint (DESIGN D8): what makes a checkpoint exist.

    {"format": "sok1x-checkpoint", "version": 2, "world_size": 2,
     "tables": {"<table>": {"dim": 8, "dtype": "float32", "slots": [["Adam/m", 0.0], ...],
                            "placement": ["mod", 0], "use_hashtable": false,
                            "shards": [{"rank": 0, "file": "<name>", "path": "/where/<name>",
                                        "rows": 5, "size": 1234, "crc32": 5678}, ...]}}}

One manifest holds a set of tables (every table of one dump or one Saver save): it is written
after every rank wrote its shards, so the set loads whole or not at all. Shard files are named
relative to the manifest's folder, so a checkpoint folder can be moved or copied; "path" is
where the file was written, for ranks that saved into folders of their own.
"""
import json

from sok1x.engine.checkpoint import format as checkpoint_format
from sok1x.errors import CheckpointError

FORMAT = "sok1x-checkpoint"


def table_entry(table, slots, shards):
    """The manifest entry of `table` (an EmbeddingTable): slots [(name, initial)] as written;
    shards: one dict (rank, file, rows, size, crc32) per rank."""
    return {"dim": table.dim, "dtype": checkpoint_format.DTYPE,
            "slots": [[name, float(initial)] for name, initial in slots],
            "placement": [table.placement.kind, table.placement.rank],
            "use_hashtable": bool(table.use_hashtable),
            "shards": sorted(shards, key=lambda shard: shard["rank"])}


def make(world_size, entries):
    """The manifest (dict) of tables `entries` ({name: table_entry}) saved on `world_size` ranks."""
    return {"format": FORMAT, "version": checkpoint_format.VERSION,
            "world_size": int(world_size), "tables": entries}


def encode(manifest):
    """The manifest's bytes (UTF-8 JSON, keys sorted: the same bytes on every rank)."""
    return json.dumps(manifest, sort_keys=True).encode("utf-8")


def decode(data, where):
    """Returns the manifest in `data` (bytes); raises CheckpointError naming `where` if it is
    not a whole sok1x manifest of this version."""
    try:
        manifest = json.loads(bytes(data).decode("utf-8"))
        ok = manifest.get("format") == FORMAT
        tables = manifest["tables"]
        for entry in tables.values():
            for shard in entry["shards"]:
                int(shard["rank"]), str(shard["file"]), int(shard["size"])
                int(shard["crc32"]), int(shard["rows"])
            int(entry["dim"]), list(entry["slots"]), entry["placement"]
        int(manifest["world_size"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError("%s is not a sok1x checkpoint manifest (%s: %s): the file is "
                              "corrupt or not a checkpoint" % (where, type(exc).__name__, exc)
                              ) from None
    if not ok:
        raise CheckpointError("%s is not a sok1x checkpoint manifest" % where)
    if manifest.get("version") != checkpoint_format.VERSION:
        raise CheckpointError("%s has format version %r; this sok1x reads version %d"
                              % (where, manifest.get("version"), checkpoint_format.VERSION))
    return manifest


def entry_of(manifest, table_name, where):
    """Returns table `table_name`'s entry; raises CheckpointError if the manifest lacks it."""
    entry = manifest["tables"].get(table_name)
    if entry is None:
        raise CheckpointError("%s holds no table %r (it holds %s): restore the tables it was "
                              "saved with" % (where, table_name, sorted(manifest["tables"])))
    return entry


def merged(manifests):
    """One manifest holding the tables of every manifest in the list (the Saver keeps one per
    table)."""
    tables = {}
    for manifest in manifests:
        tables.update(manifest["tables"])
    world_size = manifests[0]["world_size"] if manifests else 0
    return make(world_size, tables)
