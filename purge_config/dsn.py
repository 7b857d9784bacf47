"""PostgreSQL connection strings: read by libpq itself (through psycopg's `conninfo`), and shown
with the password replaced.

psycopg is imported inside the functions that read a string, never when this module loads:
configuration stays free of the driver until it has a connection string to check.
tests/test_house.py checks that a fresh interpreter loads configuration without psycopg, and
tests/unit/test_dsn.py that these functions read strings as libpq does.
"""

from __future__ import annotations

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


class UnencodedAt(BadDsn):
    """A URI whose user info holds an `@` unencoded: libpq would read the rest as a host."""


def __getattr__(name: str) -> frozenset[str]:
    # KEYWORDS is libpq's own list, so it is read (loading psycopg) only when asked for.
    if name == "KEYWORDS":
        from psycopg.pq import Conninfo

        return frozenset(option.keyword.decode() for option in Conninfo.get_defaults())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        # As libpq reads a URI: the user info ends at the first `@` before any `/` (a `?`
        # before it is the password's), the hosts after it at a `/` or a `?`.
        before_path = dsn.partition("://")[2].split("/", 1)[0]
        _, at, hosts = before_path.partition("@")
        if at and "@" in hosts.split("?", 1)[0]:
            # A second `@` in the hosts: the password's, unencoded. libpq would take the rest
            # for a host, whose name its error then quotes: a piece of the password.
            raise UnencodedAt("an '@' in its user or password: write it %40")
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


def _redact_uri(url: str) -> str:
    """The URI with the password of its user info and any `password` parameter masked.

    libpq ends the user info at the first `@` before any `/`: a `#` or a `?` in it is the
    password's, where a URL parser would end the host there. The mask runs further, to the last
    `@` before the next `/`, so that a password holding an `@` unencoded is masked whole; and
    where libpq refuses the string, an `@` after a `/` opens user info too."""
    try:
        parse_dsn(url)
        refused = False
    except BadDsn:
        refused = True
    prefix = next(p for p in _URI_PREFIXES if url.startswith(p))
    rest = url[len(prefix) :]
    shown = prefix
    first, slash = rest.find("@"), rest.find("/")
    if first >= 0 and (refused or slash < 0 or first < slash):
        after = rest.find("/", first)
        end = rest.rfind("@", 0, after if after >= 0 else len(rest))
        user, colon, _ = rest[:end].partition(":")
        shown += f"{user}:{MASK}@" if colon else rest[: end + 1]
        rest = rest[end + 1 :]
    # The hosts end at the path or the parameters; the parameters at the end.
    before, question, query = rest.partition("?")
    if question:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(
            f"{key}={MASK}" if unquote(key).lower() in SECRET_KEYS else f"{key}{eq}{value}"
            for key, eq, value in pairs
        )
    return shown + before + question + query
