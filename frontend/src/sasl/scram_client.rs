//! The client's side of SCRAM, for the frontend's own client (`client::Client::login_scram`,
//! tests, benchmarks against a broker that requires SASL).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use subtle::ConstantTimeEq;

use super::scram::ScramMechanism;
use super::{random_bytes, AuthError};

pub struct ScramClient {
    m: ScramMechanism,
    password: Vec<u8>,
    first_bare: String,
    cnonce: String,
    /// The server signature the server-final must carry.
    expect: Vec<u8>,
}

fn bad(what: &str) -> AuthError {
    AuthError::Malformed(what.to_string())
}

impl ScramClient {
    pub fn new(m: ScramMechanism, user: &str, password: &[u8]) -> Result<Self, AuthError> {
        let cnonce = B64.encode(random_bytes(18)?);
        let name = user.replace('=', "=3D").replace(',', "=2C");
        Ok(ScramClient {
            m,
            password: password.to_vec(),
            first_bare: format!("n={name},r={cnonce}"),
            cnonce,
            expect: Vec::new(),
        })
    }

    /// The client-first message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare).into_bytes()
    }

    /// The client-final message answering the server-first one.
    pub fn respond(&mut self, server_first: &[u8]) -> Result<Vec<u8>, AuthError> {
        let sf = std::str::from_utf8(server_first).map_err(|_| bad("server-first"))?;
        let mut attrs = sf.split(',');
        let nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .filter(|n| n.starts_with(&self.cnonce))
            .ok_or_else(|| bad("server-first nonce"))?;
        let salt = attrs
            .next()
            .and_then(|a| a.strip_prefix("s="))
            .and_then(|s| B64.decode(s).ok())
            .ok_or_else(|| bad("server-first salt"))?;
        let iterations: u32 = attrs
            .next()
            .and_then(|a| a.strip_prefix("i="))
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| bad("server-first iterations"))?;
        let m = self.m;
        let salted = m.salted_password(&self.password, &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{sf},{without_proof}", self.first_bare);
        let signature = m.hmac(&m.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        self.expect = m.hmac(&m.hmac(&salted, b"Server Key"), auth.as_bytes());
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Whether the server-final message proves the server knew the credential.
    pub fn verify(&self, server_final: &[u8]) -> bool {
        let sig = std::str::from_utf8(server_final)
            .ok()
            .and_then(|s| s.strip_prefix("v="))
            .and_then(|v| B64.decode(v).ok());
        sig.is_some_and(|s| !self.expect.is_empty() && bool::from(s.ct_eq(&self.expect)))
    }
}
