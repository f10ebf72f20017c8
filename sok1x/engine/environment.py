"""The process environment as the engine reads it at every step (the replay, bounded-step and
order-check switches): os.environ.get's answer, always the current one, in one lookup of the
dict CPython keeps os.environ's encoded values in, rather than os.environ.get's five Python
calls (Mapping.get, __getitem__, the key's encoding, the value's decoding, a KeyError where the
name is unset). os.environ's own writes (a program's, pytest's monkeypatch) update that dict, so
a switch set or unset between steps is seen at the next read, as with os.environ.get; where a
program puts another mapping in os.environ's place (unittest.mock.patch("os.environ", ...)),
reads go through that mapping's get."""
import os

_ENVIRON = os.environ  # (a program that rebinds os.environ is read through os.environ.get)
_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)
_DECODE = getattr(os.environ, "decodevalue", None)
_FAST = isinstance(_DATA, dict) and _ENCODE is not None and _DECODE is not None
_KEYS = {}  # name -> its key in _DATA
_VALUES = {}  # a value as _DATA holds it -> decoded (a switch takes a few values only)


def get(name, default=None):
    """os.environ.get(name, default): the variable `name`'s value (str), or `default` where it
    is unset."""
    if not _FAST or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENCODE(name)
    raw = _DATA.get(key)
    if raw is None:
        return default
    value = _VALUES.get(raw)
    if value is None:
        if len(_VALUES) > 256:  # (a program writing ever new values: keep it small)
            _VALUES.clear()
        value = _VALUES[raw] = _DECODE(raw)
    return value
