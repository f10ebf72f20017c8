"""SOK1X_REPLAY_MIB: the device memory the replayed step's kept shape classes may hold
(engine/lookup/replayed_step.py's _keep), read apart from that module so that sok1x's init can
ask every rank for it (runtime.py) without importing the step."""
import warnings

from sok1x.engine import environment

MEMORY_ENV = "SOK1X_REPLAY_MIB"
_BUDGETS = {}  # its values read so far -> bytes, or None for one that is no budget


def budget_error():
    """Why SOK1X_REPLAY_MIB's value is no budget (a message naming it), or None where it is one
    or unset; sok1x's init asks it of every rank (runtime.py)."""
    value = environment.get(MEMORY_ENV)
    try:
        mib = float(value) if value else 0.0
    except ValueError:
        mib = float("nan")
    if 0 <= mib < float("inf"):
        return None
    return ("%s=%r: give the MiB of device memory the replayed step's shape classes may hold, "
            "a number at least 0 (unset: the classes are bounded by their number alone)"
            % (MEMORY_ENV, value))


def budget_bytes():
    """The device memory the kept shape classes may hold (SOK1X_REPLAY_MIB, MiB), in bytes, or
    None where it is unset (then only MAX_CLASSES bounds them). A value that is no budget fails
    sok1x's init on every rank; one set so after it (a rank alone could fail then, its peers
    waiting in the lookup's collectives) is warned of once and left unused."""
    value = environment.get(MEMORY_ENV)
    if not value:
        return None
    if value not in _BUDGETS:
        error = budget_error()
        if len(_BUDGETS) > 16:
            _BUDGETS.clear()
        _BUDGETS[value] = None if error else int(float(value) * 2 ** 20)
        if error:
            warnings.warn("%s; it is left unused" % error, stacklevel=2)
    return _BUDGETS[value]
