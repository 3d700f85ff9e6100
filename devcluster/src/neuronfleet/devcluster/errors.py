"""The one error base of the dev rig: a command line or a test catches :class:`RigError` for anything the rig
could not do, and each part's own subclass says which part."""


class RigError(RuntimeError):
    """Something the dev rig could not do: build an image, start a process, reach a server, ..."""
