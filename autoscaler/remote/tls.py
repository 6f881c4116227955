"""The controller's certificate for its agents' endpoint: self-signed, made once, pinned by the agents.

``spotrain controller start --executor remote`` serves the agents' endpoints over HTTPS
(``remote/listener.py``) with this certificate. It is made on first use with the ``cryptography`` package
(an EC P-256 key, valid 10 years, names ``spotrain-controller`` and the hosts it is first made for) and
kept in the fleet's directory (``SPOTRAIN_FLEET_DIR``, default SPOTRAIN_HOME) as ``agent-tls.key`` and
``agent-tls.crt`` (both mode 0600), so instances launched before a controller restart, or by a leader
that a standby of its fleet took over from, still trust the controller that serves them now. Every instance's agent config carries
the certificate (``controller_cert_pem``), and the agent trusts it alone
(``cloud_providers/remote/tls.py``): no public CA is involved, and no other server can pass for the
controller. To rotate it, stop the controller, delete both files and terminate the instances.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from autoscaler.errors import SpotrainError
from autoscaler.home import fleet_dir
from cloud_providers.remote.tls import fingerprint

CERT_FILE = "agent-tls.crt"
KEY_FILE = "agent-tls.key"
COMMON_NAME = "spotrain-controller"
VALID_DAYS = 3650


@dataclasses.dataclass(frozen=True)
class AgentCert:
    cert_path: Path
    key_path: Path
    pem: str

    @property
    def sha256(self) -> str:
        return fingerprint(self.pem)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _names(hosts: Sequence[str]) -> list[object]:
    from cryptography import x509

    names: list[object] = [x509.DNSName(COMMON_NAME)]
    for host in hosts:
        if not host or host in ("0.0.0.0", "::"):
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _generate(hosts: Sequence[str]) -> tuple[bytes, bytes]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise SpotrainError("--executor remote serves its agents over TLS, which needs the cryptography package: "
                            "pip install 'spotrain[aws]' (or [gcp])") from None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def ensure_agent_cert(hosts: Sequence[str] = (), *, root: Path | None = None) -> AgentCert:
    """This controller's agent certificate, made (mode 0600) on first use. ``hosts``: names and
    addresses written into a new certificate (the agents do not check them: they pin the certificate)."""
    root = root or fleet_dir()
    cert_path, key_path = root / CERT_FILE, root / KEY_FILE
    # The controllers of a fleet may start together: one makes the pair, under a lock, the others read it.
    lock = os.open(root / "agent-tls.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cert_path.exists() and key_path.exists()):
            cert_pem, key_pem = _generate(hosts)
            _write_private(key_path, key_pem)
            _write_private(cert_path, cert_pem)
    finally:
        os.close(lock)
    for path in (cert_path, key_path):
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
    pem = cert_path.read_text()
    try:
        fingerprint(pem)
    except ValueError:
        raise SpotrainError(f"{cert_path} is not a PEM certificate: delete it and {key_path} to make new ones") from None
    return AgentCert(cert_path, key_path, pem)


__all__ = ["AgentCert", "ensure_agent_cert"]
