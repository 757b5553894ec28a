//! Child processes, for the harness and for the process tests: the one
//! place that spawns them.
//!
//! A [`Child`] is started from a [`Command`] (optionally inside a network
//! namespace, optionally dying with this process even when it is killed
//! outright), its output either discarded, inherited, written to a log file
//! or collected line by line — parsed as it arrives, by a reader thread, so
//! a waiter only scans what came. It is killed and reaped when dropped, also
//! when a test panics or an experiment fails half-way.
//!
//! Built on `std::process` (reader threads, no runtime), so synchronous
//! tests and the async harness share it: waiting has a blocking form
//! ([`Child::wait_for`]) and an async one ([`Child::wait_for_async`]).
//! Commands that run to completion (`ip`, `nft`, `ss`) go through [`run`]
//! and [`run_with_input`].

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How often a waiter looks at the collected lines.
const POLL: Duration = Duration::from_millis(2);

/// Where a child's stdout or stderr goes.
#[derive(Debug, Clone)]
pub enum Output {
    /// Discarded.
    Null,
    /// This process's own stream.
    Inherit,
    /// A log file (created; stdout and stderr may share one).
    Log(PathBuf),
    /// Collected line by line (see [`Child::lines`]).
    Lines,
}

/// What to start; [`Command::spawn`] starts it.
#[derive(Debug)]
pub struct Command {
    name: String,
    program: OsString,
    args: Vec<OsString>,
    netns: Option<String>,
    env: Vec<(OsString, OsString)>,
    stdin: bool,
    stdout: Output,
    stderr: Output,
    die_with_parent: bool,
}

impl Command {
    /// `program`, called `name` in errors; no stdin, stdout discarded,
    /// stderr inherited.
    pub fn new(name: impl Into<String>, program: impl AsRef<OsStr>) -> Command {
        Command {
            name: name.into(),
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            netns: None,
            env: Vec::new(),
            stdin: false,
            stdout: Output::Null,
            stderr: Output::Inherit,
            die_with_parent: false,
        }
    }

    /// One more argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Command {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// More arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Command {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Runs it inside network namespace `ns` (`ip netns exec`), if given.
    pub fn netns(mut self, ns: Option<&str>) -> Command {
        self.netns = ns.map(str::to_owned);
        self
    }

    /// An environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Command {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// A pipe to its stdin, for [`Child::send_line`].
    pub fn stdin(mut self) -> Command {
        self.stdin = true;
        self
    }

    /// Where its stdout goes.
    pub fn stdout(mut self, o: Output) -> Command {
        self.stdout = o;
        self
    }

    /// Where its stderr goes.
    pub fn stderr(mut self, o: Output) -> Command {
        self.stderr = o;
        self
    }

    /// Both streams into the log file `path`.
    pub fn log(self, path: impl Into<PathBuf>) -> Command {
        let path = path.into();
        self.stdout(Output::Log(path.clone()))
            .stderr(Output::Log(path))
    }

    /// Its own process group (a terminal's Ctrl-C reaches only us, and we
    /// stop it) and, where util-linux's `setpriv` is installed, a
    /// parent-death signal: it dies with this process even if this one is
    /// killed outright.
    pub fn die_with_parent(mut self) -> Command {
        self.die_with_parent = true;
        self
    }

    /// Starts it, collecting [`Output::Lines`] as text.
    pub fn spawn(self) -> Result<Child<String>> {
        self.spawn_parsed(|l| Some(l.to_owned()))
    }

    /// Starts it, collecting the [`Output::Lines`] that `parse` accepts
    /// (each line is parsed once, as it arrives).
    pub fn spawn_parsed<T: Send + 'static>(self, parse: fn(&str) -> Option<T>) -> Result<Child<T>> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip", "netns", "exec"].map(OsString::from));
            argv.push(ns.into());
        }
        if self.die_with_parent {
            if let Some(setpriv) = crate::host::find_program("setpriv", &[]) {
                argv.push(setpriv.into());
                argv.extend(["--pdeathsig", "KILL", "--"].map(OsString::from));
            }
        }
        argv.push(self.program.clone());
        argv.extend(self.args.iter().cloned());
        let shown = || {
            argv.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut logs: Vec<(PathBuf, std::fs::File)> = Vec::new();
        let mut stdio = |o: &Output| -> Result<Stdio> {
            Ok(match o {
                Output::Null => Stdio::null(),
                Output::Inherit => Stdio::inherit(),
                Output::Lines => Stdio::piped(),
                Output::Log(p) => {
                    let f = match logs.iter().find(|(q, _)| q == p) {
                        Some((_, f)) => f.try_clone()?,
                        None => {
                            let f = std::fs::File::create(p)
                                .with_context(|| format!("creating {}", p.display()))?;
                            logs.push((p.clone(), f.try_clone()?));
                            f
                        }
                    };
                    Stdio::from(f)
                }
            })
        };
        cmd.stdout(stdio(&self.stdout)?)
            .stderr(stdio(&self.stderr)?);
        if self.die_with_parent {
            use std::os::unix::process::CommandExt as _;
            cmd.process_group(0);
        }
        let mut process = cmd
            .spawn()
            .with_context(|| format!("starting {}: {}", self.name, shown()))?;
        let lines = Arc::new(Lines {
            got: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
        });
        if let Some(out) = process.stdout.take() {
            lines.read(out, parse);
        }
        if let Some(err) = process.stderr.take() {
            lines.read(err, parse);
        }
        Ok(Child {
            name: self.name,
            pid: process.id(),
            stdin: process.stdin.take(),
            process: Mutex::new(process),
            lines,
        })
    }
}

/// Lines collected from a child's piped streams.
struct Lines<T> {
    got: Mutex<Vec<T>>,
    /// Streams still open (each reader counts itself out at EOF).
    open: AtomicUsize,
}

impl<T: Send + 'static> Lines<T> {
    fn read(self: &Arc<Self>, stream: impl Read + Send + 'static, parse: fn(&str) -> Option<T>) {
        self.open.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(v) = parse(&line) {
                    me.got.lock().push(v);
                }
            }
            me.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// A running child process, killed and reaped when dropped.
pub struct Child<T = String> {
    name: String,
    pid: u32,
    stdin: Option<std::process::ChildStdin>,
    process: Mutex<std::process::Child>,
    lines: Arc<Lines<T>>,
}

impl<T> std::fmt::Debug for Child<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl<T: Clone> Child<T> {
    /// Its name (as given to [`Command::new`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Writes `line` and a newline to its stdin ([`Command::stdin`]).
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .with_context(|| format!("{} has no stdin pipe", self.name))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .with_context(|| format!("sending {line:?} to {} ({})", self.name, self.pid))
    }

    /// Every collected line so far.
    pub fn lines(&self) -> Vec<T> {
        self.lines.got.lock().clone()
    }

    /// The first collected line `pred` accepts, if one came.
    pub fn find(&self, pred: impl Fn(&T) -> bool) -> Option<T> {
        self.lines.got.lock().iter().find(|v| pred(v)).cloned()
    }

    /// Whether its collected streams are closed (it exited, or closed
    /// them): no more lines will come.
    fn closed(&self) -> bool {
        self.lines.open.load(Ordering::SeqCst) == 0
    }

    /// One look: `Some(Some(v))` found, `Some(None)` never will be (the
    /// streams closed or the time is up), `None` keep waiting.
    fn look(&self, deadline: Instant, pred: &impl Fn(&T) -> bool) -> Option<Option<T>> {
        let closed = self.closed();
        if let Some(v) = self.find(pred) {
            return Some(Some(v));
        }
        (closed || Instant::now() >= deadline).then_some(None)
    }

    /// The first collected line `pred` accepts, waiting (blocking) up to
    /// `timeout`; `None` when none came in time or the streams closed.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&T) -> bool) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.look(deadline, &pred) {
                return v;
            }
            std::thread::sleep(POLL);
        }
    }

    /// [`Child::wait_for`] for async callers (sleeps on the runtime's
    /// timer, never blocks a worker).
    pub async fn wait_for_async(&self, timeout: Duration, pred: impl Fn(&T) -> bool) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.look(deadline, &pred) {
                return v;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Fails if it exited.
    pub fn check(&self) -> Result<()> {
        if let Some(status) = self.exited() {
            bail!("{} exited ({status})", self.name);
        }
        Ok(())
    }

    /// Its exit status, if it exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.process.lock().try_wait().ok().flatten()
    }

    /// SIGKILL now, and reap it.
    pub fn kill(&self) {
        let mut p = self.process.lock();
        let _ = p.kill();
        let _ = p.wait();
    }

    /// Waits (async) up to `within` for it to exit and for its streams to
    /// close, then kills it if it has not exited.
    pub async fn wait_or_kill(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.exited().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.kill();
        // The reader threads take the last lines.
        let deadline = Instant::now() + Duration::from_millis(200);
        while !self.closed() && Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (blocking) for it to exit, and for the reader threads to take
    /// its last lines (a grandchild holding its streams open is given 5 s).
    pub fn wait(&self) -> Result<ExitStatus> {
        let status = self
            .process
            .lock()
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.closed() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        Ok(status)
    }
}

impl<T> Drop for Child<T> {
    fn drop(&mut self) {
        let p = self.process.get_mut();
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// Runs `argv` to completion; its stdout, or an error with its stderr.
pub fn run(argv: &[&str]) -> Result<String> {
    run_with_input(argv, None)
}

/// Runs `argv` to completion with `input` on its stdin (if given); its
/// stdout, or an error with its stderr.
pub fn run_with_input(argv: &[&str], input: Option<&str>) -> Result<String> {
    let out = output(argv, input)?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `argv` to completion with `input` on its stdin (if given): its
/// exit status, stdout and stderr, whatever the status.
pub fn output(argv: &[&str], input: Option<&str>) -> Result<std::process::Output> {
    let (program, args) = argv.split_first().context("an empty command")?;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .with_context(|| format!("writing to {}", argv.join(" ")))?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("running {}", argv.join(" ")))
}
