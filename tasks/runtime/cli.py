"""The one way a tool's ``main`` reports bad input: ``command_line``."""

from __future__ import annotations

import functools
from collections.abc import Callable

from backbones.errors import UserError


def command_line(main: Callable) -> Callable:
    """Wrap a tool's ``main(argv=None, ...)``. Run from the command line (``argv`` None: ``sys.argv``), a
    ``UserError`` (a bad path, config, checkpoint, dataset or output) ends the process with ``error: <message>``
    and exit status 1, without a traceback: the message names the input and the fix. Called from Python with an
    ``argv`` list, the exception goes through to the caller, who can tell its kind."""

    @functools.wraps(main)
    def run(argv=None, *args, **kwargs):
        try:
            return main(argv, *args, **kwargs)
        except UserError as e:
            if argv is not None:
                raise
            raise SystemExit(f"error: {e}") from None

    return run
