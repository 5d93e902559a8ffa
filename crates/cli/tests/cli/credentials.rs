//! The `keiro` binary never prints a password: every form of a connection string, passed as
//! `--database-url` or `DATABASE_URL` or through `PGPASSWORD`, against a closed port (the
//! connect error path) and malformed (the configuration error path), for the commands that
//! connect: `migrate`, an operator command and the demo.

use std::process::Command;

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound address").port()
}

/// Runs `keiro` with `args` (the URL passed by `how`) and returns its exit code and output.
fn keiro(url: &str, how: &str, envs: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keiro"));
    command.env_remove("DATABASE_URL").env_remove("PGPASSWORD");
    match how {
        "flag" => {
            command.arg("--database-url").arg(url);
        }
        _ => {
            command.env("DATABASE_URL", url);
        }
    }
    command.args(args).envs(envs.iter().copied());
    let output = command.output().expect("running keiro");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[test]
fn no_command_prints_a_password() {
    let port = closed_port();
    let forms: Vec<(String, Vec<&str>)> = vec![
        (
            format!("postgres://app:Hx7urlsecret@127.0.0.1:{port}/app"),
            vec!["Hx7urlsecret"],
        ),
        (
            format!("postgres://app:Pc%40t9enc@127.0.0.1:{port}/app?sslmode=require"),
            vec!["Pc%40t9enc", "Pc@t9enc", "t9enc"],
        ),
        (
            format!("postgres://app@127.0.0.1:{port}/app?password=Qp3query"),
            vec!["Qp3query"],
        ),
        (
            format!("host=127.0.0.1 port={port} user=postgres password = Sp5spaced"),
            vec!["Sp5spaced"],
        ),
        (
            format!(r"host=127.0.0.1 port={port} password='Qx9 Vz\'Kp7 ok' user=app"),
            vec!["Qx9", "Vz'Kp7", r"Vz\'Kp7", "Kp7 ok"],
        ),
        (
            format!("host=127.0.0.1 port={port} password=Un1readable port=notaport"),
            vec!["Un1readable"],
        ),
        (
            format!("host=127.0.0.1 port={port} password=Un2readable sslmode=verify-full sslrootcert=/nonexistent/root.crt"),
            vec!["Un2readable"],
        ),
    ];
    let commands: [&[&str]; 3] = [
        &["migrate"],
        &["show", "order", "order-1"],
        &["demo", "--workflows", "1"],
    ];
    for (url, secrets) in &forms {
        for how in ["flag", "env"] {
            for args in commands {
                let (code, text) = keiro(url, how, &[], args);
                assert_eq!(
                    code,
                    Some(2),
                    "{args:?} with {url} ({how}) should fail: {text}"
                );
                assert!(text.contains("error"), "{text}");
                for secret in secrets {
                    assert!(
                        !text.contains(secret),
                        "keiro {args:?} ({how}) printed {secret:?}: {text}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_password_from_pgpassword_is_used_and_never_printed() {
    let url = format!("host=127.0.0.1 port={} user=app dbname=app", closed_port());
    let (code, text) = keiro(
        &url,
        "flag",
        &[("PGPASSWORD", "Pg8envsecret")],
        &["migrate"],
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(!text.contains("Pg8envsecret"), "{text}");
    assert!(
        text.contains("password=***"),
        "PGPASSWORD was not read: {text}"
    );
}
