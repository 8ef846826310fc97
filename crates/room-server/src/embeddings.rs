//! Semantic search's HTTP side (issue 46): the owner's OpenAI-compatible embeddings endpoint
//! (`[search.embeddings]` in config.toml) is called only from here. The indexer embeds the
//! redacted text the engine hands it (`Engine::embedding_work`), in its own task, away from
//! every write: a commit never waits on it and an endpoint that is down delays only the
//! vectors. A semantic query's own vector is asked for when the query is made; an endpoint
//! that cannot give it is `embeddings_unavailable`, never a guess.
//!
//! The engine decides nothing here and this module decides nothing about who may read what:
//! it moves text to the endpoint and vectors back.

use room_core::{Code, Refusal};
use room_engine::Engine;
use room_engine::policy::Embeddings;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The most bytes an endpoint's answer may have.
const ANSWER_BYTES_MAX: usize = 64 << 20;
/// How often the indexer looks for events without vectors when it found none last time.
const IDLE_MS: u64 = 1_000;
/// After an endpoint failed, how long the indexer waits before asking it again.
const BACKOFF_MS: u64 = 10_000;
/// The longest a semantic query waits for its own vector.
const QUERY_TIMEOUT_MS: u64 = 10_000;
/// Requests one indexer pass makes at most (the rest waits for the next pass).
const REQUESTS_PER_PASS_MAX: usize = 8;

/// Ask `e`'s endpoint for one vector per text, in order.
pub async fn embed(
    http: &reqwest::Client,
    e: &Embeddings,
    texts: &[String],
) -> Result<Vec<Vec<f32>>, String> {
    let url = format!("{}/embeddings", e.base_url.trim_end_matches('/'));
    let mut req = http
        .post(&url)
        .timeout(Duration::from_millis(e.timeout_ms))
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&json!({"model": e.model, "input": texts}))
                .expect("request bodies serialize"),
        );
    if let Some(var) = &e.api_key_env {
        let key = std::env::var(var).map_err(|_| format!("{var} is not set in the daemon"))?;
        req = req.bearer_auth(key);
    }
    let mut resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > ANSWER_BYTES_MAX {
            return Err(format!("{url}: an answer over {ANSWER_BYTES_MAX} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        return Err(format!(
            "{url}: {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    vectors(&body, texts.len()).map_err(|why| format!("{url}: {why}"))
}

/// The vectors of an OpenAI-style answer (`data[].embedding`, placed by `index`).
fn vectors(body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let data = v["data"].as_array().ok_or("no data array")?;
    if data.len() != n {
        return Err(format!("{} vectors for {n} texts", data.len()));
    }
    let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
    for (i, d) in data.iter().enumerate() {
        let at = d["index"].as_u64().map_or(i, |x| x as usize);
        let slot = out.get_mut(at).ok_or("an index past the texts")?;
        let nums = d["embedding"]
            .as_array()
            .ok_or("an embedding that is not a list")?;
        let vec: Option<Vec<f32>> = nums.iter().map(|x| x.as_f64().map(|f| f as f32)).collect();
        *slot = Some(vec.ok_or("an embedding with a component that is not a number")?);
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| "a text without its vector".to_string()))
        .collect()
}

/// The daemon's [`QueryEmbedder`]: the owner's endpoint, when one is configured.
pub struct Endpoint(pub Arc<Embeddings>);

impl room_engine::search::QueryEmbedder for Endpoint {
    fn embed(&self, query: &str) -> Result<(String, Vec<f32>), Refusal> {
        Ok((self.0.model.clone(), query_vector(&self.0, query)?))
    }
}

/// The endpoint of `engine`'s policy, if it has one.
pub fn endpoint(engine: &Engine) -> Option<Endpoint> {
    engine.policy().embeddings.map(Endpoint)
}

/// The query's vector, for a semantic search made on a blocking thread: asked on a runtime of
/// this module's own (a request handler may be on any thread), waited for here.
pub fn query_vector(e: &Embeddings, query: &str) -> Result<Vec<f32>, Refusal> {
    static RT: std::sync::LazyLock<Option<tokio::runtime::Runtime>> =
        std::sync::LazyLock::new(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("room-embeddings")
                .enable_all()
                .build()
                .ok()
        });
    let unavailable = |why: String| {
        Refusal::new(
            Code::EmbeddingsUnavailable,
            format!("the embeddings endpoint gave no vector for the query: {why}"),
        )
        .hint("check [search.embeddings] in config.toml and that its endpoint answers, or search as text")
    };
    let rt = RT
        .as_ref()
        .ok_or_else(|| unavailable("no runtime for its requests".into()))?;
    let http = room_agents::api::client().map_err(unavailable)?;
    let (tx, rx) = std::sync::mpsc::channel();
    // a query holds one of the engine's threads while it waits: never long
    let mut e2 = e.clone();
    e2.timeout_ms = e2.timeout_ms.min(QUERY_TIMEOUT_MS);
    let e = &e2.clone();
    let text = vec![query.to_string()];
    rt.spawn(async move {
        let _ = tx.send(embed(&http, &e2, &text).await);
    });
    let wait = Duration::from_millis(e.timeout_ms.saturating_add(1_000));
    match rx.recv_timeout(wait) {
        Ok(Ok(mut v)) => Ok(v.pop().expect("one vector for one text")),
        Ok(Err(why)) => Err(unavailable(why)),
        Err(_) => Err(unavailable(format!("no answer within {} ms", e.timeout_ms))),
    }
}

/// The indexer: while an endpoint is configured, embed every room's events that have no
/// vector for its model yet, a bounded number of requests per pass, the rooms taken in turn.
/// A room whose batch fails is left for the next pass (its error logged once); the others go
/// on.
pub async fn indexer(engine: Arc<Engine>) {
    let http = match room_agents::api::client() {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("semantic search's indexer has no HTTP client: {e}");
            return;
        }
    };
    let mut state = Indexer::default();
    loop {
        let pause = match pass(&engine, &http, &mut state).await {
            Pass::Busy => 0,
            Pass::Idle => IDLE_MS,
            Pass::Failed => BACKOFF_MS,
        };
        if pause > 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// What the indexer keeps between passes.
#[derive(Default)]
struct Indexer {
    /// Per room and model, the highest seq embedded (from the start after a restart).
    after: BTreeMap<(String, String), u64>,
    /// The room the next pass starts with (each pass starts one further on).
    turn: usize,
    /// The last error logged per room (each logged once until it changes).
    errors: BTreeMap<String, String>,
}

enum Pass {
    Busy,
    Idle,
    Failed,
}

async fn pass(engine: &Arc<Engine>, http: &reqwest::Client, st: &mut Indexer) -> Pass {
    let Some(cfg) = engine.policy().embeddings.clone() else {
        return Pass::Idle;
    };
    let e = engine.clone();
    let mut rooms = match blocking(move || e.embedding_rooms()).await {
        Ok(r) => r,
        Err(why) => {
            tracing::warn!("semantic search's indexer: the rooms: {why}");
            return Pass::Failed;
        }
    };
    if rooms.is_empty() {
        return Pass::Idle;
    }
    st.turn = (st.turn + 1) % rooms.len();
    rooms.rotate_left(st.turn);
    let (mut requests, mut failed) = (0, false);
    for room in rooms {
        if requests >= REQUESTS_PER_PASS_MAX {
            break;
        }
        match embed_room(
            engine,
            http,
            &cfg,
            &room,
            st,
            REQUESTS_PER_PASS_MAX - requests,
        )
        .await
        {
            Ok(n) => {
                requests += n;
                st.errors.remove(&room);
            }
            Err(why) => {
                failed = true;
                if st.errors.get(&room) != Some(&why) {
                    tracing::warn!("semantic search's indexer: room {room}: {why} (retrying)");
                    st.errors.insert(room, why);
                }
            }
        }
    }
    match (requests, failed) {
        (0, true) => Pass::Failed,
        (0, false) => Pass::Idle,
        _ => Pass::Busy,
    }
}

/// Embed `room`'s events without a vector, at most `budget` requests: how many were made.
async fn embed_room(
    engine: &Arc<Engine>,
    http: &reqwest::Client,
    cfg: &Arc<Embeddings>,
    room: &str,
    st: &mut Indexer,
    budget: usize,
) -> Result<usize, String> {
    let key = (room.to_string(), cfg.model.clone());
    let mut requests = 0;
    while requests < budget {
        let from = st.after.get(&key).copied().unwrap_or(0);
        let (e, r, m, n) = (
            engine.clone(),
            room.to_string(),
            cfg.model.clone(),
            cfg.batch_max,
        );
        let work = blocking(move || e.embedding_work(&r, &m, from, n)).await?;
        let Some(last) = work.last().map(|w| w.seq) else {
            break;
        };
        requests += 1;
        let texts: Vec<String> = work.iter().map(|w| w.text.clone()).collect();
        let vectors = embed(http, cfg, &texts).await?;
        let rows: Vec<_> = work.into_iter().zip(vectors).collect();
        let (e, r, m) = (engine.clone(), room.to_string(), cfg.model.clone());
        let skipped = blocking(move || e.embeddings_put(&r, &m, rows)).await?;
        if !skipped.is_empty() {
            tracing::warn!(
                "semantic search's indexer: room {room}: the endpoint gave events {skipped:?} no usable vector"
            );
        }
        st.after.insert(key.clone(), last);
    }
    Ok(requests)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(r)) => Err(r.to_string()),
        Err(e) => Err(format!("a blocking call failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_s_vectors_are_placed_by_their_index() {
        let body = br#"{"data": [{"index": 1, "embedding": [0.5, 1]}, {"index": 0, "embedding": [2, 3]}]}"#;
        assert_eq!(
            vectors(body, 2).unwrap(),
            vec![vec![2.0, 3.0], vec![0.5, 1.0]]
        );
        assert!(vectors(body, 3).is_err(), "a count that differs");
        assert!(vectors(br#"{"data": [{"embedding": ["x"]}]}"#, 1).is_err());
        assert!(vectors(br#"{"data": [{"index": 5, "embedding": [1]}]}"#, 1).is_err());
        assert!(vectors(b"not json", 1).is_err());
    }
}
