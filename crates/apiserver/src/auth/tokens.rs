//! Who a bearer token belongs to: the server's own token (the administrator, group
//! `system:masters`), tokens of a `--token-auth-file` in kube-apiserver's CSV format (and those
//! the embedded stack gives its components), and ServiceAccount tokens this server issued
//! through the TokenRequest API (`serviceaccounts/<name>/token`): HS256-signed JWTs naming the
//! account and its uid, refused once expired or once the account is gone or remade.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::{digest, hmac};
use serde_json::{Value, json};

use super::policy::{AUTHENTICATED, MASTERS, User};
use crate::access::constant_time_eq;

/// The administrator's name (the holder of the server's token).
pub const ADMIN: &str = "volstack-admin";

/// The issuer named in ServiceAccount tokens.
pub const ISSUER: &str = "https://kubernetes.default.svc";

/// A token and the user it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticToken {
    /// The secret.
    pub token: String,
    /// Its user.
    pub user: User,
}

/// Why a token file could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenFileError {
    /// A line has fewer than three fields.
    #[error("line {line}: expected token,user,uid[,\"group1,group2\"]")]
    Fields {
        /// Its number (from 1).
        line: usize,
    },
    /// A quoted field is not closed.
    #[error("line {line}: unterminated quote")]
    Quote {
        /// Its number (from 1).
        line: usize,
    },
}

/// Splits one CSV line (fields may be double-quoted, `""` inside quotes is a quote).
fn csv_fields(line: &str, number: usize) -> Result<Vec<String>, TokenFileError> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return Err(TokenFileError::Quote { line: number });
    }
    fields.push(field);
    Ok(fields)
}

/// Reads kube-apiserver's `--token-auth-file` format: `token,user,uid,"group1,group2"` per
/// line (groups optional; blank lines and lines starting with `#` skipped). Every user is also
/// in `system:authenticated`.
pub fn parse_token_file(text: &str) -> Result<Vec<StaticToken>, TokenFileError> {
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = csv_fields(line, index + 1)?;
        if fields.len() < 3 || fields[0].is_empty() || fields[1].is_empty() {
            return Err(TokenFileError::Fields { line: index + 1 });
        }
        let mut groups: Vec<String> = fields
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_string());
        }
        tokens.push(StaticToken {
            token: fields[0].clone(),
            user: User {
                name: fields[1].clone(),
                uid: fields[2].clone(),
                groups,
            },
        });
    }
    Ok(tokens)
}

/// A ServiceAccount token's claims, as checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountClaims {
    /// The account's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid when the token was issued.
    pub uid: String,
    /// When the token expires (Unix seconds).
    pub expires: i64,
}

/// The authenticator.
pub struct Authenticator {
    admin_token: String,
    /// SHA-256 of each static token → its user.
    static_tokens: HashMap<Vec<u8>, User>,
    signing: hmac::Key,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("static_tokens", &self.static_tokens.len())
            .finish_non_exhaustive()
    }
}

/// Who a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A user known without looking anything up.
    User(User),
    /// A ServiceAccount, valid if the account exists with this uid.
    ServiceAccount(AccountClaims),
}

fn hash(token: &str) -> Vec<u8> {
    digest::digest(&digest::SHA256, token.as_bytes())
        .as_ref()
        .to_vec()
}

/// The administrator.
pub fn admin() -> User {
    User {
        name: ADMIN.to_string(),
        uid: String::new(),
        groups: vec![MASTERS.to_string(), AUTHENTICATED.to_string()],
    }
}

impl Authenticator {
    /// An authenticator for the server's `admin_token`, `static_tokens` and ServiceAccount
    /// tokens signed with `signing_secret`.
    pub fn new(admin_token: &str, static_tokens: &[StaticToken], signing_secret: &[u8]) -> Self {
        Authenticator {
            admin_token: admin_token.to_string(),
            static_tokens: static_tokens
                .iter()
                .map(|t| (hash(&t.token), t.user.clone()))
                .collect(),
            signing: hmac::Key::new(hmac::HMAC_SHA256, signing_secret),
        }
    }

    /// Whether `token` is the server's own (compared in constant time).
    pub fn is_admin(&self, token: &str) -> bool {
        !token.is_empty() && constant_time_eq(token.as_bytes(), self.admin_token.as_bytes())
    }

    /// Who `token` is, if anyone (a ServiceAccount token's account is checked by the caller).
    pub fn identify(&self, token: &str, now: i64) -> Option<Identity> {
        if token.is_empty() {
            return None;
        }
        if self.is_admin(token) {
            return Some(Identity::User(admin()));
        }
        if let Some(user) = self.static_tokens.get(&hash(token)) {
            return Some(Identity::User(user.clone()));
        }
        self.verify(token, now).map(Identity::ServiceAccount)
    }

    /// Issues a token for the ServiceAccount `namespace/name` (uid `uid`) valid until
    /// `expires` (Unix seconds), for `audiences`.
    pub fn issue(&self, claims: &AccountClaims, now: i64, audiences: &[String]) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = json!({
            "iss": ISSUER,
            "sub": super::policy::service_account_name(&claims.namespace, &claims.name),
            "aud": audiences,
            "iat": now,
            "nbf": now,
            "exp": claims.expires,
            "kubernetes.io": {
                "namespace": claims.namespace,
                "serviceaccount": {"name": claims.name, "uid": claims.uid},
            },
        });
        let payload = URL_SAFE_NO_PAD.encode(body.to_string());
        let signed = format!("{header}.{payload}");
        let signature = hmac::sign(&self.signing, signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }

    /// The claims of a token this server signed and that has not expired.
    fn verify(&self, token: &str, now: i64) -> Option<AccountClaims> {
        let (signed, signature) = token.rsplit_once('.')?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        hmac::verify(&self.signing, signed.as_bytes(), &signature).ok()?;
        let (_, payload) = signed.split_once('.')?;
        let body: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
        let account = &body["kubernetes.io"];
        let claims = AccountClaims {
            namespace: account["namespace"].as_str()?.to_string(),
            name: account["serviceaccount"]["name"].as_str()?.to_string(),
            uid: account["serviceaccount"]["uid"].as_str()?.to_string(),
            expires: body["exp"].as_i64()?,
        };
        (claims.expires > now).then_some(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_file_reads_as_kube_apiservers() {
        let text = "# comment\n\nadmintoken,admin,admin-uid,\"system:masters\"\nplain,bob,b1\nq,\"carol \"\"c\"\"\",c1,\"a, b\"\n";
        let tokens = parse_token_file(text).unwrap_or_default();
        let summary: Vec<(String, String, Vec<String>)> = tokens
            .iter()
            .map(|t| (t.token.clone(), t.user.name.clone(), t.user.groups.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "admintoken".into(),
                    "admin".into(),
                    vec!["system:masters".into(), AUTHENTICATED.into()]
                ),
                ("plain".into(), "bob".into(), vec![AUTHENTICATED.into()]),
                (
                    "q".into(),
                    "carol \"c\"".into(),
                    vec!["a".into(), "b".into(), AUTHENTICATED.into()]
                ),
            ]
        );
        assert_eq!(
            parse_token_file("t,u\n"),
            Err(TokenFileError::Fields { line: 1 })
        );
        assert_eq!(
            parse_token_file("ok,u,1\nt,\"u,1\n"),
            Err(TokenFileError::Quote { line: 2 })
        );
    }

    #[test]
    fn tokens_name_their_holders_and_service_account_tokens_expire_and_cannot_be_forged() {
        let file =
            parse_token_file("node-token,system:node:n1,n1,system:nodes\n").unwrap_or_default();
        let auth = Authenticator::new("admin-secret", &file, b"0123456789abcdef0123456789abcdef");
        assert_eq!(
            auth.identify("admin-secret", 0),
            Some(Identity::User(admin()))
        );
        let Some(Identity::User(node)) = auth.identify("node-token", 0) else {
            panic!("the node token is known");
        };
        assert_eq!(node.name, "system:node:n1");
        assert!(node.groups.contains(&"system:nodes".to_string()));
        assert_eq!(auth.identify("", 0), None);
        assert_eq!(auth.identify("admin-secre", 0), None);

        let claims = AccountClaims {
            namespace: "default".into(),
            name: "csi".into(),
            uid: "u-1".into(),
            expires: 1_000,
        };
        let token = auth.issue(&claims, 100, &[]);
        assert_eq!(
            auth.identify(&token, 999),
            Some(Identity::ServiceAccount(claims.clone()))
        );
        assert_eq!(auth.identify(&token, 1_000), None, "expired");
        // Another server's key, or a changed payload, is refused.
        let other = Authenticator::new("x", &[], b"another key, another server.....");
        assert_eq!(other.identify(&token, 999), None);
        let (signed, signature) = token.rsplit_once('.').unwrap_or_default();
        let (header, _) = signed.split_once('.').unwrap_or_default();
        let forged_body = URL_SAFE_NO_PAD.encode(
            json!({"exp": 5_000, "kubernetes.io": {"namespace": "kube-system", "serviceaccount": {"name": "admin", "uid": "u"}}}).to_string(),
        );
        assert_eq!(
            auth.identify(&format!("{header}.{forged_body}.{signature}"), 999),
            None
        );
    }
}
