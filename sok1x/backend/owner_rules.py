"""How a key's owner rank is chosen: the rule codes bucket_by_owner and owners_of take (every
backend, and the engine's placements, agree on them)."""

OWNER_MOD = 0    # key % world_size (v1 layers, sok1x.Variable)
OWNER_FIXED = 1  # every key on one rank (mode="localized:r")
OWNER_HASH = 2   # scramble(key) % world_size (sok1x.DynamicVariable; the hash of cuda_kernels)
