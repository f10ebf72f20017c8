"""What every front door (v1, v2, deeprec) shares: the handle variable that stands for a table in
TensorFlow (handle_variable.py) and the initializer specs drawn by the engine (initializers.py)."""
