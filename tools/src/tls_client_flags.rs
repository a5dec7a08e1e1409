//! The TLS flags of the commands that connect to a broker as a Kafka client (`kafka-bench`,
//! `cluster status`). Global, so that a command with subcommands (`cluster`) takes them before
//! or after its subcommand, and from its config-file table.

use std::path::PathBuf;

use frontend::tls::ClientFiles;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsClientFlags {
    /// Connect over TLS, trusting the CAs in this PEM file (the broker's certificate must name
    /// the host connected to).
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to a broker requiring one (mTLS); needs --tls-key
    /// and --tls-ca.
    #[arg(long, global = true, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsClientFlags {
    /// The files to connect with, or None for plaintext.
    pub fn files(&self) -> Option<ClientFiles> {
        self.tls_ca.clone().map(|ca| ClientFiles {
            ca,
            identity: self.tls_cert.clone().zip(self.tls_key.clone()),
        })
    }
}
