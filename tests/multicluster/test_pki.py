"""multicluster.pki: what each certificate says, and what a verifier needs from it."""

from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multicluster import pki


def test_a_ca_signs_leaves_only_by_default_and_may_sign_intermediates_when_asked():
    leaves_only = pki.CertificateAuthority.new("ca").certificate
    constraints = leaves_only.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = leaves_only.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    open_ca = pki.CertificateAuthority.new("ca", path_length=None).certificate
    assert (
        open_ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length is None
    )


def test_an_issued_certificate_is_signed_by_its_ca_for_what_it_was_asked():
    ca = pki.CertificateAuthority.new("ca")
    pair = ca.issue("node", hosts=["example.org", "10.0.0.1", "::1"], server=True, client=True)
    cert = pair.certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.issuer == ca.certificate.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["example.org"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.1", "::1"]
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert pki.public_der(key.public_key()) == pki.public_der(cert.public_key())


def test_a_client_certificate_names_its_user_and_groups_and_has_no_addresses():
    pair = pki.CertificateAuthority.new("ca").issue(
        "jane", organizations=["devs", "ops"], client=True
    )
    cert = pair.certificate
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "jane"
    groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["devs", "ops"]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_certificate_for_no_use_is_refused():
    with pytest.raises(ValueError, match="neither"):
        pki.CertificateAuthority.new("ca").issue("x")


def test_validity_starts_a_little_early_and_ends_as_asked():
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    ca = pki.CertificateAuthority.new("ca", dt.timedelta(days=30), now=now)
    assert ca.certificate.not_valid_before_utc == now - pki.CLOCK_SKEW
    assert ca.certificate.not_valid_after_utc == now + dt.timedelta(days=30)
    leaf = ca.issue("x", dt.timedelta(days=9), server=True, now=now).certificate
    assert leaf.not_valid_after_utc == now + dt.timedelta(days=9)


def test_renewal_is_due_with_a_third_of_the_validity_left():
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    pair = pki.CertificateAuthority.new("ca", now=now).issue(
        "x", dt.timedelta(days=90), server=True, now=now
    )
    lifetime = dt.timedelta(days=90) + pki.CLOCK_SKEW
    end = now + dt.timedelta(days=90)
    assert not pki.needs_renewal(pair, now=end - lifetime / 3 - dt.timedelta(seconds=1))
    assert pki.needs_renewal(pair, now=end - lifetime / 3 + dt.timedelta(seconds=1))


def test_a_loaded_ca_issues_as_the_one_it_was_saved_from(tmp_path):
    ca = pki.CertificateAuthority.new("ca")
    cert_path, key_path = ca.pair.write_to(tmp_path, "ca")
    loaded = pki.CertificateAuthority.load(cert_path, key_path)
    loaded.issue("x", server=True).certificate.verify_directly_issued_by(ca.certificate)


def test_a_ca_with_a_key_of_another_kind_is_refused():
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ValueError, match="ECDSA"):
        pki.CertificateAuthority(pki.KeyPair(pki.CertificateAuthority.new("x").cert_pem, pem))


def test_files_are_replaced_whole_the_key_private_whatever_the_umask(tmp_path):
    pair = pki.CertificateAuthority.new("ca").issue("x", server=True)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    key.write_bytes(b"old")
    key.chmod(0o644)
    previous = os.umask(0)
    try:
        pair.write(cert, key)
    finally:
        os.umask(previous)
    assert key.read_bytes() == pair.key_pem
    assert cert.read_bytes() == pair.cert_pem
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(cert.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]


def test_a_certificate_request_carries_its_subject_and_addresses():
    key = pki.new_key()
    pem = pki.certificate_request(key, pki.name("system:node:n", ["system:nodes"]), ["10.0.0.2"])
    request = x509.load_pem_x509_csr(pem)
    assert request.is_signature_valid
    assert request.subject == pki.name("system:node:n", ["system:nodes"])
    sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.2"]


def test_a_signing_key_pair_holds_a_public_key_and_its_private_key():
    pair = pki.signing_key_pair()
    public = serialization.load_pem_public_key(pair.cert_pem)
    private = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert pki.public_der(public) == pki.public_der(private.public_key())
