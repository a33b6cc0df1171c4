//! Live reload (SPEC §6): the file changing (its directory is watched, so rename-over and
//! Kubernetes symlink swaps are seen), SIGHUP, or `POST /admin/reload`. A reload parses,
//! validates and compiles off the request path, then swaps the table in one atomic store.
//! A bad file changes nothing.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};

use super::Runtime;
use crate::config::file::{File, Listen};
use crate::config::Loaded;
use crate::config::{self, ConfigError, ConfigErrors};
use crate::model::limit::Charge;
use crate::model::table::Boot;
use crate::pipeline::live::Live;

/// How long a file that does not parse is given to finish being written (see [`reload`]).
const SETTLE: Duration = Duration::from_millis(150);

/// Why a reload happened; file events with unchanged content are not reloads at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    File,
    Signal,
    Admin,
}

/// Reload from `gw.config_path`. Returns the new version, or every error (old config kept).
pub fn reload(gw: &Runtime, trigger: Trigger) -> Result<String, ConfigErrors> {
    let _serial = gw.reload_lock.lock();
    let name = gw.config_path.display().to_string();
    let read = || config::read(&gw.config_path, "config");
    let raw = std::fs::read_to_string(&gw.config_path);
    // Out of descriptors or memory for a moment says nothing of the file: it is looked at
    // again at the next event, and neither a bad edit nor a change is counted.
    if let (Trigger::File, Err(e)) = (trigger, &raw) {
        if transient(e) {
            tracing::warn!(error = %e, "cannot read the config now; the running config is kept");
            return Ok(gw.live.load().table.version.clone());
        }
    }
    let mut text = raw.map_err(|e| config::read_error(&gw.config_path, "config", &e));
    // Editors write several events per save, and a directory holds more than the config: a
    // file event acts only when the config or a file it reads changed. Checked first, on the
    // raw bytes, so an unrelated file in the directory costs no parse.
    let unchanged = |text: &Result<String, ConfigErrors>| {
        let seen = gw.last_seen.lock();
        fingerprint_of(text.as_deref().unwrap_or(""), &seen.files) == seen.hash
    };
    if trigger == Trigger::File {
        if unchanged(&text) {
            return Ok(gw.live.load().table.version.clone());
        }
        // A file event can land between an in-place writer's truncate and its write: content
        // that does not parse is looked at again once the writer had time to finish, and only
        // content that is still the same counts as a bad edit.
        for _ in 0..3 {
            let parses = text
                .as_deref()
                .is_ok_and(|t| config::parse(&name, t).is_ok());
            if parses {
                break;
            }
            std::thread::sleep(SETTLE);
            let again = read();
            if again.as_ref().ok() == text.as_ref().ok() {
                break;
            }
            text = again;
        }
        if unchanged(&text) {
            return Ok(gw.live.load().table.version.clone());
        }
    }
    // The files the new text reads (certificates, consumers_file; those last seen when it
    // does not parse): their directories are watched from now on, and their bytes are part of
    // what a file event is compared with, so a missing file that appears later is a reload.
    let files = text
        .as_deref()
        .ok()
        .and_then(|t| config::parse(&name, t).ok())
        .map(|f| config::compile::watched_files(&name, &f))
        .unwrap_or_else(|| gw.last_seen.lock().files.clone());
    watch_dirs(gw, &files);
    *gw.last_seen.lock() = Seen {
        hash: fingerprint_of(text.as_deref().unwrap_or(""), &files),
        files,
    };
    let result = text.and_then(|text| {
        let mut file = config::parse(&name, &text)?;
        // The store is built once at start: compile against the running store settings so
        // keys keep the running `key_prefix` (a changed store section waits for a restart).
        let running = &gw.live.load().file.store;
        if file.store != *running {
            // Checked as written first: the next restart runs it, so a store section that
            // would not start is refused now, not found then.
            config::compile_file(&name, &text, file.clone())?;
            tracing::warn!("store settings changed but need a restart; the running store is kept");
            file.store = running.clone();
        }
        config::compile_file(&name, &text, file)
            .and_then(|loaded| keep_valid_certificates(gw, loaded))
    });
    let result = result.map(|loaded| apply(gw, loaded));
    match &result {
        Ok(v) => {
            gw.metrics.reloads.with_label_values(&["success"]).inc();
            tracing::info!(?trigger, version = %v, "config reloaded");
        }
        Err(errors) => {
            gw.metrics.reloads.with_label_values(&["error"]).inc();
            for e in &errors.0 {
                tracing::error!(?trigger, "config reload rejected: {e}");
            }
        }
    }
    result
}

/// A reload does not put an expired certificate (a wrong file rotated in) where a valid one
/// runs: in a listener whose certificates are all valid, or for a name a valid one serves
/// (one long-expired leftover pair must not switch the guard off for the others). That is
/// an error, and the running ones are kept. An expired pair that runs already is not new,
/// and one for names nothing valid serves goes in with a warning, so an expired certificate
/// never blocks the reload that renews it, or any other.
fn keep_valid_certificates(gw: &Runtime, loaded: Loaded) -> Result<Loaded, ConfigErrors> {
    #[allow(clippy::disallowed_methods)] // certificate validity is wall-clock by definition
    let now = std::time::SystemTime::now();
    let mut errors = Vec::new();
    for (i, resolver) in gw.certificates.iter().enumerate() {
        let (Some(resolver), Some(j)) = (resolver, successor(&gw.boot, &loaded.boot, i)) else {
            continue;
        };
        let running = resolver.current();
        let all_valid = running.all_valid(now);
        for (_, e) in loaded
            .tls
            .expired
            .iter()
            .filter(|(l, e)| *l == j && !running.runs(e))
        {
            let why = match running.valid_for(&e.names, now) {
                _ if all_valid => {
                    "the listener's running certificates are all valid and are kept".to_string()
                }
                Some(name) => format!("a valid certificate for `{name}` runs and is kept"),
                None => continue,
            };
            let mut entry = e.entry.clone();
            entry.message = format!("{}: {why}", entry.message);
            errors.push(ConfigError::from(entry));
        }
    }
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Swap in a compiled table, keeping what only a restart can change.
fn apply(gw: &Runtime, loaded: Loaded) -> String {
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    let Loaded {
        boot,
        table: new,
        file: mut new_file,
        tls,
        ..
    } = loaded;
    let old_live = gw.live.load_full();
    let old = &old_live.table;
    let restart = gw.boot.changed(&boot);
    // `/admin/config` shows what runs, not what waits for a restart.
    let running = &old_live.file;
    // A listener's certificate list applies live; only a changed listener set waits.
    if restart.contains(&"listen") {
        new_file.listen = served_listeners(running, &new_file, &boot);
    }
    new_file.admin_listen.clone_from(&running.admin_listen);
    new_file.workers = running.workers;
    new_file.drain_timeout.clone_from(&running.drain_timeout);
    new_file
        .client_header_timeout
        .clone_from(&running.client_header_timeout);
    new_file.send_timeout.clone_from(&running.send_timeout);
    if !restart.is_empty() {
        let listeners = gw.boot.listeners_changed(&boot);
        tracing::warn!(settings = ?restart, ?listeners, "these settings changed but need a restart; the running values are kept");
    }
    let gone_routes: Vec<String> = old
        .routes
        .iter()
        .filter(|r| new.route(&r.name).is_none())
        .map(|r| r.name.to_string())
        .collect();
    let gone_limits: Vec<(String, String)> = old
        .routes
        .iter()
        .flat_map(|r| r.limits.iter().map(move |l| (r, l)))
        .filter(|(r, l)| {
            new.route(&r.name)
                .is_none_or(|nr| !nr.limits.iter().any(|nl| nl.name == l.name))
        })
        .map(|(r, l)| (r.name.to_string(), l.name.to_string()))
        .collect();
    // A kept limit whose settling changed (charged by the answer, a concurrency limit,
    // neither) loses the series of what it no longer does.
    let unsettled: Vec<(String, String, bool)> = old
        .routes
        .iter()
        .flat_map(|r| r.limits.iter().map(move |l| (r, l)))
        .filter_map(|(r, l)| {
            let now = new
                .route(&r.name)?
                .limits
                .iter()
                .find(|n| n.name == l.name)?;
            if std::mem::discriminant(&now.charge) == std::mem::discriminant(&l.charge) {
                return None;
            }
            let by_answer = match l.charge {
                Charge::Request => return None,
                Charge::Answer { .. } => true,
                Charge::InFlight => false,
            };
            Some((r.name.to_string(), l.name.to_string(), by_answer))
        })
        .collect();
    let gone_plans: Vec<String> = old
        .consumers
        .plans
        .iter()
        .filter(|p| !new.consumers.plans.iter().any(|n| n.name == p.name))
        .map(|p| p.name.to_string())
        .chain(
            (old.consumers.anonymous.is_some() && new.consumers.anonymous.is_none())
                .then(|| crate::model::consumer::ANONYMOUS.to_string()),
        )
        .collect();
    let version = new.version.clone();
    gw.live.store(Arc::new(Live::new(
        new,
        new_file,
        &tls.upstreams,
        Some(&old_live),
        &gw.metrics,
        gw.boot.workers,
    )));
    // New handshakes get the new certificates; open connections keep theirs. A listener is
    // matched by address (one whose TLS was switched on or off waits for a restart).
    for (i, resolver) in gw.certificates.iter().enumerate() {
        let loaded = successor(&gw.boot, &boot, i).and_then(|j| tls.listeners.get(j)?.as_ref());
        if let (Some(resolver), Some(set)) = (resolver, loaded) {
            resolver.swap(set.clone());
        }
    }
    gw.publish_certificates();
    // A rate edit keeps a limit's keys but changes what they admit.
    if let Some(deny) = &gw.deny {
        deny.clear();
    }
    gw.metrics.forget(&gone_routes, &gone_limits);
    gw.metrics.forget_settled(&unsettled);
    gw.metrics.forget_plans(&gone_plans);
    gw.metrics.set_config_version(Some(&old.version), &version);
    version
}

/// The running listeners as `/admin/config` shows them while a changed listener set waits for
/// a restart: each as it runs, but listing the certificates it serves from now on, those of
/// the new file's TLS listener at the same address (swapped in by [`apply`]). Matched by
/// address: the shown list may be in another order than the boot's (a reload may have
/// reordered it, which needs no restart).
fn served_listeners(running: &File, new: &File, new_boot: &Boot) -> Listen {
    let mut shown = running.listen.clone();
    let (Listen::List(shown_list), Listen::List(new_list)) = (&mut shown, &new.listen) else {
        return shown;
    };
    // A file's listeners and its compiled ones are in the same order.
    for l in shown_list.iter_mut() {
        let at = l.address.parse::<std::net::SocketAddr>().ok();
        let next = new_boot
            .listeners
            .iter()
            .position(|n| Some(n.address) == at)
            .and_then(|j| new_list.get(j)?.tls.as_ref());
        if let (Some(tls), Some(n)) = (&mut l.tls, next) {
            tls.certificates.clone_from(&n.certificates);
        }
    }
    shown
}

/// The index in `new` of the listener that takes over `running`'s listener `i`: the one at
/// the same address (a listener's certificates are swapped live; the set waits for a restart).
fn successor(running: &Boot, new: &Boot, i: usize) -> Option<usize> {
    let at = running.listeners.get(i)?.address;
    new.listeners.iter().position(|l| l.address == at)
}

/// A read error the file is not the cause of.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN)
    )
}

/// What the last file event saw: a hash of the config text and of the bytes of the files it
/// reads, and those files.
pub struct Seen {
    pub hash: String,
    pub files: Vec<PathBuf>,
}

impl Seen {
    /// The config at `path`, as loaded into `file`, and the files it reads.
    pub fn of(path: &Path, file: &config::file::File) -> Seen {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let files = config::compile::watched_files(&path.display().to_string(), file);
        Seen {
            hash: fingerprint_of(&text, &files),
            files,
        }
    }
}

/// A hash of `text` and the bytes of `files` (a file that cannot be read counts as empty:
/// its coming back is a change).
fn fingerprint_of(text: &str, files: &[PathBuf]) -> String {
    config::content_hash(text, files, 8)
}

/// Watch the directories of `files` too (certificates and consumers may live apart from the
/// config; watching a directory twice is harmless).
fn watch_dirs(gw: &Runtime, files: &[PathBuf]) {
    let mut watcher = gw.watcher.lock();
    let Some(w) = watcher.as_mut() else { return };
    for dir in files.iter().flat_map(|f| chain_dirs(f)) {
        if let Err(e) = w.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a directory the config reads from; reload with SIGHUP or POST /admin/reload");
        }
    }
}

/// Watch the config file's directory (and those of the certificates it names) and SIGHUP;
/// reload on either until the process ends.
pub fn spawn_watchers(gw: Arc<Runtime>) -> notify::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<notify::Event>();
    let mut watcher =
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
            Ok(e) if !e.kind.is_access() || closed_after_writing(&e.kind) => {
                let _ = tx.send(e);
            }
            _ => {}
        })?;
    for dir in chain_dirs(&gw.config_path) {
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    }
    *gw.watcher.lock() = Some(watcher);
    let files = gw.last_seen.lock().files.clone();
    watch_dirs(&gw, &files);
    let file_gw = gw.clone();
    tokio::spawn(async move {
        let mut writes = Writes::default();
        while let Some(ev) = rx.recv().await {
            let names = watched_names(&file_gw);
            writes.note(&ev, &names);
            // Let a burst of events (write, chmod, rename) settle, and a file being written in
            // place be closed by its writer, then look once.
            let first = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                while let Ok(ev) = rx.try_recv() {
                    writes.note(&ev, &names);
                }
                if writes.open.is_empty() || first.elapsed() >= WRITE_WAIT {
                    break;
                }
            }
            writes.open.clear();
            let gw = file_gw.clone();
            let _ = tokio::task::spawn_blocking(move || reload(&gw, Trigger::File)).await;
        }
    });
    // Installed before returning (not inside the task), so a SIGHUP that arrives as soon as
    // the caller opens its ports reloads instead of terminating the process.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let gw = gw.clone();
            let _ = tokio::task::spawn_blocking(move || reload(&gw, Trigger::Signal)).await;
        }
    });
    Ok(())
}

/// How long a file event waits, at most, for a file the config reads that is being written in
/// place to be closed by its writer.
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// inotify's "closed after writing" (`IN_CLOSE_WRITE`).
fn closed_after_writing(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
    )
}

/// The files the config reads that a writer has open: written to (`IN_MODIFY`) and not yet
/// closed. A writer that truncates the file and writes it in parts (`cat > sluice.yaml`, an
/// editor saving in place, a script) can pause between them, and what it wrote so far may be
/// a valid config that lacks its last routes: a reload waits for the close. Rename-over and
/// symlink swaps write nothing in place and are looked at as before.
#[derive(Default)]
struct Writes {
    open: HashSet<PathBuf>,
}

impl Writes {
    /// Take `ev` into account; `names` are the file names of the files the config reads (a
    /// log written beside the config in its directory holds up nothing).
    fn note(&mut self, ev: &notify::Event, names: &[OsString]) {
        let ours = ev
            .paths
            .iter()
            .filter(|p| p.file_name().is_some_and(|n| names.iter().any(|m| m == n)));
        for p in ours {
            match ev.kind {
                EventKind::Modify(ModifyKind::Data(_)) => {
                    self.open.insert(p.clone());
                }
                EventKind::Modify(ModifyKind::Name(_)) | EventKind::Remove(_) => {
                    self.open.remove(p);
                }
                kind if closed_after_writing(&kind) => {
                    self.open.remove(p);
                }
                _ => {}
            }
        }
    }
}

/// The file names of the config and of the files it reads.
fn watched_names(gw: &Runtime) -> Vec<OsString> {
    let seen = gw.last_seen.lock();
    std::iter::once(gw.config_path.as_path())
        .chain(seen.files.iter().map(PathBuf::as_path))
        .filter_map(|p| p.file_name().map(OsString::from))
        .collect()
}

/// The directories to watch for `path`: its own, and those of every link it resolves
/// through (at most 8), so that a change behind a symlink into another directory is seen: a
/// config linked from `/etc` into a deploy tree, certbot's `live/` links into `archive/`.
fn chain_dirs(path: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![watch_dir(path)];
    let mut at = path.to_path_buf();
    for _ in 0..8 {
        let Ok(next) = std::fs::read_link(&at) else {
            break;
        };
        at = watch_dir(&at).join(next);
        let dir = watch_dir(&at);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

fn watch_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, DataChange, RenameMode};

    use super::*;

    fn event(kind: EventKind, path: &str) -> notify::Event {
        notify::Event::new(kind).add_path(PathBuf::from(path))
    }

    const WRITE: EventKind = EventKind::Modify(ModifyKind::Data(DataChange::Any));
    const CLOSE: EventKind = EventKind::Access(AccessKind::Close(AccessMode::Write));

    #[test]
    fn a_file_the_config_reads_is_open_from_its_first_write_to_its_close() {
        let names = [OsString::from("sluice.yaml"), OsString::from("tls.pem")];
        let mut w = Writes::default();
        w.note(&event(WRITE, "/etc/sluice/sluice.yaml"), &names);
        w.note(&event(WRITE, "/etc/tls/tls.pem"), &names);
        assert_eq!(w.open.len(), 2);
        w.note(&event(CLOSE, "/etc/sluice/sluice.yaml"), &names);
        assert_eq!(w.open.len(), 1, "the certificate is still being written");
        w.note(
            &event(
                EventKind::Remove(notify::event::RemoveKind::File),
                "/etc/tls/tls.pem",
            ),
            &names,
        );
        assert!(w.open.is_empty(), "a removed file is written no more");
    }

    #[test]
    fn other_files_and_other_events_hold_nothing_up() {
        let names = [OsString::from("sluice.yaml")];
        let mut w = Writes::default();
        // A log appended beside the config, an editor's swap file, a rename-over, a new file.
        w.note(&event(WRITE, "/etc/sluice/access.log"), &names);
        w.note(&event(WRITE, "/etc/sluice/.sluice.yaml.swp"), &names);
        w.note(
            &event(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                "/etc/sluice/sluice.yaml",
            ),
            &names,
        );
        w.note(
            &event(
                EventKind::Create(CreateKind::File),
                "/etc/sluice/sluice.yaml",
            ),
            &names,
        );
        assert!(w.open.is_empty(), "{:?}", w.open);
        assert!(closed_after_writing(&CLOSE) && !closed_after_writing(&WRITE));
    }
}
