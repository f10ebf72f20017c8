"""SOK v1's sparse_operation_kit.saver package: its module `Saver` holds the class Saver
(sok1x.Saver)."""
from sok1x.common import alias_modules
from sok1x.v1.saver import Saver as _Saver

alias_modules.install(__name__, {"Saver": {"Saver": _Saver}})
