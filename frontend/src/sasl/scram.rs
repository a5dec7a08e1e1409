//! SCRAM (RFC 5802, with SHA-256 and SHA-512 as RFC 7677 and Kafka use them): the stored form
//! of a password (salt, iterations, StoredKey, ServerKey: never the password) and the server's
//! side of the exchange.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::AuthError;

/// The SCRAM hashes Kafka knows, by the numbers its AlterUserScramCredentials request uses (and
/// the credential records store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256 = 1,
    Sha512 = 2,
}

/// Kafka's bounds on a credential's iterations (its ScramMechanism.minIterations and the
/// largest it accepts).
pub const MIN_ITERATIONS: u32 = 4096;
pub const MAX_ITERATIONS: u32 = 16384;

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(s: &str) -> Option<ScramMechanism> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }

    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn from_code(c: i8) -> Option<ScramMechanism> {
        Self::ALL.into_iter().find(|m| m.code() == c)
    }

    pub(crate) fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    pub(crate) fn hmac(self, key: &[u8], msg: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        match self {
            ScramMechanism::Sha256 => match Hmac::<Sha256>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(msg);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            ScramMechanism::Sha512 => match Hmac::<Sha512>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(msg);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    /// SaltedPassword := Hi(password, salt, i) (PBKDF2 with this HMAC).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec()
            }
            ScramMechanism::Sha512 => {
                pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
            }
        }
    }
}

/// What is kept of a password: enough to check a SCRAM proof (or a PLAIN password, derived the
/// same way), not enough to log in with.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    // Never print the keys, even in a debug log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential of a SaltedPassword (what AlterUserScramCredentials carries).
    pub fn from_salted(m: ScramMechanism, salt: Vec<u8>, iterations: u32, salted: &[u8]) -> Self {
        let client_key = m.hmac(salted, b"Client Key");
        ScramCredential {
            salt,
            iterations,
            stored_key: m.hash(&client_key),
            server_key: m.hmac(salted, b"Server Key"),
        }
    }

    /// The credential of a password, with a fresh random salt.
    pub fn new(m: ScramMechanism, password: &[u8], iterations: u32) -> Result<Self, AuthError> {
        let salt = super::random_bytes(32)?;
        let salted = m.salted_password(password, &salt, iterations);
        Ok(Self::from_salted(m, salt, iterations, &salted))
    }

    /// Whether `password` is the one this credential was made from (PLAIN), compared in
    /// constant time.
    pub fn check_password(&self, m: ScramMechanism, password: &[u8]) -> bool {
        let salted = m.salted_password(password, &self.salt, self.iterations);
        let stored = m.hash(&m.hmac(&salted, b"Client Key"));
        bool::from(stored.ct_eq(&self.stored_key))
    }
}

/// The made-up credential of a user nobody added: salt and keys from this process's secret, so
/// that the same name always meets the same salt and no password matches.
pub fn decoy(m: ScramMechanism, secret: &[u8], user: &str) -> ScramCredential {
    let mut salt = m.hmac(secret, format!("salt:{user}").as_bytes());
    salt.truncate(32);
    ScramCredential {
        salt,
        iterations: MIN_ITERATIONS,
        stored_key: m.hmac(secret, format!("stored:{user}").as_bytes()),
        server_key: m.hmac(secret, format!("server:{user}").as_bytes()),
    }
}

/// The server's state between its first message and the client's last.
#[derive(Debug)]
pub struct ScramFirst {
    mech: ScramMechanism,
    pub user: String,
    nonce: String,
    /// The base64 of the GS2 header the client-final's `c=` must repeat.
    channel: String,
    client_first_bare: String,
    server_first: String,
    cred: ScramCredential,
}

impl ScramFirst {
    pub fn mech_name(&self) -> &'static str {
        self.mech.name()
    }
}

/// Undoes SCRAM's escaping of `,` and `=` in a user name (`=2C`, `=3D`); None when malformed.
fn unescape_name(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 3) {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

fn malformed(what: &str) -> AuthError {
    AuthError::Malformed(what.to_string())
}

/// Reads the client-first message and answers it: `lookup` finds the user's credential. An
/// unknown user gets a made-up one (`decoy`), so that the exchange fails only at the proof, as
/// for a wrong password, and does not tell who exists.
pub fn server_first(
    mech: ScramMechanism,
    client_first: &[u8],
    server_nonce: &str,
    lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    decoy: impl FnOnce(&str) -> ScramCredential,
) -> Result<(ScramFirst, Vec<u8>), AuthError> {
    let msg =
        std::str::from_utf8(client_first).map_err(|_| malformed("client-first is not UTF-8"))?;
    // gs2-header: "n," or "y," (no channel binding), then an optional "a=authzid", then ",".
    let (cb, rest) = msg
        .split_once(',')
        .ok_or_else(|| malformed("client-first has no GS2 header"))?;
    if cb.starts_with("p=") {
        return Err(AuthError::Malformed(
            "channel binding is not supported".into(),
        ));
    }
    if cb != "n" && cb != "y" {
        return Err(malformed("client-first GS2 header"));
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("client-first has no message after its GS2 header"))?;
    let gs2_header = &msg[..cb.len() + 1 + authzid.len() + 1];
    let mut attrs = bare.split(',');
    let user = attrs
        .next()
        .and_then(|a| a.strip_prefix("n="))
        .and_then(unescape_name)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| malformed("client-first user name"))?;
    let cnonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','))
        .ok_or_else(|| malformed("client-first nonce"))?;
    // Extensions (Kafka's tokenauth for delegation tokens) are not supported.
    if attrs.next().is_some() {
        return Err(AuthError::Malformed(
            "SCRAM extensions are not supported".into(),
        ));
    }
    if let Some(z) = authzid.strip_prefix("a=") {
        if unescape_name(z).as_deref() != Some(user.as_str()) {
            return Err(AuthError::Malformed(
                "an authorization id other than the user name is not supported".into(),
            ));
        }
    } else if !authzid.is_empty() {
        return Err(malformed("client-first authorization id"));
    }
    let cred = lookup(&user).unwrap_or_else(|| decoy(&user));
    let nonce = format!("{cnonce}{server_nonce}");
    let server_first = format!(
        "r={nonce},s={},i={}",
        B64.encode(&cred.salt),
        cred.iterations
    );
    let out = server_first.clone().into_bytes();
    Ok((
        ScramFirst {
            mech,
            user,
            nonce,
            channel: B64.encode(gs2_header),
            client_first_bare: bare.to_string(),
            server_first,
            cred,
        },
        out,
    ))
}

/// Checks the client-final message's proof; the server-final message when it holds.
pub fn server_final(st: &ScramFirst, client_final: &[u8]) -> Result<Vec<u8>, AuthError> {
    let msg =
        std::str::from_utf8(client_final).map_err(|_| malformed("client-final is not UTF-8"))?;
    let (without_proof, proof) = msg
        .rsplit_once(",p=")
        .ok_or_else(|| malformed("client-final has no proof"))?;
    let mut attrs = without_proof.split(',');
    if attrs.next().and_then(|c| c.strip_prefix("c=")) != Some(st.channel.as_str()) {
        return Err(malformed(
            "client-final channel binding does not match its GS2 header",
        ));
    }
    // Kafka's rule: the nonce must end with the combined one. librdkafka sends its own nonce
    // again in front of it (and Kafka accepts that); the proof covers what was sent either way.
    let nonce_ok = attrs
        .next()
        .and_then(|r| r.strip_prefix("r="))
        .is_some_and(|r| r.ends_with(st.nonce.as_str()));
    if !nonce_ok {
        return Err(malformed("client-final nonce does not match"));
    }
    let proof = B64
        .decode(proof)
        .map_err(|_| malformed("client-final proof is not base64"))?;
    let m = st.mech;
    let auth_message = format!(
        "{},{},{}",
        st.client_first_bare, st.server_first, without_proof
    );
    let signature = m.hmac(&st.cred.stored_key, auth_message.as_bytes());
    if proof.len() != signature.len() {
        return Err(AuthError::BadCredentials);
    }
    let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
    if !bool::from(m.hash(&client_key).ct_eq(&st.cred.stored_key)) {
        return Err(AuthError::BadCredentials);
    }
    let server_sig = m.hmac(&st.cred.server_key, auth_message.as_bytes());
    Ok(format!("v={}", B64.encode(server_sig)).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3: user "user", password "pencil", and the messages it shows.
    #[test]
    fn rfc7677_sha256_exchange() {
        let m = ScramMechanism::Sha256;
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = m.salted_password(b"pencil", &salt, 4096);
        let cred = ScramCredential::from_salted(m, salt, 4096, &salted);
        assert!(cred.check_password(m, b"pencil"));
        assert!(!cred.check_password(m, b"pencil "));
        let (st, first) = server_first(
            m,
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            |u| (u == "user").then(|| cred.clone()),
            |_| panic!("the user exists"),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let with_proof = |p: &str| server_final(&st, format!("c=biws,r={nonce},p={p}").as_bytes());
        let fin = with_proof("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        assert_eq!(
            String::from_utf8(fin).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        // One bit off in the proof: refused as bad credentials.
        let bad = with_proof("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVU=");
        assert!(matches!(bad, Err(AuthError::BadCredentials)), "{bad:?}");
        // librdkafka's form: its nonce again before the combined one (Kafka takes it).
        let rdkafka = server_final(
            &st,
            format!("c=biws,r=rOprNGfwEbeRWgbNEkqO{nonce},p=AAAA").as_bytes(),
        );
        assert!(
            matches!(rdkafka, Err(AuthError::BadCredentials)),
            "{rdkafka:?}"
        );
        // A nonce that does not end with the combined one: refused.
        assert!(server_final(&st, b"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=AAAA").is_err());
    }

    /// A whole exchange with the client side (`ScramClient`), for SHA-512, against a credential
    /// made from the password; an unknown user gets a decoy salt and fails only at the proof.
    #[test]
    fn sha512_client_and_server_agree_and_strangers_fail_at_the_proof() {
        let m = ScramMechanism::Sha512;
        let cred = ScramCredential::new(m, b"s3cret", 4096).unwrap();
        let run = |user: &str, password: &[u8]| {
            let mut client = super::super::scram_client::ScramClient::new(m, user, password)?;
            let (st, sf) = server_first(
                m,
                &client.first(),
                "XYZ",
                |u| (u == "alice").then(|| cred.clone()),
                |u| decoy(m, b"secret", u),
            )?;
            let cf = client.respond(&sf)?;
            let fin = server_final(&st, &cf)?;
            assert!(client.verify(&fin));
            assert!(!client.verify(b"v=AAAA"));
            Ok::<_, AuthError>(())
        };
        run("alice", b"s3cret").unwrap();
        assert!(matches!(
            run("alice", b"wrong"),
            Err(AuthError::BadCredentials)
        ));
        assert!(matches!(
            run("mallory", b"s3cret"),
            Err(AuthError::BadCredentials)
        ));
    }

    #[test]
    fn malformed_client_messages_are_refused_by_name() {
        let m = ScramMechanism::Sha256;
        let cred = ScramCredential::new(m, b"p", 4096).unwrap();
        for bad in [
            &b"n,,n=,r=abc"[..],
            b"p=tls-unique,,n=u,r=abc",
            b"n,,n=u",
            b"n,,n=u,r=abc,ext=1",
            b"n,a=other,n=u,r=abc",
            b"n,,n=bad=name,r=abc",
            b"\xff",
            b"",
        ] {
            let r = server_first(m, bad, "s", |_| Some(cred.clone()), |_| cred.clone());
            assert!(matches!(r, Err(AuthError::Malformed(_))), "{bad:?}: {r:?}");
        }
        assert_eq!(unescape_name("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        let ok = server_first(
            m,
            b"n,a=u,n=u,r=abc",
            "s",
            |_| Some(cred.clone()),
            |_| cred.clone(),
        );
        assert!(ok.is_ok());
    }
}
