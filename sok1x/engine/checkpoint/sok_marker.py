"""The marker of sok1x's dumps in SOK's file format (DESIGN D8): what makes such a dump exist
whole, though SOK's readers open fixed names that a new dump must replace one file at a time.

`<folder>/sok1x-sok-files.json` (MARKER_NAME):
    {"format": "sok1x-sok-files", "version": 1,
     "tables": {"<stem>": {"whole": true,
                           "files": {"<stem>-key": {"file": "<name holding it>",
                                                    "size": n, "crc32": c or null}, ...}}}}

A dump writes each file under a temporary name ('<name>.sok1x-tmp-<dump>', sok_write.py), then
rank 0 publishes it, holding the folder's lock (folder_lock.py), in four steps:
  1. keep: each final name it will replace is hard-linked to '<name>.sok1x-kept-<dump>' (copied
     where the file system has no hard links) and the marker, rewritten atomically, names the
     kept links. A file that no marker names (SOK's own dump) is kept the same way, in an entry
     that is not "whole" (its other files stay at their names) and has no checksum;
  2. rename each temporary file over its final name;
  3. write the marker naming the new files (atomically): from here on the dump exists;
  4. remove the kept links.
A crash or SIGKILL before 3 leaves a marker naming the previous dump's files, at their names or
kept, so sok1x.load reads the previous dump whole, never a mix; from 3 on it reads the new one.
SOK's own readers open the final names, which after a crash inside 2 hold a mix until the next
sok1x.dump into the folder: it first puts kept files back (repair) and removes the temporary
and kept files that no marker names.
"""
import json
import os
import shutil

from sok1x.engine.checkpoint.storage import remove_quietly, write_atomically
from sok1x.errors import CheckpointError

MARKER_NAME = "sok1x-sok-files.json"
FORMAT, VERSION = "sok1x-sok-files", 1
TEMP_TAG, KEPT_TAG = ".sok1x-tmp-", ".sok1x-kept-"


def temporary_name(final, dump_tag):
    """Where a dump writes file `final` before it publishes it."""
    return final + TEMP_TAG + dump_tag


def read_marker(folder):
    """The folder's marker ({"format", "version", "tables"}; no tables where there is none).
    Raises CheckpointError naming the marker when it cannot be read or is damaged."""
    path = os.path.join(folder, MARKER_NAME)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return {"format": FORMAT, "version": VERSION, "tables": {}}
    except OSError as exc:
        raise CheckpointError("sok1x's marker %s cannot be read: %s" % (path, exc)) from None
    try:
        marker = json.loads(data.decode("utf-8"))
        ok = marker["format"] == FORMAT and marker["version"] == VERSION
        for entry in marker["tables"].values():
            bool(entry["whole"])
            for final, held in entry["files"].items():
                str(final), str(held["file"]), int(held["size"])
                held["crc32"] is None or int(held["crc32"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        ok, why = False, "%s: %s" % (type(exc).__name__, exc)
    else:
        why = "format %r version %r" % (marker.get("format"), marker.get("version"))
    if not ok:
        raise CheckpointError(
            "sok1x's marker %s is damaged or of another version (%s): its dumps cannot be "
            "told whole. Remove it to dump into %s again (SOK's files stay)" % (path, why, folder))
    return marker


def write_marker(folder, marker):
    """Writes `marker` into `folder` atomically, and makes the folder's renames durable."""
    write_atomically(os.path.join(folder, MARKER_NAME),
                     json.dumps(marker, sort_keys=True, indent=1).encode("utf-8"))
    sync_folder(folder)


def sync_folder(folder):
    """fsyncs the folder (its renames and new names reach the disk), where that can be done."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _same_file_as(source, target):
    """Makes `target` (a new name) hold `source`'s bytes: a hard link, else a copy on disk."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        with open(target, "rb+") as handle:
            os.fsync(handle.fileno())


def repair(folder, marker, dump_tag):
    """Puts files kept by a publish that died back at their names (SOK's readers then read one
    dump again); returns the marker, rewritten where it changed."""
    kept = [(entry, final) for entry in marker["tables"].values()
            for final, held in entry["files"].items() if held["file"] != final]
    if not kept:
        return marker
    sources = []
    for entry, final in kept:
        source = os.path.join(folder, entry["files"][final]["file"])
        target = os.path.join(folder, final)
        sources.append(source)
        if os.path.exists(target) and os.path.samefile(source, target):
            continue  # never replaced (a rename over a link to the same file does nothing)
        staged = os.path.join(folder, temporary_name(final, dump_tag))
        _same_file_as(source, staged)
        os.replace(staged, target)
    for entry, final in kept:
        entry["files"][final]["file"] = final
    write_marker(folder, marker)
    for source in sources:
        remove_quietly(source)
    return marker


def remove_leftovers(folder, marker):
    """Removes the temporary and kept files of dumps that died, and the marker's temporary
    files: any such file the marker does not name. Only while this job holds the folder's
    exclusive lock."""
    named = {held["file"] for entry in marker["tables"].values()
             for held in entry["files"].values()}
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        leftover = TEMP_TAG in name or KEPT_TAG in name or name.startswith(MARKER_NAME + ".tmp-")
        if leftover and name not in named:
            remove_quietly(os.path.join(folder, name))


def _keep_previous(folder, marker, new_tables, dump_tag):
    """Step 1: links every final name about to be replaced to a kept name the marker then
    names; returns the kept names."""
    kept = []
    for stem, files in new_tables.items():
        entry = marker["tables"].get(stem)
        for final in files:
            path = os.path.join(folder, final)
            held = entry["files"].get(final) if entry is not None else None
            if not os.path.exists(path) or (held is not None and held["file"] != final):
                continue  # nothing to keep, or kept already
            if held is None and entry is not None and entry["whole"]:
                continue  # a file the previous dump of the table did not write
            if entry is None:  # files no sok1x dump named (SOK's own): kept unchecked
                entry = marker["tables"][stem] = {"whole": False, "files": {}}
            if held is None:
                held = entry["files"][final] = {"size": os.path.getsize(path), "crc32": None}
            held["file"] = final + KEPT_TAG + dump_tag
            _same_file_as(path, os.path.join(folder, held["file"]))
            kept.append(held["file"])
    if kept:
        write_marker(folder, marker)
    return kept


def publish(folder, new_tables, dump_tag):
    """Rank 0, holding the folder's lock: makes the dump whose files are written under their
    temporary names the folder's (steps 1 to 4 above), keeping other tables' entries.
    new_tables: {stem: {final name: (size, crc32)}}."""
    marker = read_marker(folder)
    marker = repair(folder, marker, dump_tag)
    kept = _keep_previous(folder, marker, new_tables, dump_tag)
    for files in new_tables.values():
        for final in files:
            os.replace(os.path.join(folder, temporary_name(final, dump_tag)),
                       os.path.join(folder, final))
    for stem, files in new_tables.items():
        marker["tables"][stem] = {"whole": True, "files": {
            final: {"file": final, "size": int(size), "crc32": int(crc32)}
            for final, (size, crc32) in files.items()}}
    write_marker(folder, marker)
    for name in kept:
        remove_quietly(os.path.join(folder, name))


def files_to_read(marker, stem, finals, folder):
    """{final name: (path to read, size or None, crc32 or None)} for the files `finals` of table
    `stem`: where the marker names them (checked against its size and checksum), else at their
    names (a folder SOK dumped: checked by SOK's rules alone). Raises CheckpointError when a
    sok1x dump of the table lacks one of them (dumped without that optimizer's slots)."""
    entry = marker["tables"].get(stem)
    out = {}
    for final in finals:
        held = entry["files"].get(final) if entry is not None else None
        if held is None and entry is not None and entry["whole"]:
            raise CheckpointError(
                "%s: sok1x's dump of table %s in %s holds %s, not %s (dumped without that "
                "optimizer's slots?): load it without the optimizer, or dump with it"
                % (os.path.join(folder, MARKER_NAME), stem, folder, sorted(entry["files"]),
                   final))
        if held is None:
            out[final] = (os.path.join(folder, final), None, None)
        else:
            out[final] = (os.path.join(folder, held["file"]), held["size"], held["crc32"])
    return out
