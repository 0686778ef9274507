//! Throwaway PKI for a test control plane: one CA that signs the apiserver's
//! serving certificate and the admin client certificate, plus the
//! ServiceAccount token signing key. Everything is ECDSA P-256 (rcgen's
//! default), which kube-apiserver, etcd-less clients and rustls all accept.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM material, kept in memory and written to disk by [`Pki::write_to`].
pub struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    /// PKCS#8 private key that signs ServiceAccount tokens.
    pub sa_key_pem: String,
    /// Its public key (PKIX), what the apiserver verifies tokens with.
    pub sa_pub_pem: String,
}

/// Paths of the files written by [`Pki::write_to`].
pub struct PkiFiles {
    pub ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// Subject of the admin identity: `system:masters` is bound to cluster-admin
/// by the apiserver's bootstrap RBAC policy.
pub const ADMIN_CN: &str = "headroom-admin";
pub const ADMIN_GROUP: &str = "system:masters";

impl Pki {
    pub fn generate() -> anyhow::Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "headroom-test-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "10.96.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, ADMIN_CN);
        admin
            .distinguished_name
            .push(DnType::OrganizationName, ADMIN_GROUP);
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa_key = KeyPair::generate()?;

        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            sa_key_pem: sa_key.serialize_pem(),
            sa_pub_pem: sa_key.public_key_pem(),
        })
    }

    pub fn write_to(&self, dir: &Path) -> anyhow::Result<PkiFiles> {
        let files = PkiFiles {
            ca: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        };
        for (path, pem) in [
            (&files.ca, &self.ca_pem),
            (&files.serving_cert, &self.serving_cert_pem),
            (&files.serving_key, &self.serving_key_pem),
            (&files.admin_cert, &self.admin_cert_pem),
            (&files.admin_key, &self.admin_key_pem),
            (&files.sa_key, &self.sa_key_pem),
            (&files.sa_pub, &self.sa_pub_pem),
        ] {
            std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(files)
    }
}
