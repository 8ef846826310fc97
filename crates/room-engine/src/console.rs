//! The owner's browser sessions (the dashboard). The owner console (a Unix socket peer with the
//! owner's uid) mints a one-time login code; a browser exchanges it, once and within
//! [`LOGIN_CODE_TTL_MS`], for a session secret (the daemon sets it as an HttpOnly cookie) and a
//! page key (handed to the page once, in the login redirect's fragment, which the page keeps in
//! its origin's storage and sends with every request). Both are needed: a browser sends the
//! cookie to every server on the same host, whatever its port, so the cookie alone must not
//! stand for the owner; the key is random, never derived from the secret, and never served
//! again. The session then stands for the owner until it expires or is ended. Held in memory
//! only: a daemon restart ends every session, and only digests of the secrets are kept.
//!
//! This is an authority decision, so it lives here: the server turns cookies and headers into
//! the two strings and asks.

use crate::{Engine, Outcome, Owner};
use room_core::{Code, Refusal, sha256_hex};
use std::sync::Mutex;

/// How long a login code may wait for its browser.
pub const LOGIN_CODE_TTL_MS: u64 = 120_000;
/// How long a browser session lasts from its login.
pub const SESSION_TTL_MS: u64 = 12 * 60 * 60 * 1000;
/// Unused login codes kept at most (the oldest is dropped for a new one).
pub const CODES_MAX: usize = 8;
/// Browser sessions kept at most (the oldest is ended for a new one).
pub const SESSIONS_MAX: usize = 16;
/// Bytes of entropy in a code, a session secret and a CSRF token.
const SECRET_BYTES: usize = 32;

/// A login code for one browser.
#[derive(Debug, Clone)]
pub struct LoginCode {
    pub code: String,
    pub expires_ms: u64,
}

/// What a browser holds after its login.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    /// The cookie's value.
    pub secret: String,
    /// The page key: sent back by the page with each request (a header, or the event
    /// stream's query), which neither a cross-site page nor another server on this host can.
    pub key: String,
    pub expires_ms: u64,
}

#[derive(Default)]
pub(crate) struct Consoles {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// (sha256 of the code, expiry), oldest first.
    codes: Vec<(String, u64)>,
    /// Oldest first.
    sessions: Vec<Held1>,
}

struct Held1 {
    secret_sha256: String,
    key_sha256: String,
    expires_ms: u64,
}

impl Consoles {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner
            .lock()
            .expect("console lock is never poisoned: no panics while held")
    }
}

fn login_refused(why: &str) -> Refusal {
    Refusal::new(Code::CredentialInvalid, format!("login code {why}"))
        .hint("run `room dashboard` again for a new link")
}

fn session_refused(why: &str) -> Refusal {
    Refusal::new(Code::CredentialInvalid, format!("browser session {why}"))
        .hint("run `room dashboard` for a login link")
}

impl Engine {
    /// A one-time login code for a browser (the owner's only).
    pub fn console_code(&self, _owner: &Owner) -> LoginCode {
        let code = self.env.entropy.hex(SECRET_BYTES);
        let now = self.now_ms();
        let expires_ms = now + LOGIN_CODE_TTL_MS;
        let mut held = self.consoles.held();
        held.codes.retain(|(_, exp)| *exp > now);
        if held.codes.len() >= CODES_MAX {
            held.codes.remove(0);
        }
        held.codes.push((sha256_hex(code.as_bytes()), expires_ms));
        LoginCode { code, expires_ms }
    }

    /// Exchange a login code, once and before it expires, for a browser session.
    pub fn console_login(&self, code: &str) -> Outcome<ConsoleSession> {
        let now = self.now_ms();
        let digest = sha256_hex(code.as_bytes());
        let mut held = self.consoles.held();
        let Some(i) = held.codes.iter().position(|(d, _)| *d == digest) else {
            return Err(login_refused("unknown or already used"));
        };
        let (_, exp) = held.codes.remove(i);
        if exp <= now {
            return Err(login_refused("expired"));
        }
        let secret = self.env.entropy.hex(SECRET_BYTES);
        let key = self.env.entropy.hex(SECRET_BYTES);
        let expires_ms = now + SESSION_TTL_MS;
        held.sessions.retain(|s| s.expires_ms > now);
        if held.sessions.len() >= SESSIONS_MAX {
            held.sessions.remove(0);
        }
        held.sessions.push(Held1 {
            secret_sha256: sha256_hex(secret.as_bytes()),
            key_sha256: sha256_hex(key.as_bytes()),
            expires_ms,
        });
        Ok(ConsoleSession {
            secret,
            key,
            expires_ms,
        })
    }

    /// The owner, if `secret` is a live browser session and `key` its page key.
    pub fn console_owner(&self, secret: Option<&str>, key: Option<&str>) -> Outcome<Owner> {
        self.console_session(secret, key)
            .map(|_| Owner { _private: () })
    }

    /// When a live session (its secret and its page key) expires.
    pub fn console_session(&self, secret: Option<&str>, key: Option<&str>) -> Outcome<u64> {
        let Some(secret) = secret else {
            return Err(session_refused("missing: log in first"));
        };
        let now = self.now_ms();
        let digest = sha256_hex(secret.as_bytes());
        let held = self.consoles.held();
        let Some(s) = held.sessions.iter().find(|s| s.secret_sha256 == digest) else {
            return Err(session_refused("unknown or ended"));
        };
        if s.expires_ms <= now {
            return Err(session_refused("expired"));
        }
        if key.map(|k| sha256_hex(k.as_bytes())).as_deref() != Some(s.key_sha256.as_str()) {
            return Err(Refusal::new(
                Code::CsrfInvalid,
                "request without this session's page key",
            )
            .detail(serde_json::json!({"field": "x-room-csrf"}))
            .hint("open the dashboard from its login link again; a request from another site or server is never accepted"));
        }
        Ok(s.expires_ms)
    }

    /// End a browser session (a log-out); ending one that is gone is no error.
    pub fn console_logout(&self, secret: &str) {
        let digest = sha256_hex(secret.as_bytes());
        self.consoles
            .held()
            .sessions
            .retain(|s| s.secret_sha256 != digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, Env};
    use room_core::env::{ManualClock, SeededEntropy};
    use room_store::{SqliteBackend, SqliteBackendConfig, statedir};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    /// A login code is good once and only within its time; a session stands for the owner
    /// until it expires or logs out, and acts only with its own CSRF token.
    #[test]
    #[allow(clippy::disallowed_methods)] // a real state dir
    fn login_codes_and_sessions_keep_their_bounds() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let (state, boot) = (root.join("state"), root.join("boot.toml"));
        statedir::init(&state, &boot, "inst").unwrap();
        let clock = Arc::new(ManualClock::new(1_790_000_000_000));
        let s = statedir::validate(&state, &boot).unwrap();
        let env = Env {
            clock: clock.clone(),
            entropy: Arc::new(SeededEntropy::new(7)),
            fs: Arc::new(room_store::fs::RealFs),
            runner: Arc::new(room_core::env::NoRunner),
        };
        let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
        let e = Engine::open(s, env, store, EngineConfig::default()).unwrap();
        let owner = e
            .owner(&crate::Caller::Local(crate::Evidence::UnixPeer {
                uid: e.config().owner_uid,
                pid: 1,
            }))
            .unwrap();
        let advance = |ms: u64| clock.0.fetch_add(ms, Ordering::SeqCst);

        // once
        let code = e.console_code(&owner);
        let s = e.console_login(&code.code).unwrap();
        let again = e.console_login(&code.code).unwrap_err();
        assert_eq!(again.code, Code::CredentialInvalid);
        assert!(again.message.contains("already used"), "{again}");

        // in time only
        let late = e.console_code(&owner);
        advance(LOGIN_CODE_TTL_MS);
        let r = e.console_login(&late.code).unwrap_err();
        assert_eq!(r.code, Code::CredentialInvalid);
        assert!(r.message.contains("expired"), "{r}");

        // the cookie's secret and the page key together, never one alone
        e.console_owner(Some(&s.secret), Some(&s.key)).unwrap();
        for key in [None, Some("nope"), Some(s.secret.as_str())] {
            let r = e.console_owner(Some(&s.secret), key).unwrap_err();
            assert_eq!(r.code, Code::CsrfInvalid, "{key:?}");
        }
        assert_ne!(s.key, s.secret);
        assert_eq!(
            e.console_owner(None, Some(&s.key)).unwrap_err().code,
            Code::CredentialInvalid
        );
        assert_eq!(
            e.console_owner(Some(&s.key), Some(&s.key))
                .unwrap_err()
                .code,
            Code::CredentialInvalid
        );

        // a log-out ends it; an expiry ends the next
        e.console_logout(&s.secret);
        assert_eq!(
            e.console_owner(Some(&s.secret), Some(&s.key))
                .unwrap_err()
                .code,
            Code::CredentialInvalid
        );
        let next = e.console_login(&e.console_code(&owner).code).unwrap();
        advance(SESSION_TTL_MS);
        let r = e
            .console_owner(Some(&next.secret), Some(&next.key))
            .unwrap_err();
        assert!(r.message.contains("expired"), "{r}");

        // bounded: old codes and sessions make room for new ones
        let codes: Vec<_> = (0..CODES_MAX + 2).map(|_| e.console_code(&owner)).collect();
        assert!(
            e.console_login(&codes[0].code).is_err(),
            "the oldest was dropped"
        );
        let newest = e.console_login(&codes[CODES_MAX + 1].code).unwrap();
        let mut sessions = vec![newest];
        for _ in 0..SESSIONS_MAX {
            sessions.push(e.console_login(&e.console_code(&owner).code).unwrap());
        }
        let oldest = &sessions[0];
        assert!(
            e.console_owner(Some(&oldest.secret), Some(&oldest.key))
                .is_err(),
            "the oldest session was ended for the newest"
        );
        let last = sessions.last().unwrap();
        e.console_owner(Some(&last.secret), Some(&last.key))
            .unwrap();
    }
}
