"""Who may steer a topology: ZooKeeper credentials, the ACL its znodes get, TLS.

Credentials are one line ``SCHEME:CREDENTIALS`` (ZooKeeper's ``digest:user:password``),
read from the environment variable ``TOPO_ZK_AUTH`` or, when that is unset, from the
file named by ``zookeeper.auth_file``; never from a YAML value. A file that other
users may read gets one warning line, as ssh does for a key.

With credentials, every znode a run creates under its root gets ``acl``: all
permissions for those credentials only (kazoo's ``make_digest_acl`` for ``digest``;
ZooKeeper's ``auth`` scheme, "whoever created it", for any other scheme), plus
``world:anyone`` read when ``zookeeper.read_open`` says so. ZooKeeper's super user
keeps every right, as always. ``expected_problem`` compares what a tree carries with
that ACL, for the check at start (an older, open tree is refused, not used).

Nothing here ever puts a credential into a message, a ``repr`` or a log line:
``ZkAuth`` shows ``digest:user:***``; a malformed value is described, never echoed;
``redact`` is a logging filter on kazoo's logger for what kazoo itself might log.
"""
from __future__ import annotations

import logging
import os
import ssl
import socket
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping

from backpressure.coordinator.base import CredentialsError, NotAuthorized

__all__ = ["CredentialsError", "NotAuthorized", "Tls", "ZkAuth", "acl_problem", "load_auth", "parse_auth", "redact"]

from kazoo.security import ACL, Permissions, make_acl, make_digest_acl, make_digest_acl_credential

log = logging.getLogger(__name__)

ENV = "TOPO_ZK_AUTH"
MAX_FILE_BYTES = 64 * 1024
_WRITE = Permissions.CREATE | Permissions.WRITE | Permissions.DELETE | Permissions.ADMIN


@dataclass(frozen=True)
class ZkAuth:
    """One ``SCHEME:CREDENTIALS`` pair and where it came from; its repr hides the secret."""

    scheme: str
    credential: str = field(repr=False)
    source: str = ENV

    @property
    def user(self) -> str:
        """Who these credentials are, safe to print (digest: the user name)."""
        return self.credential.split(":", 1)[0] if self.scheme == "digest" else self.scheme

    def __repr__(self) -> str:
        return f"ZkAuth({self.scheme}:{self.user if self.scheme == 'digest' else ''}:***, from {self.source})"

    __str__ = __repr__

    def auth_data(self) -> list[tuple[str, str]]:
        """What kazoo's ``KazooClient(auth_data=...)`` takes."""
        return [(self.scheme, self.credential)]

    def acl(self, read_open: bool = False) -> list[ACL]:
        """All rights for these credentials only; anyone may read when ``read_open``."""
        if self.scheme == "digest":
            user, password = self.credential.split(":", 1)
            mine = make_digest_acl(user, password, all=True)
        else:
            mine = make_acl("auth", "", all=True)
        return [mine, make_acl("world", "anyone", read=True)] if read_open else [mine]

    def digest_id(self) -> str | None:
        """``user:base64(sha1(user:password))``, the id a digest ACL names; None for other schemes."""
        if self.scheme != "digest":
            return None
        user, password = self.credential.split(":", 1)
        return make_digest_acl_credential(user, password)


def parse_auth(text: str, source: str) -> ZkAuth:
    """``SCHEME:CREDENTIALS`` -> ZkAuth; ``CredentialsError`` (that never shows the value)."""
    line = text.strip()
    if "\n" in line:
        raise CredentialsError(f"{source}: expected one line SCHEME:CREDENTIALS (e.g. digest:user:password), "
                               "found several lines (the value is not shown)")
    scheme, sep, credential = line.partition(":")
    if not sep or not scheme or not credential or not scheme.isalnum():
        raise CredentialsError(f"{source}: expected SCHEME:CREDENTIALS, e.g. digest:user:password "
                               "(the value is not shown)")
    if scheme == "digest" and (":" not in credential or not credential.split(":", 1)[0]):
        raise CredentialsError(f"{source}: digest credentials are user:password, e.g. digest:user:password "
                               "(the value is not shown)")
    auth = ZkAuth(scheme, credential, source)
    redact.add(credential)
    return auth


def load_auth(auth_file: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> ZkAuth | None:
    """The credentials of this process: ``TOPO_ZK_AUTH``, else ``zookeeper.auth_file``, else None."""
    env = os.environ if environ is None else environ
    value = env.get(ENV)
    if value:
        return parse_auth(value, ENV)
    if not auth_file:
        return None
    where = f"zookeeper.auth_file {os.fspath(auth_file)}"
    try:
        with open(auth_file, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CredentialsError(f"{where}: cannot read it: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CredentialsError(f"{where}: too large for one line of credentials")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s: readable by other users (mode %o); chmod 600 it", where, stat.S_IMODE(mode))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsError(f"{where}: not UTF-8 text (the value is not shown)") from None
    return parse_auth(text, where)


def auth_from_config(config: Mapping[str, Any]) -> ZkAuth | None:
    return load_auth(config.get("zookeeper.auth_file"))


@dataclass(frozen=True)
class Tls:
    """``zookeeper.tls.*``: the CA that signs the server's certificate, and our own
    certificate and key when the server asks for one. Paths only; contents never shown."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Tls | None":
        ca, cert, key = (config.get(f"zookeeper.tls.{k}") for k in ("ca", "cert", "key"))
        if not (ca or cert or key):
            return None
        if bool(cert) != bool(key):
            raise CredentialsError("zookeeper.tls.cert and zookeeper.tls.key go together: set both or neither")
        for k, path in (("ca", ca), ("cert", cert), ("key", key)):
            if path and not os.access(path, os.R_OK):
                raise CredentialsError(f"zookeeper.tls.{k}: cannot read {path}")
        return cls(ca, cert, key)

    def kazoo_args(self) -> dict[str, Any]:
        """What ``KazooClient`` takes: ``use_ssl``, ``ca``, ``certfile``, ``keyfile``."""
        return {"use_ssl": True, "ca": self.ca, "certfile": self.cert, "keyfile": self.key, "verify_certs": True}

    def handshake_problem(self, hosts: str, timeout: float) -> str | None:
        """Why a TLS handshake with the first host fails (certificate, CA), or None.
        Only to explain a failed connection in one line; kazoo does the real work."""
        host, _, port = hosts.split(",")[0].rpartition(":")
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.check_hostname = False
        if self.cert:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as e:
                return f"zookeeper.tls.cert/key: cannot load them ({getattr(e, 'reason', None) or e.__class__.__name__})"
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
                with ctx.wrap_socket(raw) as s:
                    s.do_handshake()
        except ssl.SSLCertVerificationError as e:
            return (f"TLS handshake with {host}:{port} failed: {e.verify_message or 'certificate verify failed'} "
                    "(is zookeeper.tls.ca the CA that signed the server's certificate?)")
        except ssl.SSLError as e:
            return f"TLS handshake with {host}:{port} failed: {e.reason or e.__class__.__name__}"
        except (OSError, ValueError):
            return None
        return None


class _Redact(logging.Filter):
    """Replaces every known credential in a record's message with ``***``."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def add(self, secret: str) -> None:
        if secret:
            self.secrets.add(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if any(s in text for s in self.secrets):
                for s in self.secrets:
                    text = text.replace(s, "***")
                record.msg, record.args = text, None
        return True


redact = _Redact()


def acl_problem(acls: list[ACL], expected: list[ACL], auth: ZkAuth) -> str | None:
    """Why a znode's ACL is not the one these settings make, or None when it is."""
    have = {(a.perms, a.id.scheme, a.id.id) for a in acls}
    want = {(a.perms, a.id.scheme, a.id.id) for a in expected}
    if have == want:
        return None
    if any(a.id.scheme == "world" and a.perms & _WRITE for a in acls):
        return "has an open ACL (anyone who reaches ZooKeeper may write or delete it; an older run without credentials?)"
    if auth.scheme != "digest":
        return None     # ZooKeeper stores the "auth" ACL as the creator's own id, which only it knows
    mine = auth.digest_id()
    if mine is not None and not any(a.id.scheme == "digest" and a.id.id == mine for a in acls):
        users = sorted({a.id.id.split(":", 1)[0] for a in acls if a.id.scheme == "digest"})
        if auth.user in users:
            return f"is protected for user {auth.user!r} with another password (a wrong password?)"
        return (f"is protected for other credentials ({', '.join(users) or 'not digest'}), "
                f"not for user {auth.user!r}")
    return "has an ACL other than these settings make (zookeeper.read_open differs from the run that made it?)"
