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

A download that fails on the way is tried again, up to ``ATTEMPTS`` times, ``BACKOFF_S`` seconds after the first
failure and twice as long after each next one: a body shorter than its ``Content-Length`` (Python's
``http.client`` returns it without an error when it is read in pieces: the length is counted here), a connection
dropped or timed out mid-way, a refused connection, a reply other than 200 (4xx replies other than 408 and 429 at
once, as asking again cannot change them). The last failure is refused with the bytes received and expected. Every
attempt writes a temp file of its own that is removed when it fails, and a file that is not readable as the
checkpoint container it claims to be (a torch zip archive without its central directory, a safetensors file
shorter than its header says: ``unreadable``) never enters the cache; a cached one, left by an older version or
cut by a full disk, is deleted and downloaded anew.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import torch.hub

from ..errors import CheckpointError
from .atomic import OutputError, atomic_write

logger = logging.getLogger("backbones")

_FRAGMENT = re.compile(r"^sha256=([0-9a-fA-F]{64})$")
_CHUNK = 1 << 20
TIMEOUT_S = 60  # per network operation: a server that stops answering fails instead of hanging
ATTEMPTS = 4  # downloads tried before a failure is reported
BACKOFF_S = 2.0  # seconds before the second attempt, doubled before each next one (2, 4, 8: 14 s in all)


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


def unreadable(f) -> str | None:
    """Why the checkpoint file ``f`` (opened for reading, binary) cannot be read, for a structure that tells it
    without reading the tensors: a torch zip archive (``torch.save``) whose end of central directory is missing or
    names data past the end (cut short), a safetensors header longer than the file. None: readable, or another
    format (read as it is)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        import zipfile

        try:
            with zipfile.ZipFile(f) as archive:
                end = max((i.header_offset + i.compress_size for i in archive.infolist()), default=0)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            return f"not a complete torch zip archive ({e})"
        return None if end <= size else f"its zip directory names {end} bytes, the file has {size}"
    if len(head) == 8 and size > 8:
        n = int.from_bytes(head, "little")
        if 2 <= n < (1 << 27) and f.read(1) == b"{":  # a safetensors header: its length, then JSON
            f.seek(8)
            try:
                header = json.loads(f.read(n))
                end = 8 + n + max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            except (ValueError, KeyError, TypeError, IndexError):
                return "its safetensors header is cut or corrupt"
            return None if end <= size else f"its safetensors header names {end} bytes, the file has {size}"
    return None


class _Failed(Exception):
    """One download attempt that failed: ``str()`` says how, ``permanent`` when asking again cannot help."""

    def __init__(self, what: str, permanent: bool = False):
        super().__init__(what)
        self.permanent = permanent


def _attempt(base: str, f) -> str:
    """Download ``base`` into ``f`` (a temp file opened w+b), checking the status, the length and the container;
    returns the sha256 of the bytes. Raises ``_Failed``."""
    h, received, expected = hashlib.sha256(), 0, None
    try:
        with urllib.request.urlopen(base, timeout=TIMEOUT_S) as response:
            if response.status != 200:  # urllib follows redirects and raises for >= 400: 2xx other than 200
                raise _Failed(f"HTTP status {response.status} {response.reason}")
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            while chunk := response.read(_CHUNK):
                h.update(chunk)
                f.write(chunk)
                received += len(chunk)
    except urllib.error.HTTPError as e:
        permanent = 400 <= e.code < 500 and e.code not in (408, 429)
        raise _Failed(f"HTTP status {e.code} {e.reason}", permanent) from e
    except urllib.error.URLError as e:  # refused connection, DNS, TLS
        raise _Failed(f"{e.reason}") from e
    except (OSError, http.client.HTTPException) as e:  # reset, timeout, a chunked body cut (IncompleteRead)
        received += len(getattr(e, "partial", b""))  # the bytes of the chunks read before the cut
        cut = f" after {received} bytes" + (f" of {expected}" if expected is not None else "")
        raise _Failed(f"the connection failed{cut}: {type(e).__name__}: {e}") from e
    if expected is not None and received != expected:
        raise _Failed(f"received {received} of {expected} bytes (Content-Length): the connection closed early")
    f.flush()
    why = unreadable(f)
    if why:
        raise _Failed(f"received {received} bytes, which are not a readable checkpoint: {why}")
    return h.hexdigest()


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
        with open(path, "rb") as f:
            why = unreadable(f)
        digest = _sha256(path)
        if why is None and (expected is None or _matches(digest, expected)):
            logger.info("Checkpoint %s: cached %s (sha256 %s)", base, path, digest)
            return path
        logger.warning(
            "Checkpoint %s: cached %s %s; downloading it again",
            base,
            path,
            f"is not a readable checkpoint ({why})" if why else f"has sha256 {digest}, not {expected}",
        )
        os.remove(path)

    digests: list[str] = []  # the download's hash, for the log

    def download(f) -> None:
        digest = _attempt(base, f)
        if expected is not None and not _matches(digest, expected):
            raise CheckpointError(_mismatch(url, path, digest, expected, origin))  # atomic_write removes the temp
        digests.append(digest)

    logger.info("Downloading %s to %s", base, path)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            atomic_write(path, download, mode="w+b")
            break
        except OutputError as e:  # the cache folder cannot be written: no download can help
            raise CheckpointError(f"Cannot download checkpoint {base!r}: {e}") from e
        except _Failed as e:
            if e.permanent or attempt == ATTEMPTS:
                tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
                raise CheckpointError(
                    f"Cannot download checkpoint {base!r} ({e}; {tries}); nothing was cached. Without network "
                    f"access, download the file by hand and put it at {path} (the cache of torch.hub.get_dir(), set "
                    "by TORCH_HOME), or pass the local file's path instead of the URL."
                ) from None
            delay = BACKOFF_S * 2 ** (attempt - 1)
            logger.warning(
                "Checkpoint %s: attempt %d of %d failed (%s); trying again in %g s", base, attempt, ATTEMPTS, e, delay
            )
            time.sleep(delay)
    if expected is None:
        logger.info("Checkpoint %s has sha256 %s (pin it with %s#sha256=%s)", base, digests[0], base, digests[0])
    return path
