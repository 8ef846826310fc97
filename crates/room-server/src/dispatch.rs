//! Decode a request, route it to the engine, and pass everything bound for an agent through
//! the egress redactor. Routing is by name only: which caller may do what is the engine's call.

use crate::wire::*;
use room_core::{Code, Refusal, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::turnstile::TurnStep;
use room_engine::verbs::TurnArgs;
use room_engine::{Caller, Engine, Evidence, Owner};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::sync::Arc;

/// How the request arrived, with what the transport observed about its peer; the engine
/// decides what that allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The Unix socket, with the peer's credentials from `SO_PEERCRED` (the engine grants owner
    /// standing to the owner's uid; any other uid may act as an agent only).
    UnixSocket(Evidence),
    /// HTTP with `Authorization: Bearer`.
    Http,
    /// The daemon's own in-process callers: an API worker's tool calls under its launch's
    /// credential. Never the owner: a call without a credential is refused.
    Daemon,
}

/// The conversation an agent gets when its transport names none (one fixed one per agent).
pub const DEFAULT_CONVERSATION: &str = "cli";

const OWNER_OPS: &[&str] = &[
    "agent_enroll",
    "agent_delegate",
    "agent_rotate",
    "agent_revoke",
    "agent_policy",
    "agent_list",
    "project_open",
    "project_list",
    "project_source",
    "room_create",
    "room_members_add",
    "room_archive",
    "room_log",
    "room_audit",
    "task_audit",
    "compose_grant",
    "compose_revoke",
    "compose_grants",
    "room_members",
    "rooms",
    "index_rebuild",
    "wakes_list",
    "wakes_show",
    "route_set",
    "route_remove",
    "routes_list",
    "wakes_check",
    "wakes_obligations",
    "sessions_list",
    "sessions_show",
    "adapters_list",
    "owner_task_show",
    "owner_task_check",
    "owner_task_override",
    "stops_list",
    "workers_list",
    "collab_artifacts",
    "collab_artifact",
    "collab_start",
    "collab_status",
    "collab_list",
    "collab_decide",
    "collab_cancel",
    "collab_rerun",
    "collab_profile",
    "dashboard_login",
    "ping",
];

/// Lifecycle actions: the owner console or an operator-tier agent (control standing, decided
/// by the engine from the caller's credential; no argument confers it).
const CONTROL_OPS: &[&str] = &[
    "room_cancel",
    "room_resume",
    "room_reset",
    "room_admission",
    "room_reconcile",
    "break_glass",
];

/// The room a control op acts on (none for break-glass), read before its arguments are.
fn control_room(op: &str, a: &Value) -> Option<String> {
    (op != "break_glass")
        .then(|| a.get("room").and_then(Value::as_str).map(String::from))
        .flatten()
}

fn control_op(
    engine: &Engine,
    c: &room_engine::lifecycle::Control,
    op: &str,
    a: Value,
) -> Result<Value, Refusal> {
    match op {
        "room_cancel" => {
            let a: CancelArgs = args(a)?;
            engine.room_cancel(c, &a.room, a.by.as_deref())
        }
        "room_resume" => engine.room_resume(c, &args::<RoomArgs>(a)?.room),
        "room_reset" => engine.room_reset(c, &args::<RoomArgs>(a)?.room),
        "room_admission" => {
            let a: AdmissionArgs = args(a)?;
            engine.room_admission(c, &a.room, a.open)
        }
        "room_reconcile" => {
            let a: ReconcileArgs = args(a)?;
            match (a.hold, a.outcome, a.evidence) {
                (None, None, None) => engine.holds_view(c, &a.room),
                (Some(h), Some(o), Some(e)) => engine.reconcile(c, &a.room, &h, &o, &e),
                _ => Err(Refusal::invalid(
                    "hold",
                    "resolving a hold takes hold, outcome and evidence together",
                )),
            }
        }
        "break_glass" => engine.break_glass(c, args::<BreakGlassArgs>(a)?.engage),
        _ => Err(Refusal::invalid("op", format!("unknown operation {op:?}"))),
    }
}

fn args<T: DeserializeOwned>(v: Value) -> Result<T, Refusal> {
    let v = match v {
        Value::Null => json!({}),
        Value::Object(_) => v,
        _ => return Err(Refusal::invalid("args", "must be a JSON object")),
    };
    // the path names a field whose value was wrong (`accept[0]`); an unknown or missing
    // field is named in the message itself, at the path of its object
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        let field = if path != "." {
            path
        } else {
            msg.split('`')
                .nth(1)
                .map(String::from)
                .unwrap_or_else(|| "args".into())
        };
        Refusal::invalid(&field, msg)
    })
}

fn tier_arg(field: &str, v: Option<String>) -> Result<Option<Tier>, Refusal> {
    v.map(|t| {
        Tier::parse(&t).ok_or_else(|| {
            Refusal::invalid(
                field,
                format!("{t:?} is not observer, member, coordinator or operator"),
            )
        })
    })
    .transpose()
}

fn verbs_arg(field: &str, v: Vec<String>) -> Result<Vec<Verb>, Refusal> {
    v.into_iter()
        .map(|s| {
            Verb::parse(&s).ok_or_else(|| Refusal::invalid(field, format!("{s:?} is not a verb")))
        })
        .collect()
}

/// Handle one request, waiting on this thread while a turn waits its turn in a busy room.
/// `bearer` is the HTTP credential, if the transport carried one. An async caller uses
/// [`handle_async`], which waits without holding a blocking thread.
pub fn handle(
    engine: &Engine,
    transport: Transport,
    req: Request,
    bearer: Option<String>,
) -> Response {
    let mut ticket = None;
    loop {
        match handle_step(
            engine,
            transport.clone(),
            req.clone(),
            bearer.clone(),
            ticket,
        ) {
            Step::Done(r) => return r,
            Step::Wait {
                ticket: t,
                until_ms,
            } => {
                ticket = Some(t);
                let left = until_ms.saturating_sub(engine.now_ms()).max(1);
                engine
                    .turn_waits()
                    .wait_blocking(t, std::time::Duration::from_millis(left));
            }
        }
    }
}

/// [`handle`] on the blocking pool, with every wait in a room's turnstile spent here, off it.
pub async fn handle_async(
    engine: Arc<Engine>,
    transport: Transport,
    req: Request,
    bearer: Option<String>,
) -> Response {
    engine
        .turn_waits()
        .hook_once(|| Arc::new(|| turn_notify().notify_waiters()));
    let mut ticket = None;
    loop {
        let (e, t, r, b) = (
            engine.clone(),
            transport.clone(),
            req.clone(),
            bearer.clone(),
        );
        let step = match tokio::task::spawn_blocking(move || handle_step(&e, t, r, b, ticket)).await
        {
            Ok(s) => s,
            Err(e) => {
                return Response::refused(Refusal::storage(format!("request handler failed: {e}")));
            }
        };
        match step {
            Step::Done(r) => return r,
            Step::Wait {
                ticket: t,
                until_ms,
            } => {
                ticket = Some(t);
                wait_turn(&engine, t, until_ms).await;
            }
        }
    }
}

/// Woken whenever any turn's ticket is woken; each waiter then asks its engine about its own.
fn turn_notify() -> &'static tokio::sync::Notify {
    static NOTIFY: std::sync::LazyLock<tokio::sync::Notify> =
        std::sync::LazyLock::new(tokio::sync::Notify::new);
    &NOTIFY
}

async fn wait_turn(engine: &Engine, ticket: u64, until_ms: u64) {
    let left = until_ms.saturating_sub(engine.now_ms()).max(1);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(left);
    loop {
        let notified = turn_notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if engine.turn_waits().take(ticket) {
            return;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// What one pass over a request comes to.
pub enum Step {
    Done(Response),
    /// A turn waits in its room's turnstile: call again with the ticket once it is woken or
    /// `until_ms` passes.
    Wait {
        ticket: u64,
        until_ms: u64,
    },
}

/// One pass over a request (see [`Step`]).
pub fn handle_step(
    engine: &Engine,
    transport: Transport,
    req: Request,
    bearer: Option<String>,
    ticket: Option<u64>,
) -> Step {
    let op = req.op.clone();
    // an orchestrator's turn keeps what it says (`collab::steer`): the text of each turn
    let said = {
        let token = req.token.as_deref().or(bearer.as_deref());
        (crate::collab::steer::turn_kept(token) && (op == "room" || Verb::parse(&op).is_some()))
            .then(|| {
                let text = req.args.get("text").and_then(Value::as_str).unwrap_or("");
                (token.unwrap_or_default().to_string(), text.to_string())
            })
    };
    let step = handle_one(engine, transport, req, bearer, ticket);
    if let Step::Done(resp) = &step {
        announce(&op, resp);
        if let Some((token, text)) = said.filter(|_| resp.ok) {
            crate::collab::steer::turn_said(&token, &text);
        }
    }
    step
}

fn handle_one(
    engine: &Engine,
    transport: Transport,
    req: Request,
    bearer: Option<String>,
    ticket: Option<u64>,
) -> Step {
    // one owner policy for the whole call, redaction of its answer included
    let _call = engine.one_call();
    let caller = match resolve_caller(engine, transport, &req, bearer) {
        Ok(c) => c,
        Err(r) => return Step::Done(*r),
    };
    Step::Done(match caller {
        Caller::Local(_) => match engine.owner(&caller) {
            // no owner standing and no credential: as an agent it would need a token
            Err(r) if r.code == Code::OwnerRequired => no_credential(),
            Err(r) => Response::refused(r),
            Ok(o) => match owner_op(engine, &o, &req.op, req.args) {
                Ok(v) => Response::ok(v),
                Err(r) => Response::refused(r),
            },
        },
        Caller::Agent(a) => {
            // Without an egress policy nothing may leave, so nothing may run either: a call
            // whose answer would be withheld must not have written anything.
            if let Err(withheld) = engine.policy().redactor() {
                return Step::Done(Response::refused(withheld));
            }
            let out = match agent_op(engine, &a, &req.op, req.args, ticket) {
                Ok(TurnStep::Wait { ticket, until_ms }) => {
                    return Step::Wait { ticket, until_ms };
                }
                Ok(TurnStep::Done(v)) => Ok(v),
                Err(r) => Err(r),
            };
            egress(engine, out)
        }
    })
}

fn no_credential() -> Response {
    Response::refused(
        Refusal::new(Code::CredentialInvalid, "no credential presented").hint("set ROOM_TOKEN"),
    )
}

/// Who is calling: the owner console (a local peer without a credential) or an agent.
fn resolve_caller(
    engine: &Engine,
    transport: Transport,
    req: &Request,
    bearer: Option<String>,
) -> Result<Caller, Box<Response>> {
    let token = match (bearer, req.token.clone()) {
        (Some(_), Some(_)) => {
            return Err(Box::new(Response::refused(Refusal::invalid(
                "token",
                "give the credential once (header or body)",
            ))));
        }
        (a, b) => a.or(b),
    };
    // a transport's page ceiling can only lower the engine's; one below the smallest page
    // is refused, not quietly raised
    if let Some(b) = req.page_bytes_max
        && (b as usize) < room_engine::sync::PAGE_BYTES_MIN
    {
        return Err(Box::new(Response::refused(Refusal::invalid(
            "page_bytes_max",
            format!(
                "must be at least {} bytes (it can only lower the daemon's ceiling)",
                room_engine::sync::PAGE_BYTES_MIN
            ),
        ))));
    }
    Ok(match (token, transport) {
        (None, Transport::UnixSocket(evidence)) => Caller::Local(evidence),
        (None, Transport::Http | Transport::Daemon) => return Err(Box::new(no_credential())),
        (Some(token), transport) => {
            let via = match &transport {
                Transport::UnixSocket(Evidence::Worker {
                    launch: Some(launch),
                    ..
                }) => room_engine::CredentialVia::Broker(launch),
                Transport::Daemon => room_engine::CredentialVia::Daemon,
                _ => room_engine::CredentialVia::Elsewhere,
            };
            if let Err(r) = engine.credential_admits(&token, via) {
                return Err(Box::new(Response::refused(r)));
            }
            let declared = match tier_arg("tier", req.tier.clone()) {
                Ok(t) => t,
                Err(r) => return Err(Box::new(Response::refused(r))),
            };
            let conversation = match conversation_of(engine, &token, req) {
                Ok(c) => c,
                Err(r) => return Err(Box::new(egress(engine, Err(r)))),
            };
            Caller::Agent(AgentCaller {
                token,
                conversation,
                declared_tier: declared,
                page_bytes_max: req.page_bytes_max.map(|b| b as usize),
            })
        }
    })
}

/// Operations that never change a room's journal: they do not wake resource subscribers.
const READ_OPS: &[&str] = &[
    "routes_list",
    "whoami",
    "list",
    "task_ids",
    "sync",
    "task_show",
    "task_check",
    "room_compose",
    "ping",
    "rooms",
    "room_log",
    "room_audit",
    "task_audit",
    "compose_grants",
    "room_members",
    "wakes_list",
    "wakes_show",
    "wakes_obligations",
    "sessions_list",
    "sessions_show",
    "adapters_list",
    "owner_task_show",
    "owner_task_check",
    "agent_list",
    "project_list",
    "stops_list",
    "workers_list",
    "collab_list",
    "collab_status",
    "collab_profile",
    "collab_artifacts",
    "collab_artifact",
    "search",
];

/// A counter bumped after every call that may have moved a room, so MCP sessions subscribed
/// to rooms learn of it at once (they compare tips; a spurious bump costs one listing).
pub fn changes() -> &'static tokio::sync::watch::Sender<u64> {
    static CHANGES: std::sync::LazyLock<tokio::sync::watch::Sender<u64>> =
        std::sync::LazyLock::new(|| tokio::sync::watch::Sender::new(0));
    &CHANGES
}

fn announce(op: &str, resp: &Response) {
    if resp.ok && !READ_OPS.contains(&op) {
        changes().send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A canonical UUID: lower-case 8-4-4-4-12 hex, not the nil UUID.
pub fn is_canonical_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let shape = [8, 4, 4, 4, 12];
    parts.len() == 5
        && parts.iter().zip(shape).all(|(p, n)| {
            p.len() == n
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        && s != "00000000-0000-0000-0000-000000000000"
}

/// The native conversation of an agent call: the host's `_meta` key for the agent's host kind
/// when present (it must be a canonical UUID), else the transport's session, else the fixed
/// default. A tool argument never chooses it.
fn conversation_of(engine: &Engine, token: &str, req: &Request) -> Result<String, Refusal> {
    let fallback = || {
        req.conversation
            .clone()
            .unwrap_or_else(|| DEFAULT_CONVERSATION.into())
    };
    let meta = match &req.meta {
        None | Some(Value::Null) => return Ok(fallback()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(Refusal::invalid("_meta", "must be an object")),
    };
    let agent = engine.authenticate(token)?;
    let Some(key) = engine
        .policy()
        .conversation_meta
        .get(&agent.host_kind)
        .cloned()
    else {
        return Ok(fallback());
    };
    match meta.get(&key) {
        None => Ok(fallback()),
        Some(Value::String(id)) if is_canonical_uuid(id) => Ok(format!("{}:{id}", agent.host_kind)),
        Some(_) => Err(Refusal::invalid(
            &format!("_meta.{key}"),
            "must be a canonical, non-nil UUID",
        )),
    }
}

/// Everything toward an agent passes the redactor; without a policy nothing leaves.
fn egress(engine: &Engine, out: Result<Value, Refusal>) -> Response {
    let policy = engine.policy();
    let redactor = match policy.redactor() {
        Ok(r) => r,
        Err(withheld) => return Response::refused(withheld),
    };
    match out {
        Ok(mut v) => {
            redactor.redact_in_place(&mut v);
            Response::ok(v)
        }
        Err(mut r) => {
            // kept page items were rendered through this very policy's redactor; under any
            // other they are redacted again here, as a page in the detail is
            if r.page_items
                .as_ref()
                .is_some_and(|p| p.policy_sha256 != redactor.policy_sha256())
            {
                r.materialize();
            }
            r.message = redactor.redact(&r.message).into_owned().into();
            r.hint = r.hint.map(|h| redactor.redact(&h).into_owned().into());
            redactor.redact_in_place(&mut r.detail);
            Response::refused(r)
        }
    }
}

/// One owner operation for a caller the engine already found to be the owner (the dashboard's
/// browser session), answered through the egress redactor as an agent's call is: a page is
/// an egress too.
pub fn owner_call(engine: &Engine, owner: &Owner, op: &str, args: Value) -> Response {
    let _call = engine.one_call();
    let resp = egress(engine, owner_op(engine, owner, op, args));
    announce(op, &resp);
    resp
}

fn owner_op(engine: &Engine, owner: &Owner, op: &str, a: Value) -> Result<Value, Refusal> {
    match op {
        "ping" => Ok(
            json!({"pong": true, "instance": engine.state().instance_id, "pid": std::process::id()}),
        ),
        "agent_enroll" => {
            let a: EnrollArgs = args(a)?;
            let tier = tier_arg("max_tier", a.max_tier)?.unwrap_or(Tier::Member);
            let e = engine.enroll(owner, &a.name, tier, a.host.as_deref().unwrap_or("generic"))?;
            Ok(
                json!({"agent": e.name, "token": e.token, "max_tier": e.max_tier, "registration_sha256": e.registration_sha256}),
            )
        }
        "agent_rotate" => {
            let a: NameArgs = args(a)?;
            let e = engine.rotate(owner, &a.name)?;
            Ok(
                json!({"agent": e.name, "token": e.token, "registration_sha256": e.registration_sha256}),
            )
        }
        "agent_revoke" => engine.revoke(owner, &args::<NameArgs>(a)?.name),
        "dashboard_login" => {
            args::<Empty>(a)?;
            let c = engine.console_code(owner);
            Ok(json!({"code": c.code, "expires_ms": c.expires_ms,
                "ttl_ms": room_engine::console::LOGIN_CODE_TTL_MS}))
        }
        "search" => {
            let ep = crate::embeddings::endpoint(engine);
            let ep = ep
                .as_ref()
                .map(|e| e as &dyn room_engine::search::QueryEmbedder);
            engine.search_owner(owner, args::<SearchArgs>(a)?.engine(), ep)
        }
        "collab_start" => crate::collab::start(engine, owner, args(a)?),
        "collab_status" => crate::collab::status(engine, owner, &args::<IdArgs>(a)?.id),
        "collab_profile" => {
            args::<Empty>(a)?;
            crate::collab::profile(engine, owner)
        }
        "collab_list" => {
            args::<Empty>(a)?;
            crate::collab::list(engine, owner)
        }
        "collab_decide" => {
            let a: DecideArgs = args(a)?;
            let verdict = match (a.verdict.as_str(), a.prompt) {
                ("approve", None) => room_engine::collab::Verdict::Approve,
                ("revise", Some(p)) => room_engine::collab::Verdict::Revise(json!({"prompt": p})),
                ("reject", None) => room_engine::collab::Verdict::Reject,
                ("revise", None) => {
                    return Err(Refusal::invalid(
                        "prompt",
                        "a revision gives the prompt it approves",
                    ));
                }
                (_, Some(_)) => {
                    return Err(Refusal::invalid("prompt", "only a revision gives a prompt"));
                }
                (v, None) => {
                    return Err(Refusal::invalid(
                        "verdict",
                        format!("{v:?} is not approve, revise or reject"),
                    ));
                }
            };
            engine
                .approval_decide(owner, &a.approval, &a.digest, verdict)
                .map(|a| crate::collab::approval_view(&a))
        }
        "collab_cancel" => {
            let id = args::<IdArgs>(a)?.id;
            let out = engine.collab_cancel(owner, &id)?;
            crate::collab::remove_trees(engine, &id);
            Ok(out)
        }
        "collab_rerun" => {
            let a: RerunArgs = args(a)?;
            crate::collab::rerun(engine, owner, &a.id, &a.phase)
        }
        "collab_artifacts" => {
            let a: ArtifactIndexArgs = args(a)?;
            engine.artifact_index_owner(
                owner,
                &a.room,
                a.after.as_deref(),
                a.limit.unwrap_or(room_engine::blackboard::INDEX_PAGE_MAX),
            )
        }
        "collab_artifact" => {
            let a: ArtifactGetArgs = args(a)?;
            engine.artifact_get_owner(owner, &a.room, &a.kind, a.key.as_deref(), a.version)
        }
        "agent_delegate" => {
            let a: DelegateArgs = args(a)?;
            let tier = tier_arg("max_tier", a.max_tier)?;
            engine.delegate_as_owner(owner, a.parent.as_deref(), &a.name, &a.scopes, tier)
        }
        "agent_policy" => {
            let a: PolicyArgs = args(a)?;
            let deny = verbs_arg("deny", a.deny)?;
            let allow = verbs_arg("allow", a.allow)?;
            let tier = tier_arg("max_tier", a.max_tier)?;
            engine.set_agent_policy(owner, &a.name, &deny, &allow, tier)
        }
        "agent_list" => engine.agents_view(owner),
        "project_source" => {
            let a: ProjectSourceArgs = args(a)?;
            engine.project_source(owner, &a.project, &a.parts)
        }
        "project_open" => {
            let a: ProjectOpenArgs = args(a)?;
            engine.project_open(owner, &a.path, a.name.as_deref())
        }
        "project_list" => engine.projects_view(owner),
        "room_create" => {
            let a: RoomCreateArgs = args(a)?;
            engine.room_create(owner, &a.name, a.project.as_deref(), &a.members)
        }
        "room_members_add" => {
            let a: RoomAgentArgs = args(a)?;
            engine.room_members_add(owner, &a.room, &a.agent)
        }
        _ if CONTROL_OPS.contains(&op) => control_op(engine, &owner.control(), op, a),
        "stops_list" => {
            args::<Empty>(a)?;
            crate::workers::stops_view(engine)
        }
        "workers_list" => {
            args::<Empty>(a)?;
            Ok(crate::workers::workers_view())
        }
        "room_archive" => engine.room_archive(owner, &args::<RoomArgs>(a)?.room),
        "room_log" => {
            let a: LogArgs = args(a)?;
            engine.room_log(owner, &a.room, a.from.unwrap_or(1), a.limit.unwrap_or(200))
        }
        "rooms" => engine.rooms_view(owner),
        "room_members" => engine.room_members(owner, &args::<RoomArgs>(a)?.room),
        "room_audit" => {
            let a: AuditArgs = args(a)?;
            engine.room_audit(owner, &a.room, &a.event)
        }
        "task_audit" => engine.task_audit(owner, &args::<TaskArgs>(a)?.task),
        "compose_grant" => {
            let a: ComposeGrantArgs = args(a)?;
            engine.compose_grant(owner, &a.agent, &a.rooms)
        }
        "compose_revoke" => engine.compose_revoke(owner, &args::<IdArgs>(a)?.id),
        "compose_grants" => engine.compose_grants(owner, args::<OptAgentArgs>(a)?.agent.as_deref()),
        "index_rebuild" => {
            let a = args::<IndexRebuildArgs>(a)?;
            engine.index_rebuild(owner, &a.room, a.accept_loss)
        }
        "wakes_list" => engine.wakes_view(owner, args::<OptRoomArgs>(a)?.room.as_deref()),
        "wakes_show" => engine.wake_show(owner, &args::<WakeShowArgs>(a)?.wake),
        "route_set" => {
            let a = args::<RouteSetArgs>(a)?;
            engine.route_set(owner, &a.agent, &a.route)
        }
        "route_remove" => engine.route_remove(owner, &args::<NameArgs>(a)?.name),
        "routes_list" => {
            args::<Empty>(a)?;
            engine.routes_list(owner)
        }
        "wakes_obligations" => engine.obligations_view(owner, &args::<RoomArgs>(a)?.room),
        "sessions_list" => engine.sessions_view(owner, args::<OptAgentArgs>(a)?.agent.as_deref()),
        "sessions_show" => engine.session_show(owner, &args::<IdArgs>(a)?.id),
        "adapters_list" => {
            args::<serde_json::Map<String, Value>>(a)?;
            Ok(json!({"adapters": room_agents::coverage::all()}))
        }
        "wakes_check" => {
            args::<Empty>(a)?;
            engine.dispatch_sweep()
        }
        "owner_task_show" => engine.task_view_owner(owner, &args::<TaskArgs>(a)?.task),
        "owner_task_check" => engine.task_check_owner(owner, &args::<TaskArgs>(a)?.task),
        "owner_task_override" => {
            let a: TaskOverrideArgs = args(a)?;
            engine.task_override(owner, &a.task, &a.reason)
        }
        _ if is_agent_op(op) => Err(Refusal::new(
            Code::CredentialInvalid,
            format!("{op} acts as an agent: no credential presented"),
        )
        .hint("set ROOM_TOKEN to the agent's token")),
        _ => Err(Refusal::invalid("op", format!("unknown operation {op:?}"))),
    }
}

fn is_agent_op(op: &str) -> bool {
    op == "room" || op == "sync" || ARTIFACT_OPS.contains(&op) || Verb::parse(op).is_some()
}

/// The blackboard's operations for agents: not verbs (a put is a `note` carrying the artifact,
/// a read is a read of the room), fenced by the caller's scopes in the engine.
const ARTIFACT_OPS: &[&str] = &[
    "collab_ask",
    "collab_status",
    "collab_dispatch",
    "collab_request_approval",
    "collab_close",
    "artifact_put",
    "diff_from_tree",
    "artifact_get",
    "artifact_index",
    "search",
];

fn artifact_op(
    engine: &Engine,
    caller: &AgentCaller,
    op: &str,
    a: Value,
    ticket: Option<u64>,
) -> Result<TurnStep<Value>, Refusal> {
    match op {
        "artifact_put" => {
            let a: ArtifactPutArgs = args(a)?;
            let turn = TurnArgs {
                room: a.room,
                text: a.text,
                task: a.task,
                parents: a.parents,
                idempotency_key: a.idempotency_key,
                read_through: a.read_through,
                audience: a.audience,
                artifact: Some(room_engine::blackboard::ArtifactDraft {
                    kind: a.kind,
                    key: a.key,
                    content: a.content,
                    expected_version: a.expected_version,
                }),
                ..TurnArgs::default()
            };
            engine.turn_step(caller, Verb::Note, turn, ticket)
        }
        "diff_from_tree" => {
            let a: DiffFromTreeArgs = args(a)?;
            // the tree's diff is taken once per call, before the turn (a turn that waits
            // comes back here with its ticket and takes it again: the tree as it is then)
            let content = engine.diff_from_tree(caller, &a.room, a.summary)?;
            let turn = TurnArgs {
                room: a.room,
                text: a.text,
                task: a.task,
                parents: a.parents,
                idempotency_key: a.idempotency_key,
                read_through: a.read_through,
                artifact: Some(room_engine::blackboard::ArtifactDraft {
                    kind: "diff".into(),
                    key: a.key,
                    content,
                    expected_version: a.expected_version,
                }),
                ..TurnArgs::default()
            };
            engine.turn_step(caller, Verb::Note, turn, ticket)
        }
        "search" => {
            let ep = crate::embeddings::endpoint(engine);
            let ep = ep
                .as_ref()
                .map(|e| e as &dyn room_engine::search::QueryEmbedder);
            engine
                .search(caller, args::<SearchArgs>(a)?.engine(), ep)
                .map(TurnStep::Done)
        }
        "collab_status" => {
            let a: CollabSteerArgs = args(a)?;
            room_collab::steer::status(engine, caller, &a.id).map(TurnStep::Done)
        }
        "collab_close" => {
            let a: CollabSteerArgs = args(a)?;
            room_collab::steer::close(
                engine,
                caller,
                &a.id,
                &crate::collab::DaemonHost::for_tools(),
            )
            .map(TurnStep::Done)
        }
        "collab_dispatch" | "collab_request_approval" => {
            let a: CollabDispatchArgs = args(a)?;
            crate::collab::steer::dispatch(
                engine,
                caller,
                &a.id,
                a.phase.as_deref(),
                a.purpose.as_deref(),
                op == "collab_request_approval",
            )
            .map(TurnStep::Done)
        }
        "collab_ask" => {
            let a: CollabAskArgs = args(a)?;
            engine
                .collab_ask(caller, &a.room, &a.question, a.task.as_deref())
                .map(TurnStep::Done)
        }
        "artifact_get" => {
            let a: ArtifactGetArgs = args(a)?;
            engine
                .artifact_get(caller, &a.room, &a.kind, a.key.as_deref(), a.version)
                .map(TurnStep::Done)
        }
        _ => {
            let a: ArtifactIndexArgs = args(a)?;
            engine
                .artifact_index(
                    caller,
                    &a.room,
                    a.after.as_deref(),
                    a.limit.unwrap_or(room_engine::blackboard::INDEX_PAGE_MAX),
                )
                .map(TurnStep::Done)
        }
    }
}

fn turn_args(w: TurnWire) -> TurnArgs {
    TurnArgs {
        room: w.room,
        text: w.text,
        to: w.to,
        reply_to: w.reply_to,
        task: w.task,
        evidence: w.evidence,
        parents: w.parents,
        obligation: w.obligation,
        actor: w.actor,
        idempotency_key: w.idempotency_key,
        read_through: w.read_through,
        audience: w.audience,
        artifact: None,
    }
}

fn agent_op(
    engine: &Engine,
    caller: &AgentCaller,
    op: &str,
    a: Value,
    ticket: Option<u64>,
) -> Result<TurnStep<Value>, Refusal> {
    if CONTROL_OPS.contains(&op) {
        let c = engine.control_actor(
            &Caller::Agent(caller.clone()),
            control_room(op, &a).as_deref(),
        )?;
        return control_op(engine, &c, op, a).map(TurnStep::Done);
    }
    // `collab_status` is the owner's view and, with an agent's credential, an orchestrator's
    if OWNER_OPS.contains(&op) && !ARTIFACT_OPS.contains(&op) {
        // The engine decides: an agent has no owner standing, whatever its tier.
        engine.owner(&Caller::Agent(caller.clone()))?;
    }
    // a child of the caller in the delegated identity tree (no verb: its authority is the
    // caller's credential and what it holds)
    if op == "delegate" {
        let a: DelegateArgs = args(a)?;
        if a.parent.is_some() {
            return Err(Refusal::invalid(
                "parent",
                "an agent delegates under itself; only the owner names a parent",
            ));
        }
        let tier = tier_arg("max_tier", a.max_tier)?;
        return engine
            .delegate(caller, &a.name, &a.scopes, tier)
            .map(TurnStep::Done);
    }
    // the caller's task ids by prefix, for a host's completions (reads, confirms nothing)
    if op == "task_ids" {
        let a: TaskIdsArgs = args(a)?;
        return engine.task_ids(caller, &a.prefix).map(TurnStep::Done);
    }
    if ARTIFACT_OPS.contains(&op) {
        return artifact_op(engine, caller, op, a, ticket);
    }
    // The multiplexer reaches the same verbs, under the same authorization.
    let (verb, a) = if op == "room" {
        let action = a.get("action").and_then(Value::as_str).map(String::from);
        let action = action.ok_or_else(|| {
            Refusal::invalid("action", "the room tool needs an action (a verb name)")
        })?;
        let verb = Verb::parse(&action)
            .ok_or_else(|| Refusal::invalid("action", format!("{action:?} is not a verb")))?;
        let mut a = a;
        if !verb.is_gated() {
            a.as_object_mut().map(|m| m.remove("action"));
        }
        (verb, a)
    } else {
        (
            Verb::parse(op)
                .ok_or_else(|| Refusal::invalid("op", format!("unknown operation {op:?}")))?,
            a,
        )
    };
    let out = match verb {
        Verb::Whoami => {
            args::<serde_json::Map<String, Value>>(a)?
                .is_empty()
                .then_some(())
                .ok_or_else(|| Refusal::invalid("args", "whoami takes no arguments"))?;
            engine.whoami(caller)
        }
        Verb::List => engine.list(caller),
        Verb::Sync => {
            let a: SyncArgs = args(a)?;
            engine.sync(caller, &a.room, a.confirm.as_deref())
        }
        Verb::TaskCreate => {
            let a: TaskCreateArgs = args(a)?;
            engine.task_create(
                caller,
                room_engine::verbs::TaskCreateArgs {
                    room: a.room,
                    title: a.title,
                    to: a.to,
                    parent: a.parent,
                    scopes: a.scopes,
                    idempotency_key: a.idempotency_key,
                    requirements: a.requirements,
                    accept: a.accept,
                    coordination_only: a.coordination_only,
                    governed: a.governed,
                    stage: a.stage,
                },
            )
        }
        Verb::TaskClaim => {
            let a: TaskClaimArgs = args(a)?;
            engine.task_claim(caller, &a.task, a.ttl_ms)
        }
        Verb::TaskShow => engine.task_show(caller, &args::<TaskArgs>(a)?.task),
        Verb::TaskCheck => engine.task_check(caller, &args::<TaskArgs>(a)?.task),
        Verb::TaskAmend => {
            let a: TaskAmendArgs = args(a)?;
            engine.task_amend(
                caller,
                room_engine::completion::AmendArgs {
                    task: a.task,
                    requirements: a.requirements,
                    accept: a.accept,
                },
            )
        }
        Verb::SourceRead => {
            let a: SourceReadArgs = args(a)?;
            engine.source_read(
                caller,
                room_engine::source::SourceReadArgs {
                    task: a.task,
                    part: a.part,
                    offset: a.offset,
                    length: a.length,
                },
            )
        }
        Verb::RoomCompose => {
            let a: ComposeArgs = args(a)?;
            engine.room_compose(
                caller,
                room_engine::compose::ComposeArgs {
                    rooms: a.rooms,
                    cursor: a.cursor,
                    limit: a.limit,
                },
            )
        }
        Verb::TaskPropose => {
            let a: TaskProposeArgs = args(a)?;
            let change = room_core::stage::Proposal {
                path: a.path,
                key: a.key,
                version: a.version,
                set: a.set,
            };
            crate::proposals::propose(engine, caller, &a.task, change)
        }
        Verb::TaskSupersede => {
            let a: TaskSupersedeArgs = args(a)?;
            engine.task_supersede(caller, &a.task, &a.successor)
        }
        Verb::TaskCancel => {
            let a: TaskCancelArgs = args(a)?;
            engine.task_cancel(caller, &a.task, a.reason.as_deref())
        }
        Verb::OpBegin => {
            let a: OpBeginArgs = args(a)?;
            engine.op_begin(
                caller,
                room_engine::ledger::OpBeginArgs {
                    room: a.room,
                    task: a.task,
                    destination: a.destination,
                    parent: a.parent,
                    ttl_ms: a.ttl_ms,
                    probe: a.probe,
                    note: a.note,
                    idempotency_key: a.idempotency_key,
                },
            )
        }
        Verb::EvidenceRegister => {
            let a: EvidenceArgs = args(a)?;
            engine.evidence_register(
                caller,
                room_engine::evidence::EvidenceArgs {
                    room: a.room,
                    task: a.task,
                    req: a.req,
                    origin: a.origin,
                    lineage: a.lineage,
                    summary: a.summary,
                    audience: a.audience,
                },
            )
        }
        Verb::WakeTake => {
            let a: WakeTakeArgs = args(a)?;
            engine.wake_take(
                caller,
                room_engine::take::TakeArgs {
                    room: a.room,
                    source_event: a.source_event,
                },
            )
        }
        Verb::OpEffect | Verb::OpResolve => {
            let a: OpArgs = args(a)?;
            let a = room_engine::ledger::OpArgs {
                room: a.room,
                op: a.op,
                outcome: a.outcome,
                note: a.note,
            };
            if verb == Verb::OpEffect {
                engine.op_effect(caller, a)
            } else {
                engine.op_resolve(caller, a)
            }
        }
        v => {
            let w: TurnWire = args(a)?;
            return engine.turn_step(caller, v, turn_args(w), ticket);
        }
    };
    out.map(TurnStep::Done)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)] // a real state dir
    use super::*;
    use room_core::refusal::PageItems;
    use serde_json::value::RawValue;

    fn refused_with(items: &str, policy_sha256: &str) -> Refusal {
        Refusal {
            page_items: Some(Box::new(PageItems {
                items: vec![Arc::from(RawValue::from_string(items.into()).unwrap())],
                policy_sha256: policy_sha256.into(),
            })),
            ..Refusal::new(Code::RoomSyncRequired, "unread events")
                .detail(json!({"next_page": {"receipt": "rcpt_1"}}))
        }
    }

    /// Kept page items pass egress as they are only under the policy they were rendered with.
    #[test]
    fn kept_page_items_are_redacted_again_under_another_policy() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let state =
            room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "i").unwrap();
        std::fs::write(
            state.root.join("config.toml"),
            "[redaction]\npatterns = [\"secret-[0-9]+\"]\n",
        )
        .unwrap();
        let engine = Engine::open(
            state.clone(),
            crate::daemon::real_env(),
            crate::daemon::embedded_store(&state),
            room_engine::EngineConfig::default(),
        )
        .unwrap();
        let current = engine
            .policy()
            .redactor()
            .unwrap()
            .policy_sha256()
            .to_string();
        let item = r#"{"seq":1,"event":{"text":"the code is secret-123"}}"#;
        let out = |policy: &str| {
            let r = egress(&engine, Err(refused_with(item, policy)));
            serde_json::to_string(&r).unwrap()
        };
        let stale = out("an earlier policy");
        assert!(
            stale.contains("the code is") && !stale.contains("secret-123"),
            "{stale}"
        );
        // under its own policy the rendering already passed this redactor: it goes as it is
        assert!(out(&current).contains("secret-123"));
    }
}
