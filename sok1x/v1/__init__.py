"""SOK's v1 front door: the layers (All2AllDenseEmbedding, DistributedEmbedding) and their
handle variables, the hooks, and SOK v1's Saver. Public names are indexed in sok1x/__init__.py."""
