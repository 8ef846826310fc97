//! `room serve`: take the state dir's lock, open the engine, listen on the Unix socket (mode
//! 0600, peer uid from SO_PEERCRED) and, when asked, on a loopback TCP port. Engine calls are
//! blocking (they fsync), so each runs on tokio's blocking pool.

use crate::dispatch::{self, Transport};
use crate::error::ServerError;
use crate::wire::{REQUEST_BYTES_MAX, Request, Response};
use room_core::{Clock, Code, Entropy, Refusal};
use room_engine::{Engine, EngineConfig, Env, Evidence};
use room_store::fs::RealFs;
use room_store::statedir::{self, StateDir};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How often pending index rows are committed when traffic is light.
const INDEX_FLUSH_MS: u64 = 100;
/// How often the `resolution` sweep looks for claims past their TTL (the engine decides).
const INVARIANT_SWEEP_MS: u64 = 1_000;

/// Engine threads per core by default (see [`engine_threads_default`]).
pub const ENGINE_THREADS_PER_CORE: usize = 4;
/// Most engine threads `room serve --engine-threads` accepts.
pub const ENGINE_THREADS_MAX: usize = 512;

/// Threads that run engine calls (tokio's blocking pool); calls past this many wait for a
/// thread. Engine calls are CPU work plus short fsyncs, so a few threads per core keep the
/// cores and the disk busy; more only add context switches and allocator traffic. Under
/// `room bench swarm` on two cores, 8 threads served about a fifth more calls per second than
/// 64 (and 2 or 4 fewer than 8). A disk with slow fsyncs wants more (`--engine-threads`).
pub fn engine_threads_default() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) * ENGINE_THREADS_PER_CORE
}

/// The daemon's runtime: its threads are named `room-daemon` (the bench reads their CPU time)
/// and at most `engine_threads` of them run engine calls.
pub fn runtime(engine_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("room-daemon")
        .max_blocking_threads(engine_threads.clamp(1, ENGINE_THREADS_MAX))
        .enable_all()
        .build()
}

/// The system clock, for the daemon only; the engine sees it through `Clock`.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// The OS CSPRNG.
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn fill(&self, buf: &mut [u8]) {
        getrandom::fill(buf).expect("the OS random source is available");
    }
}

pub fn real_env() -> Env {
    Env {
        clock: Arc::new(SystemClock),
        entropy: Arc::new(OsEntropy),
        fs: Arc::new(RealFs),
    }
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub state_dir: PathBuf,
    pub bootstrap: PathBuf,
    pub listen: Option<SocketAddr>,
    /// Threads that run engine calls (see [`engine_threads_default`]).
    pub engine_threads: usize,
}

/// The embedded default storage: SQLite and journal files under the state dir.
pub fn embedded_store(state: &StateDir) -> Arc<dyn room_store::Backend> {
    Arc::new(room_store::SqliteBackend::new(state, Default::default()))
}

/// Validate, lock, open. Split-brain and a held lock are errors here, before anything listens.
pub fn open_engine(
    cfg: &ServeConfig,
) -> Result<(StateDir, statedir::DaemonLock, Engine), ServerError> {
    let state = statedir::validate(&cfg.state_dir, &cfg.bootstrap).map_err(ServerError::State)?;
    let lock = statedir::lock(&state).map_err(ServerError::State)?;
    let config = EngineConfig {
        // the owner is whoever runs the daemon: a socket peer of this uid is the owner console
        owner_uid: rustix::process::getuid().as_raw(),
        ..EngineConfig::default()
    };
    let engine = Engine::open(state.clone(), real_env(), embedded_store(&state), config)
        .map_err(ServerError::EngineOpen)?;
    Ok((state, lock, engine))
}

/// Run until `shutdown` resolves.
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let (state, _lock, engine) = tokio::task::spawn_blocking({
        let cfg = cfg.clone();
        move || open_engine(&cfg)
    })
    .await
    .map_err(|e| ServerError::Daemon(e.to_string()))??;
    let engine = Arc::new(engine);
    let sock = state.socket();
    // We hold the lock, so any socket or address file is a leftover of a dead daemon.
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(state.root.join("http.addr"));
    let listener = UnixListener::bind(&sock).map_err(|source| ServerError::Bind {
        what: sock.display().to_string(),
        source,
    })?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(socket = %sock.display(), instance = %state.instance_id, "room daemon listening");
    let http = match cfg.listen {
        Some(addr) => {
            if !addr.ip().is_loopback() {
                return Err(ServerError::ListenNotLoopback(addr));
            }
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind {
                    what: addr.to_string(),
                    source,
                })?;
            let bound = tcp.local_addr()?;
            tracing::info!(%bound, "http listening");
            std::fs::write(state.root.join("http.addr"), bound.to_string())?;
            Some(tokio::spawn(crate::daemon::http::run(tcp, engine.clone())))
        }
        None => None,
    };
    let flusher = tokio::spawn({
        let engine = engine.clone();
        async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(INDEX_FLUSH_MS));
            loop {
                tick.tick().await;
                let engine = engine.clone();
                let _ = tokio::task::spawn_blocking(move || engine.flush_indexes()).await;
            }
        }
    });
    let sweeper = tokio::spawn({
        let engine = engine.clone();
        async move {
            let mut tick =
                tokio::time::interval(std::time::Duration::from_millis(INVARIANT_SWEEP_MS));
            loop {
                tick.tick().await;
                let engine = engine.clone();
                // then one slice of the journal scrub (ARCHITECTURE.md states its rate)
                match tokio::task::spawn_blocking(move || {
                    (
                        engine.sweep_invariants(),
                        engine.scrub_step(room_engine::room::SCRUB_SLICE_BYTES),
                    )
                })
                .await
                {
                    Ok((Ok(0), _)) => {}
                    Ok((Ok(n), _)) => tracing::warn!("{n} claims past their TTL recorded in doubt"),
                    Ok((Err(r), _)) => tracing::error!("invariant sweep failed: {r}"),
                    Err(e) => tracing::error!("invariant sweep panicked: {e}"),
                }
            }
        }
    });
    let accept = async {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let engine = engine.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, engine).await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!("accept failed: {e}"),
            }
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => tracing::info!("shutting down"),
    }
    if let Some(h) = http {
        h.abort();
    }
    flusher.abort();
    sweeper.abort();
    let e = engine.clone();
    let _ = tokio::task::spawn_blocking(move || e.close_clean()).await;
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(state.root.join("http.addr"));
    Ok(())
}

async fn connection(stream: UnixStream, engine: Arc<Engine>) -> std::io::Result<()> {
    // what the kernel says about the peer; the engine decides what standing that gives
    let peer = stream.peer_cred()?;
    let transport = Transport::UnixSocket(Evidence::UnixPeer {
        uid: peer.uid(),
        pid: peer.pid().map_or(0, |p| p.cast_unsigned()),
    });
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(REQUEST_BYTES_MAX as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        let resp = if line.len() > REQUEST_BYTES_MAX {
            let r = Response::refused(
                Refusal::new(
                    Code::PayloadTooLarge,
                    format!("request over {REQUEST_BYTES_MAX} bytes"),
                )
                .detail(serde_json::json!({"limit_bytes": REQUEST_BYTES_MAX})),
            );
            write_response(&mut write, &r).await?;
            return Ok(()); // the rest of the oversized line cannot be trusted as a frame
        } else {
            decode_and_handle(&engine, transport.clone(), &line, None).await
        };
        write_response(&mut write, &resp).await?;
    }
}

async fn write_response(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    r: &Response,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(r)?;
    bytes.push(b'\n');
    w.write_all(&bytes).await?;
    Ok(())
}

pub(crate) async fn decode_and_handle(
    engine: &Arc<Engine>,
    transport: Transport,
    bytes: &[u8],
    bearer: Option<String>,
) -> Response {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.trim_end(),
        Err(_) => return Response::refused(Refusal::invalid("request", "not UTF-8")),
    };
    // One JSON object: serde would also take the struct's fields as an array, which the wire
    // contract does not allow.
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return Response::refused(Refusal::invalid("request", "must be one JSON object")),
        Err(e) => {
            return Response::refused(Refusal::invalid(
                "request",
                format!("malformed request: {e}"),
            ));
        }
    };
    let req: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            return Response::refused(Refusal::invalid(
                "request",
                format!("malformed request: {e}"),
            ));
        }
    };
    let engine = engine.clone();
    match tokio::task::spawn_blocking(move || dispatch::handle(&engine, transport, req, bearer))
        .await
    {
        Ok(r) => r,
        Err(e) => Response::refused(Refusal::storage(format!("request handler failed: {e}"))),
    }
}

/// A daemon on its own runtime thread, for the demo, the bench and tests.
pub struct Background {
    pub socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl Background {
    /// Start a daemon on its own runtime thread and wait until its socket answers.
    pub fn start(state_dir: &Path, bootstrap: &Path) -> Result<Background, ServerError> {
        Self::start_with(ServeConfig {
            state_dir: state_dir.to_path_buf(),
            bootstrap: bootstrap.to_path_buf(),
            listen: None,
            engine_threads: engine_threads_default(),
        })
    }

    /// Start with a full configuration (for example with an HTTP listener).
    pub fn start_with(cfg: ServeConfig) -> Result<Background, ServerError> {
        let state_dir = cfg.state_dir.clone();
        let wants_http = cfg.listen.is_some();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = runtime(cfg.engine_threads)?;
            rt.block_on(serve(cfg, async {
                let _ = rx.await;
            }))
        });
        let socket = state_dir.join("room.sock");
        for _ in 0..500 {
            if wants_http && !state_dir.join("http.addr").exists() {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            if let Ok(mut c) = crate::client::Client::connect(&socket)
                && c.call(&Request::new("ping", serde_json::json!({}))).is_ok()
            {
                return Ok(Background {
                    socket,
                    stop: Some(tx),
                    thread: Some(thread),
                });
            }
            if thread.is_finished() {
                return match thread.join() {
                    Ok(Err(e)) => Err(e),
                    _ => Err(ServerError::Daemon("daemon thread ended".into())),
                };
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(ServerError::Daemon("daemon did not come up".into()))
    }

    pub fn stop(mut self) -> Result<(), ServerError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| ServerError::Daemon("daemon thread panicked".into()))??;
        }
        Ok(())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

pub mod http {
    //! `POST /v1/call` on the loopback listener: the same request object, with the credential
    //! in `Authorization: Bearer`. A missing credential is 401 and nothing else.

    use super::*;
    use crate::mcp::{InProcess, RoomMcp, ToolsMode};
    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::{DefaultBodyLimit, State};
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::{IntoResponse, Response as HttpResponse};
    use axum::routing::{get, post};
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };

    pub async fn run(tcp: tokio::net::TcpListener, engine: Arc<Engine>) {
        let port = match tcp.local_addr() {
            Ok(a) => a.port(),
            Err(e) => {
                tracing::error!("http listener has no address: {e}");
                return;
            }
        };
        let mcp = |mode: ToolsMode| {
            let config = StreamableHttpServerConfig::default()
                .with_allowed_hosts([format!("localhost:{port}"), format!("127.0.0.1:{port}")])
                .with_allowed_origins([
                    format!("http://localhost:{port}"),
                    format!("http://127.0.0.1:{port}"),
                ])
                .enforce_origin_validation()
                // a tool call has one result and Room sends no progress in between: answer it
                // as plain JSON rather than as an SSE stream (rmcp falls back to SSE on its own
                // if a handler ever emits something first)
                .with_json_response(true)
                .with_max_request_body_bytes(REQUEST_BYTES_MAX);
            let engine = engine.clone();
            StreamableHttpService::new(
                move || {
                    Ok(RoomMcp::new(
                        Arc::new(InProcess(engine.clone())),
                        mode,
                        "mcp".into(),
                    ))
                },
                Arc::new(LocalSessionManager::default()),
                config,
            )
        };
        let mcp_routes = Router::new()
            .nest_service("/mcp", mcp(ToolsMode::Full))
            .nest_service("/mcp-compact", mcp(ToolsMode::Compact))
            .layer(axum::middleware::from_fn_with_state(
                engine.clone(),
                require_agent,
            ));
        let app = Router::new()
            .route("/v1/call", post(call))
            .route("/healthz", get(|| async { "ok" }))
            .layer(DefaultBodyLimit::max(REQUEST_BYTES_MAX))
            .with_state(engine)
            .merge(mcp_routes);
        // Without TCP_NODELAY a client that reuses its connection waits out delayed ACKs
        // (about 40 ms a call on Linux) behind each small response.
        use axum::serve::ListenerExt;
        let tcp = tcp.tap_io(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY not set: {e}");
            }
        });
        if let Err(e) = axum::serve(tcp, app).await {
            tracing::error!("http server stopped: {e}");
        }
    }

    fn unauthorized() -> HttpResponse {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
        )
            .into_response()
    }

    /// MCP over HTTP admits only a current agent credential; anything else is a bare 401.
    async fn require_agent(
        State(engine): State<Arc<Engine>>,
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> HttpResponse {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return unauthorized();
        };
        // inline when control.db is free (a cache lookup); on a thread when a commit holds it
        let known = match engine.try_authenticate(&token) {
            Some(r) => r.is_ok(),
            None => tokio::task::spawn_blocking(move || engine.authenticate(&token).is_ok())
                .await
                .unwrap_or(false),
        };
        if !known {
            return unauthorized();
        }
        next.run(req).await
    }

    async fn call(
        State(engine): State<Arc<Engine>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> HttpResponse {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|s| s.trim().to_string());
        let Some(bearer) = bearer.filter(|b| !b.is_empty()) else {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
            )
                .into_response();
        };
        let resp = decode_and_handle(&engine, Transport::Http, &body, Some(bearer)).await;
        let status = match &resp.refusal {
            Some(r) if matches!(r.code, Code::CredentialInvalid | Code::CredentialRevoked) => {
                StatusCode::UNAUTHORIZED
            }
            _ => StatusCode::OK,
        };
        (status, axum::Json(resp)).into_response()
    }
}
