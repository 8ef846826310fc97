//! Routes from the owner console: `room route set|remove|list` edit config.toml's
//! `[routes.<agent>]` tables in place, the rest of the file (comments, order, other tables)
//! kept as written. A change is checked as the policy loader would read the whole new file;
//! a file that would not load is never written. The policy cache notices the new file at the
//! next call, as it does a hand edit.

use crate::policy::{Route, check_config};
use crate::{Engine, Outcome, store_err};
use room_core::{Code, Refusal, name};
use serde_json::{Value, json};
use std::sync::Mutex;

/// One edit of config.toml at a time: each reads the file it rewrites.
static EDITING: Mutex<()> = Mutex::new(());

/// A route's fields as TOML values: strings, integers and lists of strings, as `Route` has.
fn toml_item(field: &str, v: &Value) -> Result<toml_edit::Item, Refusal> {
    let bad = || Refusal::invalid(field, "a string, a whole number or a list of strings");
    let value: toml_edit::Value = match v {
        Value::String(s) => s.as_str().into(),
        Value::Number(n) => n.as_i64().ok_or_else(bad)?.into(),
        Value::Array(a) => {
            let mut arr = toml_edit::Array::new();
            for x in a {
                arr.push(x.as_str().ok_or_else(bad)?);
            }
            arr.into()
        }
        _ => return Err(bad()),
    };
    Ok(toml_edit::Item::Value(value))
}

impl Engine {
    fn config_text(&self) -> Outcome<String> {
        match self.env.fs.read(&self.state.config()) {
            Ok(b) => String::from_utf8(b).map_err(|_| Refusal::storage("config.toml is not UTF-8")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(Refusal::storage(format!("config.toml: {e}"))),
        }
    }

    fn config_doc(&self) -> Outcome<toml_edit::DocumentMut> {
        self.config_text()?
            .parse()
            .map_err(|e| Refusal::storage(format!("config.toml does not parse: {e}")))
    }

    /// Check the whole new file as the policy loader reads it, then write it durably.
    fn write_config(&self, doc: &toml_edit::DocumentMut) -> Outcome<()> {
        let text = doc.to_string();
        check_config(text.as_bytes()).map_err(|why| {
            Refusal::invalid("route", why)
                .hint("config.toml would not load with this change: nothing was written")
        })?;
        self.env
            .fs
            .write_atomic(&self.state.config(), text.as_bytes())
            .map_err(|e| Refusal::storage(format!("config.toml: {e}")))
    }

    /// `route_set`: deliver `agent`'s wakes through `route` (a `[routes.<agent>]` table as
    /// JSON), replacing its route if it had one.
    pub fn route_set(&self, _owner: &crate::Owner, agent: &str, route: &Value) -> Outcome<Value> {
        name::validate("agent", agent)?;
        if self.control().agent(agent).map_err(store_err)?.is_none() {
            return Err(
                Refusal::new(Code::NotFound, format!("no agent named {agent:?}"))
                    .hint("enroll it first: room agent enroll NAME"),
            );
        }
        let fields = route.as_object().ok_or_else(|| {
            Refusal::invalid("route", "an object such as {\"adapter\": \"script\"}")
        })?;
        // the shape the loader accepts, field names included
        serde_json::from_value::<Route>(route.clone())
            .map_err(|e| Refusal::invalid("route", e.to_string()))?;
        let mut table = toml_edit::Table::new();
        for (k, v) in fields {
            table.insert(k, toml_item(&format!("route.{k}"), v)?);
        }
        let _one = EDITING.lock().unwrap_or_else(|p| p.into_inner());
        let mut doc = self.config_doc()?;
        let routes = doc
            .entry("routes")
            .or_insert_with(|| {
                let mut t = toml_edit::Table::new();
                t.set_implicit(true);
                toml_edit::Item::Table(t)
            })
            .as_table_mut()
            .ok_or_else(|| Refusal::invalid("route", "config.toml's routes is not a table"))?;
        routes.insert(agent, toml_edit::Item::Table(table));
        self.write_config(&doc)?;
        Ok(json!({"agent": agent, "route": route, "config": self.state.config()}))
    }

    /// `route_remove`: `agent`'s wakes stay queued for its own session again.
    pub fn route_remove(&self, _owner: &crate::Owner, agent: &str) -> Outcome<Value> {
        name::validate("agent", agent)?;
        let _one = EDITING.lock().unwrap_or_else(|p| p.into_inner());
        let mut doc = self.config_doc()?;
        let removed = doc
            .get_mut("routes")
            .and_then(|r| r.as_table_mut())
            .and_then(|r| r.remove(agent));
        if removed.is_none() {
            return Err(Refusal::new(
                Code::NotFound,
                format!("agent {agent:?} has no route in config.toml"),
            ));
        }
        self.write_config(&doc)?;
        Ok(json!({"agent": agent, "removed": true}))
    }

    /// `routes_list`: the routes config.toml gives, as written.
    pub fn routes_list(&self, _owner: &crate::Owner) -> Outcome<Value> {
        let text = self.config_text()?;
        let v: toml::Value = toml::from_str(&text)
            .map_err(|e| Refusal::storage(format!("config.toml does not parse: {e}")))?;
        let routes = v
            .get("routes")
            .map(|r| serde_json::to_value(r).expect("toml values convert"))
            .unwrap_or_else(|| json!({}));
        Ok(json!({"routes": routes, "config": self.state.config()}))
    }
}
