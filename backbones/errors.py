"""The project's errors of bad input, and the error of every path that reads weights (files, URLs, state dicts):
one module, so that the reader (``weights``) and the downloader (``download``) both raise it without importing each
other, and so that every room derives its own from one base."""


class UserError(Exception):
    """Bad input from the user (a path, a config, a checkpoint, an output that cannot be written, a dataset): the
    message names the input at fault and the fix, and a command line prints it without a traceback
    (``tasks.runtime.cli.command_line``). Each kind keeps the built-in base callers catch it by."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be read, downloaded or loaded into the given model; the message names the problem."""
