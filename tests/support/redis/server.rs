//! A standalone `redis-server` ([`RedisServer`]) on a free loopback port with its files in
//! a tempdir: start (with extra arguments), kill, restart on the same port, and its log.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::process::{
    is_pong, kill_child, port_taken, process_log, stdio_file, wait_ready, Ready, READY_TIMEOUT,
    START_ATTEMPTS,
};
use super::redis_server_bin;
use super::resp::Conn;
use crate::support::free_port;

/// A `redis-server` on a free port with no persistence, its files in `dir`. Killed on drop.
pub struct RedisServer {
    pub port: u16,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Start with extra `redis-server` arguments (e.g. `&["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::launch(|_| extra.iter().map(|s| s.to_string()).collect())
    }

    /// Start on a fresh port and tempdir, retrying on another port when the chosen one
    /// was taken between [`free_port`] and Redis binding it. `extra` gets the tempdir.
    pub(super) fn launch(extra: impl Fn(&Path) -> Vec<String>) -> RedisServer {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let d = dir.path();
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "yes",
                "--dir",
                &d.to_string_lossy(),
                "--logfile",
                &d.join("redis.log").to_string_lossy(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra(d));
            let mut server = RedisServer {
                port,
                dir,
                args,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) if port_taken(&log) && attempt < START_ATTEMPTS => continue,
                Err(log) => panic!("redis-server on port {port} failed to start:\n{log}"),
            }
        }
    }

    /// Spawn with `self.args` and wait for PONG. `Err(log)` if the process exited.
    fn spawn(&mut self) -> Result<(), String> {
        let (out, err) = stdio_file(&self.dir.path().join("stdio.log"));
        let child = Command::new(redis_server_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn redis-server");
        // Owned by `self` before waiting, so a panic below still kills it (Drop).
        self.child = Some(child);
        let port = self.port;
        match wait_ready(self.child.as_mut().unwrap(), port, READY_TIMEOUT, is_pong) {
            Ready::Yes => Ok(()),
            Ready::Exited(status) => {
                self.child = None;
                Err(format!("exited with {status}\n{}", self.log()))
            }
            Ready::TimedOut => panic!(
                "redis-server on port {port} did not answer PING within {READY_TIMEOUT:?}:\n{}",
                self.log()
            ),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> Conn {
        Conn::connect(self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL (no shutdown, no save) and reap. A no-op if not running.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// Start again on the same port and dir (killing it first if running); waits for PONG.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn() {
            panic!(
                "redis-server failed to restart on port {}:\n{log}",
                self.port
            );
        }
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                kill_child(&mut self.child);
                false
            }
            None => false,
        }
    }

    /// The server's log file, plus anything it printed to stdout/stderr.
    pub fn log(&self) -> String {
        process_log(self.dir.path(), &self.dir.path().join("redis.log"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

// ---------------------------------------------------------------------------------------
// Cluster
