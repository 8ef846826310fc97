//! The dashboard: the owner's page at `/` on the daemon's loopback listener, its JSON API under
//! `/api` and its event stream at `/api/events` (`feed`). The page and its assets are compiled
//! into the binary; nothing is fetched from anywhere else.
//!
//! Who may use it is the engine's decision (`room_engine::console`): `room dashboard` (the
//! owner console) mints a one-time login code, `/login` exchanges it for a session cookie
//! (HttpOnly, SameSite=Strict, named for this listener's port) and hands the page its key in
//! the redirect's fragment, which never reaches a server. Every API request presents both: the
//! cookie, and the key in `x-room-csrf` (a header no cross-site page can set without a
//! preflight this listener never grants; the event stream, which a browser opens without
//! headers, in its query). A browser sends the cookie to every server on this host whatever
//! its port, so the cookie alone is worth nothing. A request that acts also names an `Origin`
//! of this listener. Host and Origin are pinned as on `/mcp`. The page reaches owner operations through [`OPS`]
//! only: none mints or shows a credential, and every answer passes the egress redactor and
//! [`withhold_credentials`], so an agent's token never reaches the page.

pub mod feed;

use crate::daemon::http::{allowed_hosts, allowed_origins, check_host_origin};
use crate::wire::Response;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use room_core::{Code, Refusal};
use room_engine::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

const PAGE: &str = include_str!("../../dashboard/index.html");
const APP_JS: &str = include_str!("../../dashboard/app.js");
const APP_CSS: &str = include_str!("../../dashboard/app.css");

/// The session cookie's name, before the listener's port (`room_session_7878`): two daemons
/// on one host keep a cookie each.
pub const COOKIE_PREFIX: &str = "room_session_";
/// The header carrying the session's page key.
pub const KEY_HEADER: &str = "x-room-csrf";
/// The event stream's query parameter carrying the page key.
pub const KEY_QUERY: &str = "k";

/// What the page may call: the owner's views and the actions the page offers. Nothing that
/// mints or prints a credential (`agent_enroll`, `agent_rotate`, `agent_delegate`): those
/// stay on the owner console.
pub const OPS: &[&str] = &[
    // views
    "ping",
    "rooms",
    "room_log",
    "room_audit",
    "room_members",
    "agent_list",
    "project_list",
    "wakes_list",
    "wakes_show",
    "wakes_obligations",
    "sessions_list",
    "sessions_show",
    "adapters_list",
    "routes_list",
    "owner_task_show",
    "owner_task_check",
    "stops_list",
    "workers_list",
    "collab_list",
    "collab_status",
    "collab_profile",
    "collab_artifacts",
    "collab_artifact",
    "search",
    // actions
    "agent_revoke",
    "room_create",
    "collab_start",
    "collab_decide",
    "collab_cancel",
    "collab_rerun",
    "room_cancel",
    "room_resume",
    "room_reconcile",
];

#[derive(Clone)]
pub(crate) struct Dash {
    engine: Arc<Engine>,
    hosts: Arc<[String]>,
    origins: Arc<[String]>,
    feed: Arc<feed::Feed>,
    cookie: Arc<str>,
}

/// The dashboard's routes on the listener at `port`.
pub fn routes(engine: Arc<Engine>, port: u16) -> Router {
    let dash = Dash {
        feed: feed::Feed::new(engine.clone()),
        engine,
        hosts: allowed_hosts(port).into(),
        origins: allowed_origins(port).into(),
        cookie: format!("{COOKIE_PREFIX}{port}").into(),
    };
    Router::new()
        .route("/", get(page))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/login", get(login))
        .route("/api/session", get(session))
        .route("/api/call", post(call))
        .route("/api/logout", post(logout))
        .route("/api/events", get(feed::events))
        .route("/api/{*rest}", get(unknown).post(unknown))
        .with_state(dash)
}

/// What every answer of the dashboard carries: no caching, no sniffing, no framing, no
/// referrer (a login link's code must not leave in one), and a page that runs its own
/// script only.
fn hardened(mut r: HttpResponse) -> HttpResponse {
    let h = r.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(h, "cache-control", "no-store");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "no-referrer");
    set(h, "x-frame-options", "DENY");
    set(
        h,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    );
    r
}

fn refused(status: StatusCode, r: Refusal) -> HttpResponse {
    hardened((status, axum::Json(Response::refused(r))).into_response())
}

/// A refusal's HTTP status on the dashboard.
fn status_of(r: &Refusal) -> StatusCode {
    match r.code {
        Code::CredentialInvalid | Code::CredentialRevoked => StatusCode::UNAUTHORIZED,
        Code::CsrfInvalid => StatusCode::FORBIDDEN,
        Code::StorageFailed => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::OK,
    }
}

/// What a request to the API must show beyond its session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Reading.
    Read,
    /// Acting: an `Origin` of this listener too.
    Act,
}

impl Dash {
    /// Host and Origin pinned (403), then the session's cookie (401), an acting request's
    /// Origin (403), and the page key with it (403).
    fn admit(
        &self,
        headers: &HeaderMap,
        key: Option<&str>,
        ask: Ask,
    ) -> Result<room_engine::Owner, Box<HttpResponse>> {
        check_host_origin(&self.hosts, &self.origins, headers)
            .map_err(|r| Box::new(refused(StatusCode::FORBIDDEN, r)))?;
        let secret = cookie(headers, &self.cookie);
        let key = key.or_else(|| headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()));
        let owner = self.engine.console_owner(secret.as_deref(), key);
        // no session at all is told first, whatever else the request lacks
        if let Err(r) = &owner
            && r.code != Code::CsrfInvalid
        {
            return Err(Box::new(refused(status_of(r), r.clone())));
        }
        if ask == Ask::Act && headers.get(header::ORIGIN).is_none() {
            return Err(Box::new(refused(
                StatusCode::FORBIDDEN,
                Refusal::new(Code::CsrfInvalid, "a request that acts names its origin")
                    .detail(json!({"field": "origin"})),
            )));
        }
        owner.map_err(|r| Box::new(refused(status_of(&r), r)))
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

async fn page(State(d): State<Dash>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = check_host_origin(&d.hosts, &d.origins, &headers) {
        return refused(StatusCode::FORBIDDEN, r);
    }
    hardened(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response())
}

async fn app_js() -> HttpResponse {
    hardened(
        (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            APP_JS,
        )
            .into_response(),
    )
}

async fn app_css() -> HttpResponse {
    hardened(([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response())
}

async fn unknown(State(d): State<Dash>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = d.admit(&headers, None, Ask::Read) {
        return *r;
    }
    refused(
        StatusCode::NOT_FOUND,
        Refusal::new(Code::NotFound, "no such dashboard API route")
            .hint("the API is /api/session, /api/call, /api/logout and /api/events"),
    )
}

#[derive(Deserialize)]
struct LoginQuery {
    code: Option<String>,
}

/// `GET /login?code=…`: the one-time code for a session cookie, then the page.
async fn login(
    State(d): State<Dash>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> HttpResponse {
    if let Err(r) = check_host_origin(&d.hosts, &d.origins, &headers) {
        return refused(StatusCode::FORBIDDEN, r);
    }
    let s = match d.engine.console_login(q.code.as_deref().unwrap_or("")) {
        Ok(s) => s,
        Err(r) => {
            let body = format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Room: login refused</title></head>\
                 <body><main><h1>Login refused</h1><p>{}.</p><p>Run <code>room dashboard</code> for a new link; each link works once.</p></main></body></html>",
                html_escape(&r.message)
            );
            return hardened(
                (
                    StatusCode::UNAUTHORIZED,
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    body,
                )
                    .into_response(),
            );
        }
    };
    let max_age = room_engine::console::SESSION_TTL_MS / 1000;
    let set = format!(
        "{}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}",
        d.cookie, s.secret
    );
    // the page key in the fragment: the browser keeps it from every server, this one too
    let mut r = (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, format!("/#k={}", s.key))],
    )
        .into_response();
    match HeaderValue::from_str(&set) {
        Ok(v) => {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        Err(e) => {
            return refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                Refusal::storage(format!("session cookie: {e}")),
            );
        }
    }
    hardened(r)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `GET /api/session`: whether the page's session stands, until when, and what it may call.
async fn session(State(d): State<Dash>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = d.admit(&headers, None, Ask::Read) {
        return *r;
    }
    let secret = cookie(&headers, &d.cookie);
    let key = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok());
    match d.engine.console_session(secret.as_deref(), key) {
        Ok(expires_ms) => hardened(
            axum::Json(Response::ok(json!({
                "owner": true,
                "expires_ms": expires_ms,
                "instance": d.engine.state().instance_id,
                "version": env!("CARGO_PKG_VERSION"),
                "ops": OPS,
            })))
            .into_response(),
        ),
        Err(r) => refused(status_of(&r), r),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    op: String,
    #[serde(default)]
    args: Value,
}

/// `POST /api/call {op, args}`: one owner operation of [`OPS`], answered as `/v1/call` answers.
async fn call(State(d): State<Dash>, headers: HeaderMap, body: Bytes) -> HttpResponse {
    let owner = match d.admit(&headers, None, Ask::Act) {
        Ok(o) => o,
        Err(r) => return *r,
    };
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json_body {
        return refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::invalid("content-type", "must be application/json"),
        );
    }
    let c: CallBody = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            let field = if e.to_string().contains("`op`") || e.to_string().contains("field `") {
                e.to_string()
                    .split('`')
                    .nth(1)
                    .unwrap_or("body")
                    .to_string()
            } else {
                "body".to_string()
            };
            return refused(
                StatusCode::BAD_REQUEST,
                Refusal::invalid(&field, format!("not a call: {e}")),
            );
        }
    };
    if !OPS.contains(&c.op.as_str()) {
        return refused(
            StatusCode::BAD_REQUEST,
            Refusal::invalid(
                "op",
                format!("{:?} is not offered on the dashboard", c.op),
            )
            .hint("credentials are enrolled, rotated and delegated on the owner console (room agent …)"),
        );
    }
    let engine = d.engine.clone();
    let resp = tokio::task::spawn_blocking(move || {
        crate::dispatch::owner_call(&engine, &owner, &c.op, c.args)
    })
    .await
    .unwrap_or_else(|e| Response::refused(Refusal::storage(format!("call failed: {e}"))));
    // a call that panicked is the daemon's failure, not an answer
    let resp = withhold_credentials(resp);
    let status = resp.refusal.as_ref().map_or(StatusCode::OK, status_of);
    hardened((status, axum::Json(resp)).into_response())
}

/// `POST /api/logout`: ends this browser's session.
async fn logout(State(d): State<Dash>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = d.admit(&headers, None, Ask::Act) {
        return *r;
    }
    if let Some(s) = cookie(&headers, &d.cookie) {
        d.engine.console_logout(&s);
    }
    let mut r = axum::Json(Response::ok(json!({"logged_out": true}))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        d.cookie
    )) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    hardened(r)
}

/// The prefixes of Room's credentials: an agent's, a worker's, the scheduler's.
const CREDENTIAL_PREFIXES: &[&str] = &["room_tok_", "room_wrk_", "room_sch_"];

/// Any credential-shaped text (a prefix and 16 or more hex digits) in an answer is replaced:
/// no operation the page may call returns one, and should one ever quote one (an agent that
/// pasted its token into a message), the page still never holds it.
pub fn withhold_credentials(mut resp: Response) -> Response {
    fn scrub(v: &mut Value) {
        match v {
            Value::String(s) if CREDENTIAL_PREFIXES.iter().any(|p| s.contains(p)) => {
                *s = scrub_text(s);
            }
            Value::Array(a) => a.iter_mut().for_each(scrub),
            Value::Object(m) => m.values_mut().for_each(scrub),
            _ => {}
        }
    }
    if let Some(v) = resp.result.as_mut() {
        scrub(v);
    }
    if let Some(r) = resp.refusal.as_mut() {
        r.message = scrub_text(&r.message).into();
        scrub(&mut r.detail);
    }
    resp
}

/// `text` with every credential in it replaced by `[credential withheld]`.
pub fn scrub_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for p in CREDENTIAL_PREFIXES {
            if rest.starts_with(p) {
                let hex = rest[p.len()..]
                    .bytes()
                    .take_while(u8::is_ascii_hexdigit)
                    .count();
                if hex >= 16 {
                    out.push_str("[credential withheld]");
                    rest = &rest[p.len() + hex..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().expect("rest is not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_withheld_and_nothing_else_changes() {
        let t = "room_tok_0123456789abcdef0123 and room_wrk_ab (short) and é room_sch_ffffffffffffffffff!";
        assert_eq!(
            scrub_text(t),
            "[credential withheld] and room_wrk_ab (short) and é [credential withheld]!"
        );
        assert_eq!(scrub_text("plain"), "plain");
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; room_session_7=abc; room_session_78=xyz"),
        );
        assert_eq!(cookie(&h, "room_session_78").as_deref(), Some("xyz"));
        assert_eq!(cookie(&h, "b"), None);
    }
}
