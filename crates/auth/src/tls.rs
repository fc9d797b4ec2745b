//! TLS identities from PEM files, for every rustls endpoint of the venue: the gateway's access
//! listeners ([`server_config`]: the server proves itself, clients stay anonymous) and the
//! links between the venue's own processes ([`mutual_server_config`] and
//! [`mutual_client_config`]: both ends present a certificate signed by the venue's authority).
//!
//! One crypto provider (rustls with ring) and one set of protocol versions (rustls' safe
//! defaults, TLS 1.2 and 1.3) for all of them. Every error names the file and what was wrong
//! with it, under the name the caller's configuration gives the file (`what`).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The certificates of a PEM file, in file order (a chain: the end entity first).
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// The authorities of a PEM file as trust anchors.
pub fn load_roots(path: &Path, what: &str) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, what)? {
        roots
            .add(cert)
            .map_err(|e| format!("{what} {}: not an authority: {e}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server that proves itself with `cert_path`/`key_path` and asks clients for nothing.
pub fn server_config(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, String> {
    let certs = load_certs(cert_path, "tls_cert_path")?;
    let key = load_key(key_path, "tls_key_path")?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key: {e}"))?;
    Ok(Arc::new(config))
}

/// Mutual TLS between the venue's processes: the venue's authority and this process's own
/// certificate chain and key (PEM). In `cluster.toml`, `{id}` in a path is the node's id, so
/// one file serves the three hosts or three nodes on one host. A TOML table; unknown keys are
/// refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The venue's authority: a peer's certificate must be signed by it.
    pub ca_path: PathBuf,
    /// This process's certificate (chain, its own first). A node's names its advertised IP
    /// address (subjectAltName), which is what its clients check.
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl TlsFiles {
    /// The files with `{id}` replaced by `id`.
    pub fn for_node(&self, id: u64) -> TlsFiles {
        let sub = |p: &Path| PathBuf::from(p.to_string_lossy().replace("{id}", &id.to_string()));
        TlsFiles {
            ca_path: sub(&self.ca_path),
            cert_path: sub(&self.cert_path),
            key_path: sub(&self.key_path),
        }
    }

    /// The client side: presents this certificate, trusts servers the authority signed.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        mutual_client_config(self)
    }

    /// The server side: presents this certificate, refuses clients the authority did not
    /// sign.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        mutual_server_config(self)
    }
}

/// A server that proves itself and refuses every client without a certificate signed by the
/// authority in `files.ca_path` (the handshake fails; no byte of the protocol is read).
pub fn mutual_server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let roots = load_roots(&files.ca_path, "ca_path")?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| format!("ca_path {}: {e}", files.ca_path.display()))?;
    let certs = load_certs(&files.cert_path, "cert_path")?;
    let key = load_key(&files.key_path, "key_path")?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| format!("cert_path and key_path: {e}"))?;
    Ok(Arc::new(config))
}

/// A client that presents its certificate and trusts only servers whose certificate the
/// authority in `files.ca_path` signed for the name (or IP address) it dials.
pub fn mutual_client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, String> {
    let roots = load_roots(&files.ca_path, "ca_path")?;
    let certs = load_certs(&files.cert_path, "cert_path")?;
    let key = load_key(&files.key_path, "key_path")?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| format!("cert_path and key_path: {e}"))?;
    Ok(Arc::new(config))
}

/// The subjectAltName entries of a DER certificate: its IP addresses and DNS names, in
/// certificate order. A certificate that does not parse, or has no such extension, names
/// nothing. The caller has verified the certificate (rustls did, in the handshake); this only
/// reads who it names.
pub fn names_in_certificate(der: &[u8]) -> (Vec<std::net::IpAddr>, Vec<String>) {
    use x509_parser::extensions::GeneralName;
    let mut ips = Vec::new();
    let mut dns = Vec::new();
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return (ips, dns);
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return (ips, dns);
    };
    for name in &san.value.general_names {
        match name {
            GeneralName::IPAddress(b) => match b.len() {
                4 => ips.push(std::net::IpAddr::from(<[u8; 4]>::try_from(*b).unwrap())),
                16 => ips.push(std::net::IpAddr::from(<[u8; 16]>::try_from(*b).unwrap())),
                _ => {}
            },
            GeneralName::DNSName(d) => dns.push(d.to_ascii_lowercase()),
            _ => {}
        }
    }
    (ips, dns)
}
