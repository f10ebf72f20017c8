"""SOK's module paths as aliases: a package whose SOK counterpart has many small modules that
each re-export one or two names registers those modules here instead of one file each."""
import sys
import types


def install(package, submodules):
    """Registers `package`.<name> in sys.modules for each name -> {attribute: value} of
    `submodules` (so `import package.name` and `from package.name import X` work) and sets them
    as attributes of the package. Returns None."""
    parent = sys.modules[package]
    for name, attributes in submodules.items():
        full_name = "%s.%s" % (package, name)
        module = types.ModuleType(full_name, "SOK's %s, as sok1x serves it." % full_name)
        module.__dict__.update(attributes)
        module.__all__ = sorted(attributes)
        sys.modules[full_name] = module
        setattr(parent, name, module)
