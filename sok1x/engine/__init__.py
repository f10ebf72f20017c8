"""The engine: tables, sharding, the embedding algorithms and optimizer state, free of TensorFlow.

Graph ops call the functions of `sok1x.engine.api` with NumPy arrays; everything below works on
backend arrays and talks through sok1x.comm. The GPU test machines have no TensorFlow, so this
package must never import it.
"""

from sok1x.engine.checkpoint import join as checkpoint_join  # noqa: E402,F401  (op headers answer checkpoint markers)
