"""TensorFlow graph ops over the engine: the only part of sok1x, with the public API, that imports
TensorFlow. Each op calls into sok1x.engine.api through boundary.py's seam (sok1x's own
TensorFlow kernels, DLPack or host staging), with its gradient registered beside it, and every
communicating op is created through ordering.chained()."""
