"""Connection strings as they may be shown: with the password replaced."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo

MASK = "***"


def redact(dsn: str) -> str:
    """`dsn` with any password masked, in the same form (URL or key=value) it came in."""
    # Only these prefixes make a URL for libpq; a key=value string may hold "://" in a value
    # (sslrootcert=file://...) and must still have its password masked.
    if dsn.startswith(("postgresql://", "postgres://")):
        return _redact_url(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        # Unparseable: show nothing of it rather than risk echoing a secret.
        return "<unparseable connection string>"
    if "password" in params:
        params["password"] = MASK
    return make_conninfo("", **params)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable connection string>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + MASK
        netloc = f"{userinfo}@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if k == "password" else v) for k, v in pairs], safe="/=*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
