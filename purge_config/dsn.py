"""PostgreSQL connection strings, read as libpq reads them: checked, and shown with the password
replaced.

Parsed here rather than by libpq (through psycopg) so that configuration stays free of the
driver: the rules are libpq's documented ones (a `postgresql://` URI, or `key=value` pairs with
single quotes and backslash escapes), and the keywords are libpq 18's. tests/test_dsn.py checks
both against the libpq that psycopg bundles.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
UNPARSEABLE = "<unparseable connection string>"

#: libpq 18's connection keywords (`PQconndefaults()`); any other is refused, as libpq does.
KEYWORDS = frozenset(
    {
        "application_name", "channel_binding", "client_encoding", "connect_timeout", "dbname",
        "fallback_application_name", "gssdelegation", "gssencmode", "gsslib", "host", "hostaddr",
        "keepalives", "keepalives_count", "keepalives_idle", "keepalives_interval", "krbsrvname",
        "load_balance_hosts", "max_protocol_version", "min_protocol_version", "oauth_client_id",
        "oauth_client_secret", "oauth_issuer", "oauth_scope", "options", "passfile", "password",
        "port", "replication", "require_auth", "requirepeer", "scram_client_key",
        "scram_server_key", "service", "ssl_max_protocol_version", "ssl_min_protocol_version",
        "sslcert", "sslcertmode", "sslcompression", "sslcrl", "sslcrldir", "sslkey",
        "sslkeylogfile", "sslmode", "sslnegotiation", "sslpassword", "sslrootcert", "sslsni",
        "target_session_attrs", "tcp_user_timeout", "user",
    }
)  # fmt: skip

_URI_PREFIXES = ("postgresql://", "postgres://")


class BadDsn(ValueError):
    """Not a connection string libpq would accept. The message never quotes the string."""


def parse_dsn(dsn: str) -> dict[str, str]:
    """The keywords of `dsn` (a URI or key=value pairs) as libpq would read them; BadDsn if it
    would refuse them."""
    params = _parse_uri(dsn) if dsn.startswith(_URI_PREFIXES) else _parse_pairs(dsn)
    unknown = sorted(set(params) - KEYWORDS)
    if unknown:
        raise BadDsn(f"invalid connection option {unknown[0]!r}")
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
    if "password" in params:
        params["password"] = MASK
    return " ".join(f"{key}={_quote(value)}" for key, value in params.items())


def _parse_pairs(text: str) -> dict[str, str]:
    params: dict[str, str] = {}
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            return params
        start = pos
        while pos < end and not text[pos].isspace() and text[pos] != "=":
            pos += 1
        key = text[start:pos]
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end or text[pos] != "=":
            raise BadDsn('missing "=" after a keyword')
        pos += 1
        while pos < end and text[pos].isspace():
            pos += 1
        value, pos = _value(text, pos)
        params[key] = value


def _value(text: str, pos: int) -> tuple[str, int]:
    """One value from `pos`: quoted ('...', backslash escapes) or up to the next white space."""
    out: list[str] = []
    quoted = pos < len(text) and text[pos] == "'"
    pos += quoted
    while pos < len(text):
        char = text[pos]
        if quoted and char == "'":
            return "".join(out), pos + 1
        if not quoted and char.isspace():
            break
        if char == "\\" and pos + 1 < len(text):
            pos += 1
            char = text[pos]
        out.append(char)
        pos += 1
    if quoted:
        raise BadDsn("unterminated quoted string")
    return "".join(out), pos


def _parse_uri(uri: str) -> dict[str, str]:
    rest = uri.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    authority, slash, dbname = rest.partition("/")
    params: dict[str, str] = {}
    if "@" in authority:
        userinfo, _, authority = authority.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if user:
            params["user"] = _unquote(user)
        if colon:
            params["password"] = _unquote(password)
    hosts, ports = [], []
    for spec in authority.split(",") if authority else []:
        if spec.startswith("["):
            close = spec.find("]")
            if close < 0:
                raise BadDsn('no matching "]" in an IPv6 host address')
            host, tail = spec[1:close], spec[close + 1 :]
            if tail and not tail.startswith(":"):
                raise BadDsn("unexpected character after an IPv6 host address")
            port = tail[1:]
        else:
            host, _, port = spec.partition(":")
        hosts.append(_unquote(host))
        ports.append(port)
    if any(hosts):
        params["host"] = ",".join(hosts)
    if any(ports):
        params["port"] = ",".join(ports)
    if slash and dbname:
        params["dbname"] = _unquote(dbname)
    for item in query.split("&") if query else []:
        key, equals, value = item.partition("=")
        if not equals or "=" in value:
            raise BadDsn('a URI query parameter without exactly one "="')
        key, value = _unquote(key), _unquote(value)
        if key == "ssl" and value == "true":
            key, value = "sslmode", "require"
        if key not in KEYWORDS:
            raise BadDsn(f"invalid URI query parameter {key!r}")
        params[key] = value
    return params


def _unquote(text: str) -> str:
    # libpq refuses a malformed percent escape where urllib would keep it as written.
    for at in range(len(text)):
        if text[at] == "%":
            code = text[at + 1 : at + 3]
            if len(code) < 2 or any(c not in "0123456789abcdefABCDEF" for c in code):
                raise BadDsn("invalid percent-encoded token")
    return unquote(text, errors="strict")


def _quote(value: str) -> str:
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _redact_uri(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNPARSEABLE
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
