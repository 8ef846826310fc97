//! Working trees for a collaboration's implementing roles (issue 41, item 1): each works in
//! a tree of its own beneath the state directory's `trees/`, never in the person's checkout,
//! and its `diff` is taken from that tree against the base recorded when the tree was made.
//!
//! A git project is cloned (`git clone --no-checkout`, then the base commit checked out
//! detached): a clone rather than `git worktree`, because a worktree keeps its index and
//! HEAD inside the project's own `.git`, which the worker sees read-only and which would
//! otherwise collect the collaboration's bookkeeping. The base is the project's `HEAD`
//! commit; changes not committed there are not in it (the caller is told). A project that is
//! not a git repository is copied (bounded: regular files, directories and links, nothing
//! else) and made a repository with one commit, the base, so a diff is the same operation in
//! both.
//!
//! Beside the role trees sits `base`: a checkout of the base no worker writes, where a
//! diff is checked to apply (`git apply --check`, run confined by the engine's runner).
//!
//! Git runs here as the daemon, on the person's project (their own repository) and on trees
//! no worker has touched yet; with no system config, no hooks and no prompt. Anything run in
//! a tree a worker has written runs confined (the runner), never here.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Files a copied (non-git) project may hold at most.
pub const COPY_FILES_MAX: usize = 20_000;
/// Bytes a copied (non-git) project may hold at most.
pub const COPY_BYTES_MAX: u64 = 512 * 1024 * 1024;
/// Directory depth a copied project may reach at most.
pub const COPY_DEPTH_MAX: usize = 64;

/// How a collaboration's trees were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The base commit every tree of the collaboration starts at.
    pub commit: String,
    /// `git` (a clone of the project's repository) or `copy` (a staged copy).
    pub source: &'static str,
    /// The checkout of the base no worker writes (`<dir>/base`).
    pub tree: PathBuf,
    /// The project had changes not committed at its `HEAD` (not in the base).
    pub uncommitted: bool,
}

fn git(dir: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    cmd.args([
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "safe.directory=*",
        "-c",
        "user.name=Room",
        "-c",
        "user.email=room@localhost",
        "-c",
        "commit.gpgsign=false",
    ])
    .args(args)
    .env("GIT_CONFIG_NOSYSTEM", "1")
    .env("GIT_TERMINAL_PROMPT", "0")
    .stdin(Stdio::null());
    cmd
}

/// Run `cmd`; its standard output on success, else what it said.
fn run(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed");
        return Err(format!("{what}: {line}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn is_git(project: &Path) -> bool {
    project.join(".git").exists()
}

/// Make `<dir>/base` from `project` and record the base (see the module comment). `dir` must
/// not exist yet; on failure nothing is left of it.
pub fn make_base(project: &Path, dir: &Path) -> Result<Base, String> {
    std::fs::DirBuilder::new()
        .recursive(false)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let made = make_base_in(project, dir);
    if made.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    made
}

fn make_base_in(project: &Path, dir: &Path) -> Result<Base, String> {
    let tree = dir.join("base");
    if is_git(project) {
        let commit = run(
            git(Some(project), &["rev-parse", "--verify", "HEAD^{commit}"]),
            "the project's HEAD",
        )?;
        let status = run(
            git(
                Some(project),
                &["status", "--porcelain", "--untracked-files=no"],
            ),
            "the project's status",
        )?;
        clone_at(project, &tree, &commit)?;
        return Ok(Base {
            commit,
            source: "git",
            tree,
            uncommitted: !status.is_empty(),
        });
    }
    let mut budget = (COPY_FILES_MAX, COPY_BYTES_MAX);
    copy_dir(project, &tree, 0, &mut budget)?;
    run(
        git(Some(&tree), &["init", "--quiet"]),
        "the copy's repository",
    )?;
    run(git(Some(&tree), &["add", "--all"]), "the copy's files")?;
    run(
        git(
            Some(&tree),
            &["commit", "--quiet", "--allow-empty", "-m", "base"],
        ),
        "the copy's base commit",
    )?;
    let commit = run(
        git(Some(&tree), &["rev-parse", "--verify", "HEAD^{commit}"]),
        "the copy's base commit",
    )?;
    Ok(Base {
        commit,
        source: "copy",
        tree,
        uncommitted: false,
    })
}

/// A role's tree `<dir>/<name>`, at the base: a clone of the project's repository (or, for
/// a copied project, of the base tree), the base checked out detached.
pub fn make_role_tree(
    project: &Path,
    dir: &Path,
    name: &str,
    base: &Base,
) -> Result<PathBuf, String> {
    if name.is_empty() || name == "base" || name.contains('/') || name.starts_with('.') {
        return Err(format!("{name:?} is not a tree name"));
    }
    let tree = dir.join(name);
    let source = if base.source == "git" {
        project
    } else {
        base.tree.as_path()
    };
    clone_at(source, &tree, &base.commit)?;
    Ok(tree)
}

/// The gate's tree `<dir>/gate`, made afresh: the base with `patch` (if any) applied (`git apply`, run
/// here in a tree only Room has written; applying runs nothing of the patch's). A gate's
/// checks measure it: the diff under review, never the person's checkout nor the
/// implementer's tree.
pub fn make_gate_tree(
    project: &Path,
    dir: &Path,
    base: &Base,
    patch: &str,
) -> Result<PathBuf, String> {
    let tree = dir.join("gate");
    match std::fs::remove_dir_all(&tree) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", tree.display())),
    }
    let source = if base.source == "git" {
        project
    } else {
        base.tree.as_path()
    };
    clone_at(source, &tree, &base.commit)?;
    if patch.is_empty() {
        return Ok(tree);
    }
    let mut apply = git(Some(&tree), &["apply", "--whitespace=nowarn", "-"]);
    apply
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = apply.spawn().map_err(|e| format!("git apply: {e}"))?;
    {
        use std::io::Write;
        let mut w = child.stdin.take().expect("stdin was piped");
        // a git that stops reading early says why on stderr
        let _ = w.write_all(patch.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("git apply: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "the diff does not apply at the base: {}",
            err.lines().next().unwrap_or("git apply failed")
        ));
    }
    Ok(tree)
}

fn clone_at(source: &Path, tree: &Path, commit: &str) -> Result<(), String> {
    let mut clone = git(None, &["clone", "--quiet", "--no-checkout", "--"]);
    clone.arg(source).arg(tree);
    run(clone, "cloning the project")?;
    let done = run(
        git(Some(tree), &["checkout", "--quiet", "--detach", commit]),
        "checking out the base",
    );
    if done.is_err() {
        let _ = std::fs::remove_dir_all(tree);
    }
    done.map(|_| ())
}

/// Copy `from` into `to` (made), bounded by `budget` (files, bytes): directories, regular
/// files (their mode's execute bits kept) and symbolic links (as links, never followed);
/// anything else is left out. `.git` is not there to copy (the project is not a repository).
fn copy_dir(from: &Path, to: &Path, depth: usize, budget: &mut (usize, u64)) -> Result<(), String> {
    if depth > COPY_DEPTH_MAX {
        return Err(format!(
            "{}: deeper than {COPY_DEPTH_MAX} directories",
            from.display()
        ));
    }
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(to)
        .map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let meta =
            std::fs::symlink_metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            copy_dir(&src, &dst, depth + 1, budget)?;
            continue;
        }
        if !ft.is_file() && !ft.is_symlink() {
            continue;
        }
        budget.0 = budget
            .0
            .checked_sub(1)
            .ok_or_else(|| format!("the project holds more than {COPY_FILES_MAX} files to copy"))?;
        if ft.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            std::os::unix::fs::symlink(target, &dst)
                .map_err(|e| format!("{}: {e}", dst.display()))?;
            continue;
        }
        budget.1 = budget
            .1
            .checked_sub(meta.len())
            .ok_or_else(|| format!("the project holds more than {COPY_BYTES_MAX} bytes to copy"))?;
        std::fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, line: &str) -> String {
        let out = Command::new("/bin/sh")
            .args(["-c", line])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_git_project_is_cloned_at_its_head_and_its_checkout_is_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let project = tmp.path().join("p");
        std::fs::create_dir_all(&project).unwrap();
        sh(
            &project,
            "git init -q && echo one > a && git add a && git -c user.name=t -c user.email=t@t commit -qm one && echo dirty >> a",
        );
        let dir = tmp.path().join("trees/c1");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        let base = make_base(&project, &dir).unwrap();
        assert_eq!(base.source, "git");
        assert!(base.uncommitted, "the dirty checkout is said");
        assert_eq!(
            std::fs::read_to_string(base.tree.join("a")).unwrap(),
            "one\n"
        );
        let t = make_role_tree(&project, &dir, "impl", &base).unwrap();
        assert_eq!(sh(&t, "git rev-parse HEAD").trim(), base.commit);
        std::fs::write(t.join("a"), "two\n").unwrap();
        std::fs::write(t.join("b"), "new\n").unwrap();
        // the diff against the base, taken as the runner would (fd 3 is the output)
        let patch = sh(
            &t,
            &format!(
                "git add --all . && git diff --cached --binary {}",
                base.commit
            ),
        );
        assert!(
            patch.contains("+two") && patch.contains("+++ b/b"),
            "{patch}"
        );
        // it applies at the base, and the person's checkout never changed
        let mut apply = Command::new("git")
            .args(["apply", "--check", "-"])
            .current_dir(&base.tree)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        apply
            .stdin
            .take()
            .unwrap()
            .write_all(patch.as_bytes())
            .unwrap();
        assert!(apply.wait().unwrap().success());
        assert_eq!(
            std::fs::read_to_string(project.join("a")).unwrap(),
            "one\ndirty\n"
        );
        let gate = make_gate_tree(&project, &dir, &base, &patch).unwrap();
        assert_eq!(std::fs::read_to_string(gate.join("a")).unwrap(), "two\n");
        assert_eq!(std::fs::read_to_string(gate.join("b")).unwrap(), "new\n");
        // made afresh each time: an earlier gate's leftovers are gone
        std::fs::write(gate.join("left"), "x").unwrap();
        let gate = make_gate_tree(&project, &dir, &base, &patch).unwrap();
        assert!(!gate.join("left").exists());
        assert!(
            make_gate_tree(
                &project,
                &dir,
                &base,
                "--- a/zz\n+++ b/zz\n@@ -1 +1 @@\n-q\n+r\n"
            )
            .is_err()
        );
        assert!(make_role_tree(&project, &dir, "base", &base).is_err());
        assert!(make_role_tree(&project, &dir, "../x", &base).is_err());
        assert!(make_base(&project, &dir).is_err(), "a base is made once");
    }

    #[test]
    fn a_plain_project_is_copied_bounded_and_made_a_repository() {
        let tmp = tempfile::tempdir().unwrap();
        let project = tmp.path().join("p");
        std::fs::create_dir_all(project.join("src")).unwrap();
        std::fs::write(project.join("src/a.sh"), "echo hi\n").unwrap();
        std::fs::set_permissions(
            project.join("src/a.sh"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", project.join("link")).unwrap();
        let dir = tmp.path().join("c2");
        let base = make_base(&project, &dir).unwrap();
        assert_eq!((base.source, base.uncommitted), ("copy", false));
        let t = make_role_tree(&project, &dir, "impl", &base).unwrap();
        assert_eq!(
            std::fs::read_to_string(t.join("src/a.sh")).unwrap(),
            "echo hi\n"
        );
        let mode = std::fs::metadata(t.join("src/a.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        // a link stays a link, never followed
        assert_eq!(
            std::fs::read_link(t.join("link")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
    }
}
