"""Generations of a Saver's shard files (DESIGN D8): a save under a prefix that already holds a
checkpoint (tf.compat.v1.train.Saver.save without global_step) must leave that checkpoint
loadable until TensorFlow writes its new index, whatever happens before.

So the shards of each save carry a generation letter ('<stem>.data-<g>TTTT-of-rRRRR', the
letter not used by any shard file of that prefix on any rank when the save starts), and
nothing is written over the live checkpoint's files. The live generation is the one the
prefix's TensorFlow index names. Files of any other generation are stale (a save killed before
its index, or the checkpoint the index replaced): a save removes them before it writes, and a
rank that saw its index written removes them at once (graph_ops/checkpoint_ops.py).
TensorFlow's max_to_keep deletes '<prefix>.data-?????-of-?????', so every generation goes with
its checkpoint. The letters are never digits: TensorFlow's own data files never match.
"""
import os
import re

from sok1x.engine.checkpoint.storage import remove_quietly
from sok1x.errors import CheckpointError

# The first letter is 't': a prefix saved once keeps the names sok1x always gave it.
LETTERS = "tuvwxyzabcdefghijklmnopqrs"


def _pattern(stem):
    return re.compile(r"^%s\.data-([a-z])[0-9a-z]{4}-of-r[0-9a-z]{4}$" % re.escape(stem))


def generation_of(stem, file_name):
    """The generation letter of Saver shard `file_name` of checkpoint `stem`, or None."""
    found = _pattern(stem).match(os.path.basename(file_name))
    return found.group(1) if found else None


def shard_files(directory, stem):
    """{file name: generation letter} of the Saver shards of `stem` in `directory`."""
    pattern = _pattern(stem)
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    return {name: found.group(1) for name, found in ((n, pattern.match(n)) for n in names)
            if found}


def live_generations(stem, manifests):
    """The letters of the shards named by `manifests` (decoded manifests of `stem`'s index)."""
    return sorted({generation_of(stem, shard["file"]) for manifest in manifests
                   for entry in manifest["tables"].values() for shard in entry["shards"]}
                  - {None})


def remove_stale(directory, stem, keep):
    """Removes the Saver shards of `stem` in `directory` whose letter is not in `keep`."""
    for name, letter in shard_files(directory, stem).items():
        if letter not in keep:
            remove_quietly(os.path.join(directory, name))


def open_generation(host, directory, stem, live):
    """Collective (every rank of the save): removes the stale shards of `stem` in `directory`
    when every rank knows its live letters (`live`: a list, or None where the index could not
    be read), then returns the first letter no rank has a shard of. Raises CheckpointError on
    every rank when all letters are taken."""
    every_live = host.all_gather_object(None if live is None else sorted(live))
    if all(letters is not None for letters in every_live):
        remove_stale(directory, stem, set().union(*every_live))
    taken = set()
    for letters in host.all_gather_object(sorted(set(shard_files(directory, stem).values()))):
        taken.update(letters)
    for letter in LETTERS:
        if letter not in taken:
            return letter
    raise CheckpointError("every generation of sok1x shard files of checkpoint %s is taken in "
                          "%s (%s): remove the '%s.data-*-of-r*' files no checkpoint uses"
                          % (stem, directory, "".join(sorted(taken)), stem))
