"""The figures' error of bad input, apart from the drawing code so that reading logs needs no plotting library."""

from backbones.errors import UserError


class FigureError(UserError, ValueError):
    """A figure that cannot be drawn as asked: a run without logs, keys that match nothing, a bad image, point,
    stage or super token, or a backbone whose attention records hold nothing to draw; the message names the input
    and the fix."""
