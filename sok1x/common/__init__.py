"""What every front door (v1, v2, deeprec) shares: the handle variable that stands for a table in
TensorFlow (handle_variable.py), the initializer specs drawn by the engine (initializers.py), and
the private disk cache of what sok1x compiles (private_cache.py)."""
