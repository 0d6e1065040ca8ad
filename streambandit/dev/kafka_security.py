"""A secured development broker's parts: its certificates, its server properties, the librdkafka
settings of each principal, and ACLs and SCRAM users added and removed through the Admin API.

Two kinds (``ApacheKafka(security=...)``):

- ``sasl_ssl``: the client listener is SASL_SSL with SCRAM-SHA-512; a principal is a SCRAM user
  (``User:<name>``), made with a password of its own by :meth:`Security.add_user` (the broker's
  own user and ``admin`` are made when the storage is formatted).
- ``mtls``: the client listener is SSL and asks each client for a certificate signed by the
  development CA (``ssl.client.auth=required``); the principal is the certificate's CN
  (``ssl.principal.mapping.rules``), and :meth:`Security.client_settings` makes a certificate for
  a name the first time it is asked for one.

Either way the controller listener is SSL with client certificates too, on which the broker is
``User:broker``: no listener takes an unauthenticated client. The authorizer is KRaft's
StandardAuthorizer, no ACL means no access (``allow.everyone.if.no.acl.found=false``), and the
super users are ``broker`` and ``admin``; everyone else needs ACLs.

The certificates are made with ``openssl`` (EC P-256, valid two days): a CA, the broker's (SAN
IP 127.0.0.1, as a PKCS#12 keystore), one per client principal (PEM certificate and key, as
librdkafka reads them), and the CA as PEM for ``ssl.ca.location`` and the broker's truststore.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from streambandit.dev.tansu import BrokerError

__all__ = ["KINDS", "Security", "Grant"]

KINDS = ("sasl_ssl", "mtls")
BROKER = "broker"  # the broker's own principal (inter-broker and controller traffic)
ADMIN = "admin"  # the principal the fixtures and tools create topics and ACLs with
_STORE_PASSWORD = "streambandit-dev"
_SCRAM = "SCRAM-SHA-512"
_DAYS = "2"


class Grant(NamedTuple):
    """One ACL, allowed to one principal from any host: e.g. ``Grant("topic", "actions-x",
    "write")``, or a prefix, ``Grant("transactional_id", "g-", "write", "prefixed")``."""

    resource: str
    name: str
    operation: str
    pattern: str = "literal"

    def __repr__(self) -> str:
        prefixed = " (prefixed)" if self.pattern == "prefixed" else ""
        return f"{self.operation} on {self.resource} {self.name}{prefixed}"

    def binding(self, principal: str, kind: type = AclBinding) -> AclBinding:
        """The ACL allowed to ``principal`` from any host (``kind=AclBindingFilter``: the filter
        that matches exactly it)."""
        return kind(
            _resource_type(self.resource),
            self.name,
            ResourcePatternType[self.pattern.upper()],
            f"User:{principal}",
            "*",
            AclOperation[self.operation.upper()],
            AclPermissionType.ALLOW,
        )


def _resource_type(name: str) -> ResourceType:
    # The Admin API calls the cluster resource (kafka-acls --cluster) BROKER.
    return ResourceType.BROKER if name == "cluster" else ResourceType[name.upper()]


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise BrokerError(f"openssl {args[0]} failed: {last}")


class Security:
    """The certificates and credentials of one secured broker, kept under ``home``."""

    def __init__(self, kind: str, home: Path) -> None:
        if kind not in KINDS:
            raise ValueError(f"security {kind!r}: one of {', '.join(KINDS)} (or None)")
        if shutil.which("openssl") is None:
            raise BrokerError(
                "a secured Apache Kafka needs openssl on the PATH for its certificates"
            )
        self.kind = kind
        self.home = home
        self.passwords: dict[str, str] = {}
        self.bootstrap_servers = ""  # set by the broker
        self._admin: AdminClient | None = None
        self.home.mkdir(parents=True, exist_ok=True)
        if not (self.home / "ca.pem").exists():
            self._make_ca()
            self._make_cert(BROKER, san="IP:127.0.0.1")
            _openssl(
                "pkcs12", "-export", "-in", f"{BROKER}.pem", "-inkey", f"{BROKER}.key",
                "-certfile", "ca.pem", "-name", BROKER, "-out", "broker.p12",
                "-passout", f"pass:{_STORE_PASSWORD}", cwd=self.home,
            )  # fmt: skip
        # Kept beside the certificates: a broker started again on its data directory has the
        # SCRAM users its storage was formatted with.
        saved = self.home / "passwords.json"
        self.passwords = json.loads(saved.read_text()) if saved.exists() else {}
        for name in (BROKER, ADMIN):
            self.passwords.setdefault(name, secrets.token_hex(12))
        self._save()

    def _save(self) -> None:
        (self.home / "passwords.json").write_text(json.dumps(self.passwords))

    @property
    def ca_location(self) -> str:
        return str(self.home / "ca.pem")

    def _make_ca(self) -> None:
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", _DAYS,
            "-subj", "/CN=streambandit development CA", cwd=self.home,
        )  # fmt: skip

    def _make_cert(self, name: str, san: str | None = None) -> None:
        """A key and a certificate of subject CN=name signed by the CA, as PEM files."""
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=self.home,
        )  # fmt: skip
        ext = []
        if san:
            (self.home / f"{name}.ext").write_text(f"subjectAltName={san}\n")
            ext = ["-extfile", f"{name}.ext"]
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", _DAYS, "-out", f"{name}.pem", *ext, cwd=self.home,
        )  # fmt: skip

    def make_foreign_cert(self, name: str) -> dict[str, str]:
        """A certificate for CN=name signed by a CA the broker does not trust, as client settings:
        what an unknown client presents."""
        other = Security.__new__(Security)
        other.home = self.home / "foreign"
        other.home.mkdir(exist_ok=True)
        if not (other.home / "ca.pem").exists():
            other._make_ca()
        if not (other.home / f"{name}.pem").exists():
            other._make_cert(name)
        return self._ssl_client(other.home, name)

    # -- the broker's side --------------------------------------------------------------------------

    def server_properties(self, port: int, controller_port: int, host: str) -> dict[str, str]:
        """What replaces and adds to the plaintext node's properties (dev/kafka.py)."""
        client = "SASL_SSL" if self.kind == "sasl_ssl" else "SSL"
        props = {
            "listeners": f"CLIENT://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"CLIENT://{host}:{port}",
            "listener.security.protocol.map": f"CLIENT:{client},CONTROLLER:SSL",
            "inter.broker.listener.name": "CLIENT",
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.home / "broker.p12"),
            "ssl.keystore.password": _STORE_PASSWORD,
            "ssl.key.password": _STORE_PASSWORD,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.ca_location,
            # The controller listener knows the broker by its certificate.
            "listener.name.controller.ssl.client.auth": "required",
            # A certificate's principal is its CN: User:broker, not User:CN=broker.
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{BROKER};User:{ADMIN}",
        }
        if self.kind == "sasl_ssl":
            props |= {
                "sasl.enabled.mechanisms": _SCRAM,
                "sasl.mechanism.inter.broker.protocol": _SCRAM,
                f"listener.name.client.{_SCRAM.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{BROKER}" password="{self.passwords[BROKER]}";'
                ),
            }
        else:
            props["listener.name.client.ssl.client.auth"] = "required"
        return props

    def format_arguments(self) -> list[str]:
        """The StorageTool's ``format`` options that make the broker's and the admin's SCRAM
        users (none for mTLS)."""
        if self.kind != "sasl_ssl":
            return []
        return [
            a
            for name in (BROKER, ADMIN)
            for a in ("--add-scram", f"{_SCRAM}=[name={name},password={self.passwords[name]}]")
        ]

    # -- the clients' side --------------------------------------------------------------------------

    def _ssl_client(self, where: Path, name: str) -> dict[str, str]:
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": self.ca_location,
            "ssl.certificate.location": str(where / f"{name}.pem"),
            "ssl.key.location": str(where / f"{name}.key"),
        }

    def client_settings(
        self, principal: str = ADMIN, password: str | None = None
    ) -> dict[str, str]:
        """The librdkafka settings (no ``bootstrap.servers``) of ``principal``: SCRAM user and
        password (``password`` instead of its own: a wrong one), or its certificate (made now if
        it has none)."""
        if self.kind == "sasl_ssl":
            if password is None and principal not in self.passwords:
                raise KeyError(f"no SCRAM user {principal!r}: add_user() first")
            return {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": _SCRAM,
                "sasl.username": principal,
                "sasl.password": password if password is not None else self.passwords[principal],
                "ssl.ca.location": self.ca_location,
            }
        if not (self.home / f"{principal}.pem").exists():
            self._make_cert(principal)
        return self._ssl_client(self.home, principal)

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self.bootstrap_servers} | self.client_settings(ADMIN)
            )
        return self._admin

    def add_user(self, name: str, password: str | None = None) -> None:
        """A SCRAM user (sasl_ssl) whose password is then in ``passwords``; a certificate (mtls)."""
        if self.kind != "sasl_ssl":
            self.client_settings(name)
            return
        password = password or secrets.token_hex(12)
        upsert = UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        for fut in self.admin().alter_user_scram_credentials([upsert]).values():
            fut.result(timeout=30)
        self.passwords[name] = password
        self._save()
        # The SCRAM credential reaches the broker's metadata cache a moment after the controller
        # committed it: until the new user can log in.
        _until(lambda: self._can_log_in(name), f"SCRAM user {name!r} to be usable")

    def _can_log_in(self, name: str) -> bool:
        probe = AdminClient(
            {"bootstrap.servers": self.bootstrap_servers} | self.client_settings(name)
        )
        try:
            probe.list_topics(timeout=2)
            return True
        except KafkaException:
            return False

    def grant(self, principal: str, grants: list[Grant]) -> None:
        """Allow ``grants`` to ``principal``, and wait until the broker applies them."""
        for fut in self.admin().create_acls([g.binding(principal) for g in grants]).values():
            fut.result(timeout=30)
        _until(lambda: set(grants) <= set(self.acls(principal)), f"ACLs of {principal}")

    def revoke(self, principal: str, grants: list[Grant]) -> None:
        """Take ``grants`` from ``principal``, and wait until the broker applies it."""
        if not grants:
            return
        filters = [g.binding(principal, AclBindingFilter) for g in grants]
        for fut in self.admin().delete_acls(filters).values():
            fut.result(timeout=30)
        _until(lambda: not set(grants) & set(self.acls(principal)), f"ACLs of {principal} gone")

    def acls(self, principal: str) -> list[Grant]:
        """The ACLs allowed to ``principal``, as the broker describes them."""
        f = AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            f"User:{principal}",
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        found = self.admin().describe_acls(f).result(timeout=30)
        return [
            Grant(
                "cluster" if b.restype == ResourceType.BROKER else b.restype.name.lower(),
                b.name,
                b.operation.name.lower(),
                b.resource_pattern_type.name.lower(),
            )
            for b in found
        ]


def _until(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise BrokerError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.1)
