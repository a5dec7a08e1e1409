//! `nvmq serve` with TLS: bad files stop the start with an error naming them; with TLS a
//! non-loopback listen needs no --insecure-network; SIGHUP reloads the files (new connections
//! get the new certificate, a reload that fails keeps the old one and says why).

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use frontend::client::Client;
use frontend::tls::client_config;
use kafka_protocol::messages::ApiVersionsRequest;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, ServerName};

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Whether a client trusting only `ca` gets an answer from the broker at `addr`.
fn answers(addr: &str, ca: &crate::certs::Ca) -> bool {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der())).expect("root");
    let config: Arc<_> = client_config(roots, None).expect("client config");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let Ok(mut c) = Client::connect_tls(addr, "t", config, name).await else {
            return false;
        };
        c.call(3, &ApiVersionsRequest::default())
            .await
            .is_ok_and(|r| r.error_code == 0)
    })
}

#[test]
fn bad_tls_files_stop_the_start_naming_the_file() {
    let dir = temp_dir("serve-tls-bad");
    let ca = crate::certs::Ca::new("CA");
    let leaf = ca.server(false);
    let cert = crate::certs::write(&dir, "s.pem", &leaf.cert_pem);
    let key = crate::certs::write(&dir, "s.key", &leaf.key_pem);
    let missing = dir.join("missing.pem");
    let garbage = crate::certs::write(&dir, "garbage.pem", "-----BEGIN CERTIFICATE-----\n!!!\n");
    let no_key = crate::certs::write(&dir, "nokey.pem", &leaf.cert_pem);
    let other_key = crate::certs::write(&dir, "other.key", &ca.server(false).key_pem);
    let cases: [(&Path, &Path, &str); 4] = [
        (&missing, &key, "No such file"),
        (&garbage, &key, "not valid PEM"),
        (&cert, &no_key, "holds no private key"),
        (&cert, &other_key, "was refused"),
    ];
    for (c, k, why) in cases {
        let r = nvmq(&[
            "serve",
            "--device",
            "sim:capacity=64M",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &s(c),
            "--tls-key",
            &s(k),
        ]);
        assert_ne!(r.code, 0, "{r}");
        let named = if why == "holds no private key" || why == "was refused" {
            k
        } else {
            c
        };
        assert!(
            r.stderr.contains(&s(named)) && r.stderr.contains(why),
            "{why}: {r}"
        );
        assert!(
            !r.stderr.contains("PRIVATE KEY-----"),
            "key material in the error: {r}"
        );
    }
    // A key alone, or a client CA without a certificate, is refused by the flags.
    let r = nvmq(&[
        "serve",
        "--device",
        "sim:capacity=64M",
        "--tls-key",
        &s(&key),
    ]);
    assert_ne!(r.code, 0, "{r}");
    assert!(r.stderr.contains("--tls-cert"), "{r}");
}

#[test]
fn tls_allows_a_network_listen_and_sighup_reloads_the_certificate() {
    let dir = temp_dir("serve-tls-reload");
    let (old_ca, new_ca) = (
        crate::certs::Ca::new("old CA"),
        crate::certs::Ca::new("new CA"),
    );
    let leaf = old_ca.server(false);
    let cert = crate::certs::write(&dir, "s.pem", &leaf.cert_pem);
    let key = crate::certs::write(&dir, "s.key", &leaf.key_pem);
    // 0.0.0.0 is not loopback: allowed without --insecure-network because TLS is on.
    let srv = serve_with(
        &[
            "--device",
            "sim:capacity=64M",
            "--listen",
            "0.0.0.0:0",
            "--tls-cert",
            &s(&cert),
            "--tls-key",
            &s(&key),
        ],
        &[("NVMQ_LOG", "info")],
    );
    let port = srv
        .kafka
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .expect("port");
    let addr = format!("127.0.0.1:{port}");
    assert!(answers(&addr, &old_ca));
    assert!(!answers(&addr, &new_ca));

    let renewed = new_ca.server(false);
    std::fs::write(&cert, &renewed.cert_pem).expect("write");
    std::fs::write(&key, &renewed.key_pem).expect("write");
    hangup(&srv);
    assert!(srv.stderr_shows(&["TLS certificate, key and client CA reloaded"]));
    assert!(answers(&addr, &new_ca));
    assert!(!answers(&addr, &old_ca));

    // A reload that fails says why and keeps the certificate in use.
    std::fs::write(&key, "not a key\n").expect("write");
    hangup(&srv);
    assert!(srv.stderr_shows(&["TLS reload failed", &s(&key)]));
    assert!(answers(&addr, &new_ca));
    // The handshakes refused along the way are logged, with the reason and without any key.
    assert!(srv.stderr_shows(&["TLS handshake failed"]));
    for pem in [&leaf.key_pem, &renewed.key_pem] {
        let body = pem.lines().nth(1).expect("a base64 line");
        assert!(!srv.stderr().contains(body), "key material logged");
    }
}

fn hangup(srv: &Serving) {
    let st = std::process::Command::new("kill")
        .args(["-HUP", &srv.child.id().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(st.success());
}
