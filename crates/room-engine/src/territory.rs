//! Territory: project grants pinned to path and kernel object identity. A grant records the
//! requested and canonical roots and the (device, inode, mount id) of both; every
//! project-scoped call re-derives them, and any change is `project_root_redirected`.

use crate::authority::Authority;
use crate::{Outcome, store_err};
use room_core::{Code, ObjectId, Refusal, id, name};
use room_store::control::ProjectRow;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn refused(reason: &str, path: &Path) -> Refusal {
    Refusal::new(
        Code::ProjectTerritoryRefused,
        format!("{} cannot be a project: {reason}", path.display()),
    )
    .detail(json!({"reason": reason, "path": path.display().to_string()}))
}

fn redirected(p: &ProjectRow, why: String) -> Refusal {
    Refusal::new(Code::ProjectRootRedirected, format!("project {} root {}: {why}", p.id, p.requested_root))
        .detail(json!({"project": p.id, "root": p.requested_root}))
        .hint("the directory was replaced, renamed or turned into a symlink; open it again as a new project")
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The kernel's and the system's own trees: never project territory, nor anything inside them
/// (the only directory around them is `/`, refused on its own).
pub const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev", "/run", "/etc"];

impl Authority {
    /// Open a project grant over `requested`.
    pub fn project_open(
        &self,
        _owner: &crate::Owner,
        requested: &str,
        project_name: Option<&str>,
        owner_config_dirs: &[PathBuf],
    ) -> Outcome<Value> {
        if requested.is_empty() || requested.contains('\0') {
            return Err(Refusal::invalid(
                "path",
                "must be a non-empty path without NUL",
            ));
        }
        let fs = &self.env.fs;
        let req = PathBuf::from(requested);
        if !req.is_absolute() {
            return Err(Refusal::invalid("path", "must be absolute"));
        }
        let canonical = fs
            .canonicalize(&req)
            .map_err(|e| refused(&format!("cannot resolve ({e})"), &req))?;
        if !fs
            .is_dir_nofollow(&canonical)
            .map_err(|e| refused(&format!("cannot stat ({e})"), &req))?
        {
            return Err(refused("not a directory", &req));
        }
        if canonical.parent().is_none() {
            return Err(refused("the filesystem root", &req));
        }
        if let Ok(home) = fs.canonicalize(&room_store::statedir::home())
            && canonical == home
        {
            return Err(refused("the owner's home directory itself", &req));
        }
        // Checked on the canonical path, so a symlink to any of them is refused as they are.
        for sys in SYSTEM_DIRS {
            let sys = Path::new(sys);
            let resolved = fs.canonicalize(sys).unwrap_or_else(|_| sys.to_path_buf());
            if canonical.starts_with(sys) || canonical.starts_with(&resolved) {
                return Err(refused("a system directory", &req).detail(json!({
                    "reason": "a system directory",
                    "system_dir": sys.display().to_string(),
                    "path": req.display().to_string(),
                })));
            }
        }
        for dir in owner_config_dirs {
            let resolved = fs.canonicalize(dir).unwrap_or_else(|_| dir.clone());
            if overlaps(&canonical, dir) || overlaps(&canonical, &resolved) {
                return Err(refused(
                    "overlaps the owner's configuration directory",
                    &req,
                ));
            }
        }
        if overlaps(&canonical, &self.state.root) {
            return Err(refused(
                "overlaps the room state directory (or a worker root inside it)",
                &req,
            ));
        }
        let canonical_str = canonical
            .to_str()
            .ok_or_else(|| Refusal::invalid("path", "canonical path is not UTF-8"))?
            .to_string();
        let display_name = match project_name {
            Some(n) => {
                name::validate("name", n)?;
                n.to_string()
            }
            None => canonical
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("project")
                .to_string(),
        };
        let oid = fs
            .object_id(&canonical)
            .map_err(|e| refused(&format!("cannot stat ({e})"), &req))?;
        let req_oid = fs
            .object_id(&req)
            .map_err(|e| refused(&format!("cannot stat ({e})"), &req))?;
        let mut c = self.control();
        for p in c.projects().map_err(store_err)? {
            if overlaps(&canonical, Path::new(&p.canonical_root)) {
                return Err(refused(
                    &format!("overlaps project {} at {}", p.id, p.canonical_root),
                    &req,
                )
                .detail(json!({"reason": "overlap", "project": p.id, "path": requested})));
            }
        }
        let row = ProjectRow {
            id: id::project_id(self.env.entropy.as_ref()),
            name: display_name,
            requested_root: requested.into(),
            canonical_root: canonical_str,
            dev: oid.dev,
            ino: oid.ino,
            mnt_id: oid.mnt_id,
            opened_ms: self.now_ms(),
        };
        c.insert_project(&row).map_err(store_err)?;
        drop(c);
        // The requested path's own identity (it may be a symlink) is pinned beside the root's.
        self.pin_requested(&row, req_oid)?;
        Ok(project_view(&row))
    }

    fn pin_requested(&self, row: &ProjectRow, oid: ObjectId) -> Outcome<()> {
        let bytes = serde_json::to_vec(&oid).map_err(Refusal::storage)?;
        self.env
            .fs
            .write_atomic(&self.state.project_pin(&row.id), &bytes)
            .map_err(Refusal::storage)
    }

    /// Re-derive a grant: requested path still resolves to the recorded canonical root, and
    /// both keep their recorded kernel identity.
    pub fn revalidate_project(&self, project_id: &str) -> Outcome<ProjectRow> {
        let p = self
            .control()
            .project(project_id)
            .map_err(store_err)?
            .ok_or_else(|| Refusal::new(Code::NotFound, format!("no project {project_id}")))?;
        if crate::planted::bug("04-C01") {
            return Ok(p);
        }
        let fs = &self.env.fs;
        let canonical = fs
            .canonicalize(Path::new(&p.requested_root))
            .map_err(|e| redirected(&p, format!("no longer resolves ({e})")))?;
        if canonical.to_str() != Some(p.canonical_root.as_str()) {
            return Err(redirected(
                &p,
                format!("now resolves to {}", canonical.display()),
            ));
        }
        let oid = fs
            .object_id(&canonical)
            .map_err(|e| redirected(&p, format!("cannot stat ({e})")))?;
        if oid
            != (ObjectId {
                dev: p.dev,
                ino: p.ino,
                mnt_id: p.mnt_id,
            })
        {
            return Err(redirected(
                &p,
                "is a different directory object than the one granted".into(),
            ));
        }
        let want: ObjectId = fs
            .read(&self.state.project_pin(&p.id))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| redirected(&p, "its pinned identity record is missing".into()))?;
        let now = fs
            .object_id(Path::new(&p.requested_root))
            .map_err(|e| redirected(&p, format!("cannot stat ({e})")))?;
        if now != want {
            return Err(redirected(
                &p,
                "the requested path was replaced (for example by a symlink)".into(),
            ));
        }
        Ok(p)
    }

    pub fn projects_view(&self, _owner: &crate::Owner) -> Outcome<Value> {
        let c = self.control();
        let rows = c.projects().map_err(store_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for p in &rows {
            let mut v = project_view(p);
            v["source"] = json!(c.project_source(&p.id).map_err(store_err)?);
            out.push(v);
        }
        Ok(json!({"projects": out}))
    }
}

pub fn project_view(p: &ProjectRow) -> Value {
    json!({
        "id": p.id, "name": p.name, "requested_root": p.requested_root, "canonical_root": p.canonical_root,
        "root_object_id": {"dev": p.dev, "ino": p.ino, "mnt_id": p.mnt_id},
    })
}
