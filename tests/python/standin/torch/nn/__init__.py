from . import parameter  # noqa: F401
