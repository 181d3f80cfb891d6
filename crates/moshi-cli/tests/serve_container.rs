//! The repository's `Dockerfile`, checked as far as it can be without building the image (no
//! container registry is reachable here, so its base images cannot be pulled: docs/serve.md):
//! the runtime user is not root, the `ENTRYPOINT`'s flags start a server (bound to loopback
//! instead of every interface, on a free port, with the tiny model in place of `CMD`'s), and
//! the `HEALTHCHECK` command, run as written but for the port, succeeds against it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::serve::{root, tiny_model};

fn dockerfile() -> String {
    std::fs::read_to_string(root().join("Dockerfile")).unwrap()
}

/// The JSON array after `instruction` on its line (exec form).
fn exec_form(text: &str, instruction: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{instruction} [")))
        .unwrap_or_else(|| panic!("no {instruction} [...] in the Dockerfile"));
    serde_json::from_str(&line[instruction.len()..]).unwrap()
}

/// The Dockerfile's logical lines (continuations joined).
fn joined_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for l in text.lines() {
        match l.trim_end().strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(l);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    lines
}

#[test]
fn the_image_runs_as_a_user_and_its_entrypoint_and_healthcheck_work() {
    let text = dockerfile();
    // The last stage runs as a non-root user.
    let user = text
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    let uid = user.split(':').next().unwrap().trim();
    assert!(uid != "root" && uid != "0", "USER {user}");
    assert!(
        text.contains("FROM rust:") && text.contains("AS build"),
        "multi-stage"
    );
    assert!(text.contains("--release"), "the release binary");

    let entrypoint = exec_form(&text, "ENTRYPOINT");
    assert_eq!(entrypoint[0], "moshi-rs");
    let mut args: Vec<String> = entrypoint[1..].to_vec();
    // Loopback and a free port here; the rest as written.
    for (flag, value) in [("--host", "127.0.0.1"), ("--port", "0")] {
        let i = args.iter().position(|a| a == flag).unwrap();
        args[i + 1] = value.to_string();
    }
    let model = tiny_model();
    args.extend(["--model", model.to_str().unwrap(), "--static", "none"].map(String::from));
    let mut server = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(&args)
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("moshi-rs serve: open ")
        .unwrap_or_else(|| panic!("the entrypoint's server printed {line:?}"))
        .to_string();
    let port = url.trim_end_matches('/').rsplit(':').next().unwrap();

    let healthcheck = joined_lines(&text)
        .into_iter()
        .find(|l| l.starts_with("HEALTHCHECK"))
        .expect("a HEALTHCHECK");
    let command = healthcheck
        .split_once(" CMD ")
        .expect("HEALTHCHECK ... CMD")
        .1
        .trim()
        .replace(":8998/", &format!(":{port}/"));
    assert!(command.contains("/api/health"), "{command}");
    if moshi_test_support::command_exists("curl") {
        let status = Command::new("sh").args(["-c", &command]).status().unwrap();
        assert!(status.success(), "{command}");
    } else {
        eprintln!("curl not installed: the HEALTHCHECK command itself not run");
    }
    // What the image's STOPSIGNAL sends: the server drains (no session) and exits 0.
    assert!(text.contains("STOPSIGNAL SIGTERM"));
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
