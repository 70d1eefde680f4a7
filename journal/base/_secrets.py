"""`redact`: the one gate that keeps secrets out of what stepjournal shows or stores.

Every error message about a remote, every log line, the command line's error lines and the origin a
pull records pass through it (docs/sharing.md, "Secrets"). A secret reaches stepjournal three ways,
and each is taken out:

- **User info of a URL** (``http://user:password@host/...``), wherever it stands in the text: the
  URL a user typed, an endpoint variable's URL quoted back by the client, a server's redirect
  (``Location``) quoted in its error reply. The URL keeps its scheme, host, port and path.
- **Values of the usual credential variables** (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``GOOGLE_*`` / ``AZURE_*`` keys ...), replaced by ``***`` wherever they appear.
- **The password (or token) of a URL held in any environment variable** (``AWS_ENDPOINT_URL``,
  ``AWS_ENDPOINT_URL_S3``, ``HTTPS_PROXY`` ...), also when a client quotes it outside a URL or
  percent-decoded.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Iterator

__all__ = ["redact", "public_url"]

# Values of these variables never appear in a message of ours (the clients' usual credential names).
_SECRET_VARIABLES = re.compile(r"(SECRET|TOKEN|PASSWORD|ACCOUNT_KEY|ACCESS_KEY|CREDENTIAL|SAS|SERVICE_ACCOUNT)", re.I)
# ``scheme://`` then user info up to the last ``@`` of the authority (a password may hold a raw ``@``).
# The scheme's length is bounded so that a long run of letters (a server's error body) costs linear
# time, not a scan from each of its characters.
_USER_INFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^\s/?#\\]*@")
# Shorter values would be found inside ordinary words: these are not secrets worth the damage.
_SHORTEST = 4


def _secret_values() -> Iterator[str]:
    for name, value in os.environ.items():
        if not value:
            continue
        if _SECRET_VARIABLES.search(name):
            yield value
        if "@" in value and "://" in value:
            for found in _USER_INFO.finditer(value):
                info = found.group(0)[len(found.group(1)):-1]
                # ``user:password``: the password (a user name is no secret); else the whole is a token.
                secret = info.split(":", 1)[1] if ":" in info else info
                yield secret
                yield urllib.parse.unquote(secret)


def redact(text: str) -> str:
    """`text` without secrets: no user info in any URL, no credential variable's value (``***``).

    What every message, log line and recorded origin of stepjournal passes through before anyone
    sees it; apply it to your own output that may quote a remote URL or a client's error.
    """
    text = _USER_INFO.sub(r"\1", text)
    for value in sorted(set(_secret_values()), key=len, reverse=True):
        if len(value) >= _SHORTEST and value in text:
            text = text.replace(value, "***")
    return text


def public_url(url: str) -> str:
    """`url` as messages, logs and events show it: `redact`ed, without query or fragment (which may
    hold a signature or token)."""
    parts = urllib.parse.urlsplit(redact(url))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
