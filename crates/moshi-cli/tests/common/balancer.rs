//! HAProxy (Debian's package) running the documented configuration, docs/examples/haproxy.cfg,
//! in front of `moshi-rs serve` replicas on loopback: the balancer of the HAProxy and client tests.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::serve::root;

/// Whether haproxy is installed; if not, `test` says SKIPPED (and fails where `CI` is set).
pub fn haproxy_present(test: &str) -> bool {
    if moshi_test_support::command_exists("haproxy") {
        return true;
    }
    let message =
        format!("{test}: haproxy not installed (run `bash scripts/setup.sh --serve-e2e`)");
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set, so haproxy must be installed: {message}"
    );
    eprintln!("SKIPPED {message}");
    false
}

/// HAProxy running the documented configuration; killed when dropped.
pub struct Balancer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Balancer {
    /// HAProxy with docs/examples/haproxy.cfg in front of `replicas` (three addresses; one
    /// may be listed several times).
    pub fn start(replicas: &[&str]) -> Balancer {
        let config = root().join("docs/examples/haproxy.cfg");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut command = Command::new("haproxy");
        command.env("MOSHI_LB_BIND", &addr);
        for (i, r) in replicas.iter().enumerate() {
            command.env(format!("MOSHI_REPLICA_{}", i + 1), r);
        }
        let check = command
            .args(["-c", "-f"])
            .arg(&config)
            .output()
            .expect("run haproxy -c");
        assert!(
            check.status.success(),
            "haproxy -c: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let mut command = Command::new("haproxy");
        command.env("MOSHI_LB_BIND", &addr);
        for (i, r) in replicas.iter().enumerate() {
            command.env(format!("MOSHI_REPLICA_{}", i + 1), r);
        }
        let child = command
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        let balancer = Balancer { child, addr };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(&balancer.addr).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "haproxy did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        balancer
    }

    /// Its `/api/chat` websocket URL.
    pub fn url(&self) -> String {
        format!("ws://{}/api/chat", self.addr)
    }
}
