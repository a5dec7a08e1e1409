//! The principal of a client certificate, as Kafka's default principal builder writes it:
//! `User:` and the subject in RFC 2253 form, the way Java's `X500Principal.getName()` prints it
//! (last RDN first, no spaces, `CN=alice,OU=eng,O=Acme`), so that ACLs written for Kafka match.

use rustls_pki_types::CertificateDer;
use x509_parser::asn1_rs::{Any, Class, Tag};
use x509_parser::prelude::*;

use crate::session::Principal;

/// Attribute types Java prints by keyword in RFC 2253 form; any other type is printed as its
/// dotted OID with the value's DER encoding in hex (`1.2.840.113549.1.9.1=#16...`).
const KEYWORDS: &[(&str, &str)] = &[
    ("2.5.4.3", "CN"),
    ("2.5.4.6", "C"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.9", "STREET"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

/// `User:<subject DN>` of a certificate (the client's, verified by then).
pub fn subject_principal(cert: &CertificateDer<'_>) -> Result<Principal, String> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref())
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    Ok(Principal::user(rfc2253(parsed.subject())))
}

fn rfc2253(name: &X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(|atv| attribute(atv.attr_type().to_id_string(), atv.attr_value()))
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    // RFC 2253 writes the last RDN of the sequence first.
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn attribute(oid: String, value: &Any<'_>) -> String {
    let keyword = KEYWORDS.iter().find(|(o, _)| *o == oid).map(|(_, k)| *k);
    match (keyword, text(value)) {
        (Some(k), Some(s)) => format!("{k}={}", escape(&s)),
        (k, _) => format!("{}=#{}", k.unwrap_or(&oid), hex(&der(value))),
    }
}

/// The value as text, for the string types a name uses.
fn text(v: &Any<'_>) -> Option<String> {
    if v.header.class() != Class::Universal {
        return None;
    }
    let data = v.data;
    match v.header.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(data).ok().map(str::to_string)
        }
        // Teletex as Latin-1, as most readers do.
        Tag::T61String => Some(data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString => {
            if !data.len().is_multiple_of(2) {
                return None;
            }
            let units: Vec<u16> = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// RFC 2253 escaping, as Java applies it: the special characters anywhere, a leading `#` or
/// space and a trailing space.
fn escape(s: &str) -> String {
    let n = s.chars().count();
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        let special = matches!(c, ',' | '=' | '+' | '<' | '>' | ';' | '"' | '\\')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == n && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The value's DER encoding (identifier, length, contents).
fn der(v: &Any<'_>) -> Vec<u8> {
    let class = v.header.class() as u8;
    let constructed = u8::from(v.header.is_constructed());
    let tag = v.header.tag().0;
    let mut out = Vec::with_capacity(v.data.len() + 8);
    if tag < 31 {
        out.push(class << 6 | constructed << 5 | tag as u8);
    } else {
        out.push(class << 6 | constructed << 5 | 31);
        let mut groups = Vec::new();
        let mut t = tag;
        loop {
            groups.push((t & 0x7f) as u8);
            t >>= 7;
            if t == 0 {
                break;
            }
        }
        for (i, g) in groups.iter().enumerate().rev() {
            out.push(if i == 0 { *g } else { g | 0x80 });
        }
    }
    let len = v.data.len();
    if len < 128 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(v.data);
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_rfc_2253_says() {
        assert_eq!(escape("alice"), "alice");
        assert_eq!(escape("Smith, John"), "Smith\\, John");
        assert_eq!(escape("#1 a+b "), "\\#1 a\\+b\\ ");
        assert_eq!(escape(" x=y;"), "\\ x\\=y\\;");
    }
}
