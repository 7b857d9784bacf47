"""PostgreSQL connection strings: read by libpq itself (through psycopg's `conninfo`), and shown
with the password replaced.

psycopg is imported inside the functions that read a string, never when this module loads:
configuration stays free of the driver until it has a connection string to check.
tests/test_house.py checks that a fresh interpreter loads configuration without psycopg, and
tests/unit/test_dsn.py that these functions read strings as libpq does.
"""

from __future__ import annotations

import functools
from urllib.parse import unquote

MASK = "***"
#: The parameters of a connection string that hold a secret: the password, the one that unlocks
#: the client's SSL key, and libpq 18's OAuth client secret and SCRAM keys.
SECRET_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
UNPARSEABLE = "<unparseable connection string>"

_URI_PREFIXES = ("postgresql://", "postgres://")


class BadDsn(ValueError):
    """Not a connection string libpq would accept. The message never quotes the string."""


class Misread(BadDsn):
    """A URI libpq would read otherwise than it was meant (a password's piece taken for a host,
    a user name or a database name, which messages then quote); the message names the fix."""


class UnencodedAt(Misread):
    """A URI whose user info holds an `@` unencoded: libpq would read the rest as a host; or
    whose parameters hold one, where libpq ends a user name there."""


class UnencodedSlash(Misread):
    """A URI with no user info whose path holds an `@`: a password's `/` unencoded, where libpq
    ends the host part, the password's rest then read as a port and a database name."""


def __getattr__(name: str) -> frozenset[str]:
    # KEYWORDS is libpq's own list, so it is read (loading psycopg) only when asked for.
    if name == "KEYWORDS":
        return _keywords()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _keywords() -> frozenset[str]:
    """libpq's keywords, read once (loading psycopg)."""
    from psycopg.pq import Conninfo

    return frozenset(option.keyword.decode() for option in Conninfo.get_defaults())


def parse_dsn(dsn: str) -> dict[str, str]:
    """The keywords of `dsn` (a URI or key=value pairs) as libpq reads them; BadDsn if it
    refuses them, or names a port that is not a number."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    except Error:
        # Not libpq's message: it may quote a piece of the string, a password say.
        raise BadDsn("libpq refuses it as a connection string") from None
    except UnicodeError:
        # A byte that is no character (from the environment, as a surrogate): libpq never sees it.
        raise BadDsn("it holds a byte that is no character") from None
    if dsn.startswith(_URI_PREFIXES):
        _refuse_misread(dsn.partition("://")[2])
    # libpq reads any port and fails only when it connects: refuse a bad one at start.
    ports = params.get("port", "")
    if not all(port.strip().isdigit() for port in ports.split(",") if port):
        raise BadDsn("invalid port number")
    return params


def redact(dsn: str) -> str:
    """`dsn` with any password masked, in the same form (URL or key=value) it came in."""
    # Only these prefixes make a URI for libpq; a key=value string may hold "://" in a value
    # (sslrootcert=file://...) and must still have its password masked.
    if dsn.startswith(_URI_PREFIXES):
        return _redact_uri(dsn)
    try:
        params = parse_dsn(dsn)
    except BadDsn:
        # Unparseable: show nothing of it rather than risk echoing a secret.
        return UNPARSEABLE
    from psycopg.conninfo import make_conninfo

    for key in SECRET_KEYS & params.keys():
        params[key] = MASK
    return make_conninfo("", **params)


def _refuse_misread(rest: str) -> None:
    """Raise Misread where libpq would read a piece of a password as something else (`rest`:
    a URI past its `://`)."""
    # As libpq reads a URI: the user info ends at the first `@` before any `/` (a `?` before it
    # is the password's), the hosts after it at a `/` or a `?`.
    before_path, slash, path = rest.partition("/")
    info, at, hosts = before_path.partition("@")
    if at and "@" in hosts.split("?", 1)[0]:
        # A second `@` in the hosts: the password's, unencoded. libpq would take the rest for a
        # host, whose name its error then quotes: a piece of the password.
        raise UnencodedAt("an '@' in its user or password: write it %40")
    if at and _parameters_in(info):
        # `postgresql://db?password=p@ss`: libpq reads `db?password=p` as the user name and
        # `ss` as the host (`db:5432?password=p@ss`: a user `db`, a password `5432?...`). A `?`
        # alone in a password is the password's, as libpq reads it.
        raise UnencodedAt(
            "a parameter before its '@', which libpq reads as part of its user or password: "
            "write an '@' in a parameter as %40 (a '?' in a password as %3F)"
        )
    # libpq's host part ends at the first `/` or `?`: only a `/` before any `?` opens a path
    # (`postgresql://?host=/tmp&user=me@srv` has none).
    database = path.split("?", 1)[0] if slash and "?" not in before_path else ""
    if "=" in database:
        # `postgresql://app@db/app&password=...`: libpq reads it all as the database's name,
        # which messages then show.
        raise Misread(
            "an '=' in its database name, which libpq reads as part of the name: parameters "
            "follow a '?' (postgresql://host/db?key=value&key=value)"
        )
    if not at and "@" in database:
        # `postgresql://app:2024/pw@db/app`: a password's `/` ends the host part, so libpq
        # reads host `app`, port `2024` and the database `pw@db/app`, which messages show.
        raise UnencodedSlash(
            "an '@' after a '/' and no user before the host: in a password, write '/' as %2F"
        )


def _redact_uri(url: str) -> str:
    """The URI with the password of its user info and any secret parameter masked.

    Where libpq reads the string, it is split as libpq splits it: the user info ends at the
    first `@` before any `/` (a `#` or a `?` in it is the password's, where a URL parser would
    end the host there). Where libpq refuses it, where a password ends cannot be told: the
    user info is taken to the last `@` before the path and shown only where its user name is
    plain, a non-numeric port with no user info is masked (it may be a password), and nothing
    is shown past `://` where an `@` follows a `/`."""
    prefix = next(p for p in _URI_PREFIXES if url.startswith(p))
    rest = url[len(prefix) :]
    try:
        parse_dsn(url)
    except BadDsn:
        return _redact_refused_uri(prefix, rest)
    shown = prefix
    end = min((i for i in (rest.find("@"), rest.find("/")) if i >= 0), default=-1)
    if end >= 0 and rest[end] == "@":
        user, colon, _ = rest[:end].partition(":")
        shown += f"{user}:{MASK}@" if colon else rest[: end + 1]
        rest = rest[end + 1 :]
    # The hosts end at the path or the parameters; the parameters at the end.
    before, question, query = rest.partition("?")
    if question:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(
            f"{key}={MASK}" if _secret_key(key) else f"{key}{eq}{value}" for key, eq, value in pairs
        )
    return shown + before + question + query


def _redact_refused_uri(prefix: str, rest: str) -> str:
    head, slash, path = rest.partition("/")
    if "@" in path:
        return prefix + MASK
    shown = prefix
    info, at, hosts = head.rpartition("@")
    if at:
        user, colon, _ = info.partition(":")
        if not _plain(user if colon else info) or _parameters_in(info):
            return prefix + MASK
        shown += f"{user}:{MASK}@" if colon else f"{info}@"
    elif not all(_plain_host(host) for host in hosts.partition("?")[0].split(",")):
        # No user info, and a port that is no number (or a host that does not end): `app:pw`
        # may be a user and a password with no `@host` after them, whose rest (a `,`, a `/`,
        # a `?` of the password's) cannot be told from what follows. Nothing is shown.
        return prefix + MASK
    if "?" in hosts:
        # The parameters begin before any `/`: everything after the `?` is theirs.
        hosts, question, query = hosts.partition("?")
        query, slash, database = query + slash + path, "", ""
    else:
        database, question, query = path.partition("?")
    if slash and not _plain_word(database):
        database = MASK  # a parameter typed into it (`app&password=...`, `app password=...`)
    # Only parameters that read as libpq's own, none secret, each value a plain word: a value
    # may hold an unencoded `&`, whose pieces read as more parameters, or another parameter
    # (`sslmode=require?password=...`), and with no user info a password's rest may follow a
    # port (`app:2024?pw`).
    if question and not all(_plain_parameter(pair) for pair in query.split("&")):
        query = MASK
    return shown + hosts + slash + database + question + query


def _plain_parameter(pair: str) -> bool:
    """Whether `key=value` of a URI's parameters is one of libpq's, no secret one, its value
    a plain word."""
    key, eq, value = pair.partition("=")
    return bool(eq) and unquote(key) in _keywords() and not _secret_key(key) and _plain_word(value)


def _plain_word(text: str) -> bool:
    """Whether `text` holds none of what separates or assigns parameters: `=`, `?`, `;`, `&`,
    a space."""
    return not any(c in text for c in "=?;&") and not any(c.isspace() for c in text)


def _parameters_in(info: str) -> bool:
    """Whether a URI's user info (to its `@`) holds what reads as its parameters: a `?` and
    then one of libpq's keywords and an `=` (`db?password=p@ss`, `db:5432?sslmode=...@h`).
    A `?` and `=` alone are a password's own (`Xy?z=9`), as libpq reads them."""
    _, question, after = info.partition("?")
    if not question:
        return False
    # Decoded, as libpq decodes a parameter's name (`pass%77ord` is `password`).
    keys = {unquote(pair.partition("=")[0]) for pair in after.split("&") if "=" in pair}
    return bool(keys & _keywords())


def _plain_host(host: str) -> bool:
    """Whether `host[:port]` (an IPv6 address in brackets) reads as a host and a port that is a
    number (or none)."""
    if host.startswith("["):
        _, bracket, after = host.partition("]")
        return bool(bracket) and (not after or (after[0] == ":" and after[1:].isdigit()))
    _, colon, port = host.rpartition(":")
    return not colon or port.isdigit()


def _secret_key(key: str) -> bool:
    return unquote(key).strip().lower() in SECRET_KEYS


def _plain(user: str) -> bool:
    """Whether `user` reads as a user name alone, with no piece of parameters or a path."""
    return not any(c in user for c in "?#&=/@") and not any(c.isspace() for c in user)
