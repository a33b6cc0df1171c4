//! A TCP relay in front of a Redis server that can go silent on the connections it carries,
//! as a peer does that vanished without a reset (a failover behind a virtual IP, a NAT or
//! firewall entry dropped): those connections stay open and their bytes are acknowledged by
//! the kernel, but nothing is forwarded either way any more. Connections made afterwards are
//! relayed as before.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct SilentRelay {
    pub port: u16,
    /// One flag per connection relayed so far: set, that connection forwards nothing.
    open: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl SilentRelay {
    /// Relay 127.0.0.1:(a free port) to 127.0.0.1:`target`.
    pub fn start(target: u16) -> SilentRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let port = listener.local_addr().unwrap().port();
        let open: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let list = open.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let silent = Arc::new(AtomicBool::new(false));
                list.lock().unwrap().push(silent.clone());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let silent = silent.clone();
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // Silent: keep reading (the kernel acknowledges), forward nothing,
                            // close nothing.
                            if silent.load(Ordering::SeqCst) {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        if !silent.load(Ordering::SeqCst) {
                            let _ = to.shutdown(Shutdown::Both);
                        }
                    });
                }
            }
        });
        SilentRelay { port, open }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every connection relayed so far goes silent; returns how many there were.
    pub fn silence_open(&self) -> usize {
        let open = self.open.lock().unwrap();
        for c in open.iter() {
            c.store(true, Ordering::SeqCst);
        }
        open.len()
    }
}
