"""Checkpoint URLs: downloaded once into torch.hub's cache, verified by sha256, then read like local files.

A checkpoint argument may be an ``http://`` or ``https://`` URL. The file goes to
``torch.hub.get_dir()/checkpoints/<file name>`` (torch.hub's own cache, so ``TORCH_HOME`` moves it), written
atomically (a temp file beside it, renamed once complete and verified). The expected sha256 comes from, first to
last:

* an explicit ``sha256`` (``init_cfg=dict(type='Pretrained', checkpoint=URL, sha256=...)``);
* the URL's fragment, as pip writes it: ``https://host/model.pth#sha256=<64 hex digits>``, which works wherever a
  plain string does (``load_from``, the tools' checkpoint arguments);
* torch.hub's file-name convention ``name-<hash prefix>.pth``: the digits after the last ``-`` are a prefix of
  the sha256 (what ``torch.hub.load_state_dict_from_url(check_hash=True)`` checks).

A download whose hash differs is deleted and refused with both hashes; a cached file is hashed again on every
use (a corrupt one is downloaded anew). Without a hash the file is used as it is and its sha256 is logged, so it
can be pinned.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request

import torch.hub

from .atomic import atomic_write
from .errors import CheckpointError

logger = logging.getLogger("backbones")

_FRAGMENT = re.compile(r"^sha256=([0-9a-fA-F]{64})$")
_CHUNK = 1 << 20
TIMEOUT_S = 60  # per network operation: a server that stops answering fails instead of hanging


def is_url(path) -> bool:
    """True for an ``http://`` / ``https://`` string: the checkpoints this module downloads."""
    return isinstance(path, str) and path.lower().startswith(("http://", "https://"))


def split_url(url: str) -> tuple[str, str | None]:
    """(URL without its fragment, the sha256 the fragment gives or None).

    Raises ``ValueError`` for a fragment that is not ``sha256=<64 hex digits>`` (a typo must not silently turn
    verification off).
    """
    base, _, fragment = url.partition("#")
    if not fragment:
        return base, None
    match = _FRAGMENT.match(fragment)
    if match is None:
        raise ValueError(
            f"Checkpoint URL {url!r}: the fragment #{fragment} is not 'sha256=<64 hex digits>'. Write the URL as "
            "https://host/file.pth#sha256=<the file's sha256>, or leave the fragment out."
        )
    return base, match.group(1).lower()


def cache_path(url: str) -> str:
    """Where ``url`` is cached: ``torch.hub.get_dir()/checkpoints/<file name of the URL>``."""
    name = os.path.basename(urllib.parse.urlparse(split_url(url)[0]).path)
    if not name:
        raise ValueError(f"Checkpoint URL {url!r} names no file (its path ends with '/').")
    return os.path.join(torch.hub.get_dir(), "checkpoints", name)


def _expected(url: str, sha256: str | None) -> tuple[str | None, str]:
    """(expected hash or hash prefix, where it comes from)."""
    base, from_fragment = split_url(url)
    if sha256:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise ValueError(f"sha256={sha256!r} for {url!r} is not 64 hex digits.")
        return sha256.lower(), "the given sha256"
    if from_fragment:
        return from_fragment, "the URL's #sha256= fragment"
    match = torch.hub.HASH_REGEX.search(os.path.basename(urllib.parse.urlparse(base).path))
    if match and match.group(1):
        return match.group(1), "the hash prefix in the file name (torch.hub's name-<hash>.pth)"
    return None, "no hash"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _matches(digest: str, expected: str) -> bool:
    return digest.startswith(expected)  # a file-name prefix, or the whole hash


def _mismatch(url: str, path: str, digest: str, expected: str, origin: str) -> str:
    return (
        f"Checkpoint {url!r}: the downloaded file's sha256 is {digest}, but {origin} says {expected}. The file "
        f"was deleted ({path}). The download was corrupted or the file on the server changed: check the URL and "
        "the hash."
    )


def fetch(url: str, sha256: str | None = None) -> str:
    """The local path of checkpoint ``url``: the cached file when it verifies, else downloaded (atomically).

    Args:
        url: ``http(s)://.../file.pth``, optionally ``#sha256=<hex>``.
        sha256: the expected sha256 (64 hex digits); None: from the fragment or the file name, if any.

    Raises ``CheckpointError`` for a hash mismatch (the file is deleted; both hashes in the message) and for a
    download that fails (the message names the URL and the cache path to fill by hand).
    """
    try:
        base, _ = split_url(url)
        expected, origin = _expected(url, sha256)
        path = cache_path(url)
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    if os.path.isfile(path):
        digest = _sha256(path)
        if expected is None or _matches(digest, expected):
            logger.info("Checkpoint %s: cached %s (sha256 %s)", base, path, digest)
            return path
        logger.warning(
            "Checkpoint %s: cached %s has sha256 %s, not %s; downloading it again", base, path, digest, expected
        )
        os.remove(path)

    digests: list[str] = []  # the download's hash, for the log

    def download(f) -> None:
        h = hashlib.sha256()
        with urllib.request.urlopen(base, timeout=TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                h.update(chunk)
                f.write(chunk)
        digest = h.hexdigest()
        if expected is not None and not _matches(digest, expected):
            raise CheckpointError(_mismatch(url, path, digest, expected, origin))  # atomic_write removes the temp
        digests.append(digest)

    logger.info("Downloading %s to %s", base, path)
    try:
        atomic_write(path, download)
    except (urllib.error.URLError, OSError) as e:  # HTTPError, refused connection, DNS, timeout
        raise CheckpointError(
            f"Cannot download checkpoint {base!r} ({getattr(e, 'reason', None) or e}). Without network access, "
            f"download the file by hand and put it at {path} (the cache of torch.hub.get_dir(), set by "
            "TORCH_HOME), or pass the local file's path instead of the URL."
        ) from e
    if expected is None:
        logger.info("Checkpoint %s has sha256 %s (pin it with %s#sha256=%s)", base, digests[0], base, digests[0])
    return path
