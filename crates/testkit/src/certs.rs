//! Certificates for tests and benchmarks of the venue's mutual TLS, made on the spot (rcgen),
//! never committed: an authority ([`Authority`]) and the certificates it signs, written as PEM
//! files into a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority whose files live in `dir` (`<name>-ca.crt`).
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
    dir: PathBuf,
    name: String,
}

impl Authority {
    /// A new self-signed authority named `name`, its certificate written to `dir`.
    pub fn new(dir: &Path, name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key pair");
        let cert = params.self_signed(&key).expect("self-signed authority");
        let authority = Authority {
            cert,
            key,
            dir: dir.to_path_buf(),
            name: name.into(),
        };
        std::fs::write(authority.ca_path(), authority.cert.pem()).expect("write the authority");
        authority
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    /// Where [`Authority::issue`] writes `who`'s certificate and key.
    pub fn paths(&self, who: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{}-{who}.crt", self.name)),
            self.dir.join(format!("{}-{who}.key", self.name)),
        )
    }

    /// Signs a certificate for `who`, valid as server and client, naming `ips` (a node's
    /// advertised address; none for a client); returns (cert path, key path).
    pub fn issue(&self, who: &str, ips: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("IP addresses as names");
        params.distinguished_name.push(DnType::CommonName, who);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key pair");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed by the authority");
        let (cert_path, key_path) = self.paths(who);
        std::fs::write(&cert_path, cert.pem()).expect("write the certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
        (cert_path, key_path)
    }
}
