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
    /// The CA's key, kept to sign more client certificates (kubelets).
    ca_key_pem: String,
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

/// Address at which node VMs reach the apiserver (a QEMU guest forward, see
/// `node_vm`): the serving certificate must name it.
pub const GUEST_APISERVER_IP: &str = "10.0.2.100";

fn ca_params() -> anyhow::Result<CertificateParams> {
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
    Ok(ca_params)
}

/// A client certificate for `cn` in `orgs` (RBAC groups), signed by `issuer`.
fn client_cert(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    orgs: &[&str],
) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    for org in orgs {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *org);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    /// Signs a client certificate (PEM cert, PEM key) for `cn` in the groups
    /// `orgs`, e.g. `system:node:<name>` in `system:nodes` for a kubelet.
    pub fn sign_client(&self, cn: &str, orgs: &[&str]) -> anyhow::Result<(String, String)> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let issuer = Issuer::new(ca_params()?, ca_key);
        client_cert(&issuer, cn, orgs)
    }

    pub fn generate() -> anyhow::Result<Self> {
        let ca_key = KeyPair::generate()?;
        let ca_params = ca_params()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            GUEST_APISERVER_IP.to_string(),
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

        let (admin_cert_pem, admin_key_pem) = client_cert(&issuer, ADMIN_CN, &[ADMIN_GROUP])?;

        let sa_key = KeyPair::generate()?;

        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            admin_cert_pem,
            admin_key_pem,
            sa_key_pem: sa_key.serialize_pem(),
            sa_pub_pem: sa_key.public_key_pem(),
            ca_key_pem,
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

/// How the user of a [`Kubeconfig`] authenticates.
pub enum KubeconfigAuth<'a> {
    /// A client certificate and its key (paths).
    Cert { cert: &'a str, key: &'a str },
    /// A bearer token.
    Token(&'a str),
}

/// A kubeconfig of one cluster and one user, both in one context `headroom`.
pub struct Kubeconfig<'a> {
    /// The apiserver's URL.
    pub server: &'a str,
    /// Path of the CA that signed the apiserver's certificate.
    pub ca: &'a str,
    pub user: &'a str,
    pub auth: KubeconfigAuth<'a>,
    /// The context's default namespace, if any.
    pub namespace: Option<&'a str>,
}

impl Kubeconfig<'_> {
    pub fn yaml(&self) -> String {
        let auth = match self.auth {
            KubeconfigAuth::Cert { cert, key } => {
                format!("    client-certificate: {cert}\n    client-key: {key}\n")
            }
            KubeconfigAuth::Token(token) => format!("    token: {token}\n"),
        };
        let namespace = self
            .namespace
            .map(|ns| format!("    namespace: {ns}\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: headroom
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
{auth}contexts:
- name: headroom
  context:
    cluster: headroom
    user: {user}
{namespace}current-context: headroom
",
            server = self.server,
            ca = self.ca,
            user = self.user,
        )
    }
}

#[cfg(test)]
mod kubeconfig_tests {
    use super::*;

    /// The text the guest kubelet's kubeconfig had before it was built here.
    #[test]
    fn cert_kubeconfig_without_namespace_is_the_guest_format() {
        let k = Kubeconfig {
            server: "https://10.0.2.2:6443",
            ca: "/etc/kubernetes/ca.crt",
            user: "system:node:n1",
            auth: KubeconfigAuth::Cert {
                cert: "/etc/kubernetes/kubelet.crt",
                key: "/etc/kubernetes/kubelet.key",
            },
            namespace: None,
        };
        assert_eq!(
            k.yaml(),
            "apiVersion: v1
kind: Config
clusters:
- name: headroom
  cluster:
    server: https://10.0.2.2:6443
    certificate-authority: /etc/kubernetes/ca.crt
users:
- name: system:node:n1
  user:
    client-certificate: /etc/kubernetes/kubelet.crt
    client-key: /etc/kubernetes/kubelet.key
contexts:
- name: headroom
  context:
    cluster: headroom
    user: system:node:n1
current-context: headroom
"
        );
    }

    #[test]
    fn token_kubeconfig_with_namespace() {
        let k = Kubeconfig {
            server: "https://127.0.0.1:1",
            ca: "/ca.pem",
            user: "agent",
            auth: KubeconfigAuth::Token("t0k"),
            namespace: Some("default"),
        };
        let y = k.yaml();
        assert!(y.contains("  user:\n    token: t0k\ncontexts:"), "{y}");
        assert!(
            y.contains("    user: agent\n    namespace: default\ncurrent-context: headroom\n"),
            "{y}"
        );
    }
}
