"""The error of every path that reads weights (files, URLs, state dicts): its own module, so that the reader
(``weights``) and the downloader (``download``) both raise it without importing each other."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, downloaded or loaded into the given model; the message names the problem."""
