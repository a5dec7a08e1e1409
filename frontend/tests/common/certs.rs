//! Certificates for the TLS tests, made with rcgen: a CA, servers for localhost and 127.0.0.1
//! (valid or expired), clients named by a subject, all written as PEM files. Shared by the
//! frontend's tests and the tools' (included by path).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// A certificate authority.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, as PEM, and the certificate's DER.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        p.distinguished_name = dn(&[(DnType::CommonName, name)]);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("ca key");
        let cert = p.self_signed(&key).expect("ca cert");
        Ca { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    pub fn der(&self) -> Vec<u8> {
        self.cert.der().to_vec()
    }

    /// A server certificate for localhost and 127.0.0.1, valid now (or expired since 2001).
    pub fn server(&self, expired: bool) -> Leaf {
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("server params");
        p.distinguished_name = dn(&[(DnType::CommonName, "nvmq test broker")]);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            p.not_before = date_time_ymd(2000, 1, 1);
            p.not_after = date_time_ymd(2001, 1, 1);
        }
        self.sign(p)
    }

    /// A client certificate with this subject (RDNs in the order given).
    pub fn client(&self, subject: &[(DnType, &str)]) -> Leaf {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
        p.distinguished_name = dn(subject);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(p)
    }

    fn sign(&self, p: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("sign");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

fn dn(parts: &[(DnType, &str)]) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    for (t, v) in parts {
        d.push(t.clone(), *v);
    }
    d
}

/// A fresh directory for one test's files.
pub fn dir(base: &Path, name: &str) -> PathBuf {
    let d = base.join(format!("tls-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("test dir");
    d
}

/// Writes `text` to `dir/name`.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}
