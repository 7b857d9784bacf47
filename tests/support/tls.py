"""A real TLS endpoint in front of the tests' Temporal dev server, which has no TLS of its own:
Debian's nginx terminating TLS and passing gRPC on (`grpc_pass`), with certificates of a private
CA that the `openssl` command makes for the test.

One nginx serves three doors to the same dev server, each on a port of its own:

- `tls`: server TLS only; a client must trust the private CA;
- `mtls`: `ssl_verify_client on`: a client must also present a certificate the CA signed;
- `api_key`: server TLS, and every call must carry `authorization: Bearer <key>` (how the SDK
  sends `api_key`, as Temporal Cloud expects it); any other call gets HTTP 401 with
  grpc-status 16 (UNAUTHENTICATED).
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from purge_ops.ports import free_ports

#: Debian installs nginx in /usr/sbin, which an unprivileged user's PATH often lacks.
NGINX_FALLBACK = Path("/usr/sbin/nginx")
#: Set by .ci/run where it has nginx and openssl: their absence then fails the tests.
REQUIRE_ENV = "PURGE_REQUIRE_NGINX"
#: How long nginx gets to listen on its ports.
START_WITHIN = 15.0


def tool(name: str) -> str:
    """The `nginx` or `openssl` executable. Where it is missing the tests skip, saying how to get
    it; under CI (CI set) or with PURGE_REQUIRE_NGINX=1 (.ci/run, which installs both as root)
    they fail instead, so TLS is never silently left untested there."""
    found = shutil.which(name)
    if found is None and name == "nginx" and os.access(NGINX_FALLBACK, os.X_OK):
        found = str(NGINX_FALLBACK)
    if found:
        return found
    message = (
        f"{name} is not installed, so Temporal over TLS, mTLS and API keys is NOT tested here: "
        f"`apt-get install nginx openssl` (Debian's packages) or run .ci/run"
    )
    if os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Certificates:
    """PEM files of a private CA, a server certificate it signed for 127.0.0.1 and localhost,
    and a client certificate it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [tool("openssl"), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server and a client certificate in `directory`, by the `openssl` command.

    EC P-256 keys (made in milliseconds, RSA's take a while); each leaf certificate carries
    the extensions the SDK's TLS stack (rustls) insists on: a subjectAltName for the server
    (the common name is not read), `CA:FALSE`, and the extended key usage of its role."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=purge test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    leaves = {
        "server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for role, extensions in leaves.items():
        (directory / f"{role}.ext").write_text(
            f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"
        )
        _openssl(
            "req", *ec, "-keyout", f"{role}.key", "-out", f"{role}.csr",
            "-subj", f"/CN=purge test {role}",
            cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{role}.ext", "-out", f"{role}.pem",
            cwd=directory,
        )  # fmt: skip
    return Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


@dataclass(frozen=True)
class TlsFront:
    """The three doors of a running nginx to one Temporal server, and what opens each."""

    tls: str
    """`127.0.0.1:PORT`: server TLS, the private CA's."""
    mtls: str
    """`127.0.0.1:PORT`: server TLS, and a client certificate the CA signed is required."""
    api_key: str
    """`127.0.0.1:PORT`: server TLS, and `authorization: Bearer <key>` is required."""
    key: str
    """The API key the `api_key` door accepts."""
    certificates: Certificates


def nginx_config(base: Path, upstream: str, ports: list[int], certs: Certificates, key: str) -> str:
    """nginx's whole configuration, everything it writes kept under `base`."""
    # As root, the worker processes would otherwise drop to `nobody`: they stay this user's.
    user = ""
    if os.geteuid() == 0:
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    tls, mtls, api_key = ports
    # Temporal's long polls (a worker's, `sweep` waiting on a pass) may last up to the SDK's 70 s
    # deadline: nginx's default 60 s read timeout would cut them.
    return f"""\
daemon off;
worker_processes 1;
{user}
pid {base}/nginx.pid;
error_log {base}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {base}/access.log;
    client_body_temp_path {base}/body;
    proxy_temp_path {base}/proxy;
    fastcgi_temp_path {base}/fastcgi;
    uwsgi_temp_path {base}/uwsgi;
    scgi_temp_path {base}/scgi;
    client_max_body_size 0;
    grpc_read_timeout 300s;
    grpc_send_timeout 300s;
    ssl_certificate {certs.server_cert};
    ssl_certificate_key {certs.server_key};
    ssl_protocols TLSv1.2 TLSv1.3;
    map $http_authorization $api_key_ok {{
        default 0;
        "Bearer {key}" 1;
    }}
    server {{
        listen 127.0.0.1:{tls} ssl http2;
        location / {{ grpc_pass grpc://{upstream}; }}
    }}
    server {{
        listen 127.0.0.1:{mtls} ssl http2;
        ssl_client_certificate {certs.ca};
        ssl_verify_client on;
        location / {{ grpc_pass grpc://{upstream}; }}
    }}
    server {{
        listen 127.0.0.1:{api_key} ssl http2;
        location / {{
            if ($api_key_ok = 0) {{
                add_header grpc-status 16 always;
                add_header grpc-message "missing or wrong API key" always;
                return 401;
            }}
            grpc_pass grpc://{upstream};
        }}
    }}
}}
"""


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def running_tls_front(upstream: str, base: Path) -> Iterator[TlsFront]:
    """nginx in front of the gRPC server at `upstream` (HOST:PORT), its config, certificates,
    pid, logs and temporary files in `base`; stopped when the block ends, whatever happened."""
    nginx = tool("nginx")
    certs = make_certificates(base)
    key = secrets.token_hex(16)
    ports = free_ports(3)
    conf = base / "nginx.conf"
    conf.write_text(nginx_config(base, upstream, ports, certs, key))
    log = base / "nginx.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [nginx, "-c", str(conf), "-p", str(base), "-e", str(base / "error.log")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_WITHIN
        while not all(_listening(port) for port in ports):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = [log, base / "error.log"]
                raise RuntimeError(
                    f"nginx did not start (status {proc.poll()}): "
                    + "".join(f.read_text(errors="replace") for f in said if f.exists())
                )
            time.sleep(0.02)
        tls, mtls, api_key = (f"127.0.0.1:{port}" for port in ports)
        yield TlsFront(tls, mtls, api_key, key, certs)
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: nginx's fast shutdown, workers included
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
