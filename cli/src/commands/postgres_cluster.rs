//! A private Postgres cluster for `verity up`: made with the machine's `initdb`, started with
//! `pg_ctl` on a unix socket only, and stopped when the [`PrivateCluster`] is dropped.

use anyhow::{anyhow, bail, Context};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The database Verity uses inside the cluster.
pub const DATABASE: &str = "verity";
/// The cluster's superuser.
const SUPERUSER: &str = "verity";
/// Port number in the socket's name (`.s.PGSQL.<port>`); nothing listens on TCP.
const PORT: u16 = 5432;
/// Longest unix socket path the kernel accepts (`sun_path` holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Test-only override of the directories searched for the binaries (PATH is searched too).
pub const BIN_DIR_ENV: &str = "VERITY_PG_BIN_DIRS";

/// The PostgreSQL server binaries.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    /// `initdb`.
    pub initdb: PathBuf,
    /// `pg_ctl`.
    pub pg_ctl: PathBuf,
}

/// Finds `initdb`, `pg_ctl` and `postgres` together on PATH or under
/// `/usr/lib/postgresql/*/bin` (highest version first).
pub fn find_binaries() -> anyhow::Result<PgBinaries> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    let roots: Vec<PathBuf> = match std::env::var_os(BIN_DIR_ENV) {
        Some(v) => std::env::split_paths(&v).collect(),
        None => vec![PathBuf::from("/usr/lib/postgresql")],
    };
    for root in roots {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(&root)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let version = e
                            .file_name()
                            .to_string_lossy()
                            .split('.')
                            .next()?
                            .parse::<u32>()
                            .ok()?;
                        Some((version, e.path().join("bin")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        versions.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
        dirs.extend(versions.into_iter().map(|(_, dir)| dir));
        dirs.push(root);
    }
    for dir in dirs {
        let (initdb, pg_ctl, postgres) =
            (dir.join("initdb"), dir.join("pg_ctl"), dir.join("postgres"));
        if initdb.is_file() && pg_ctl.is_file() && postgres.is_file() {
            return Ok(PgBinaries { initdb, pg_ctl });
        }
    }
    bail!(
        "PostgreSQL's server programs (initdb, pg_ctl, postgres) were not found on PATH or under /usr/lib/postgresql/*/bin.\n\
         Install them (Debian/Ubuntu: `sudo apt install postgresql`; macOS: `brew install postgresql@16`),\n\
         or point Verity at an existing server with DATABASE_URL=postgres://user@host/db"
    )
}

/// A running private cluster; dropping it stops the server (`pg_ctl stop -m fast`).
#[derive(Debug)]
pub struct PrivateCluster {
    bins: PgBinaries,
    data: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<String>,
    running: bool,
}

impl PrivateCluster {
    /// Creates the cluster in `dir` (`dir/data`, socket in `dir/run`) when missing, and starts it.
    pub fn start(dir: &Path) -> anyhow::Result<PrivateCluster> {
        let bins = find_binaries()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))?;
        let socket_dir = dir.join("run");
        let socket = socket_dir.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            bail!(
                "the Postgres socket path {} is longer than {MAX_SOCKET_PATH} bytes (the unix socket limit); \
                 use a shorter --data-dir",
                socket.display()
            );
        }
        std::fs::create_dir_all(&socket_dir)
            .with_context(|| format!("creating {}", socket_dir.display()))?;
        let run_as = if is_root() { Some(unprivileged_user()?) } else { None };
        let mut cluster =
            PrivateCluster { bins, data: dir.join("data"), socket_dir, run_as, running: false };
        if let Some(user) = &cluster.run_as {
            make_traversable(&dir)?;
            run(Command::new("chown").arg("-R").arg(format!("{user}:")).arg(&dir), "chown")?;
        }
        if !cluster.data.join("PG_VERSION").is_file() {
            cluster.initdb()?;
        }
        cluster.write_settings()?;
        cluster.clear_stale_pid()?;
        if cluster.status_running() {
            tracing::info!(data = %cluster.data.display(), "the private Postgres cluster is already running; reusing it");
        } else {
            let log = dir.join("postgres.log");
            let mut start = cluster.pg_ctl();
            start.arg("start").arg("-w").arg("-t").arg("120").arg("-l").arg(&log);
            run(&mut start, "pg_ctl start")
                .with_context(|| format!("starting Postgres (log: {})", log.display()))?;
        }
        cluster.running = true;
        Ok(cluster)
    }

    /// Connection options for `database` over the socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        socket_options(&self.socket_dir, database)
    }

    /// A `DATABASE_URL` for the `verity` database over the socket.
    pub fn database_url(&self) -> String {
        self.connect_options(DATABASE).to_url_lossy().to_string()
    }

    /// Creates the `verity` database when missing.
    pub async fn ensure_database(&self) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .context("connecting to the private Postgres cluster")?;
        verity_core::db::create_database_if_missing(&mut conn, DATABASE)
            .await
            .context("creating the database")?;
        conn.close().await?;
        Ok(())
    }

    /// Stops the server (fast shutdown); a no-op once stopped.
    pub fn stop(&mut self) {
        self.stop_with("fast");
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`: no checkpoint,
    /// crash recovery at the next start); a no-op once stopped. For fault tests.
    pub fn stop_immediately(&mut self) {
        self.stop_with("immediate");
    }

    fn stop_with(&mut self, mode: &str) {
        if !std::mem::take(&mut self.running) {
            return;
        }
        let mut stop = self.pg_ctl();
        stop.arg("stop").arg("-m").arg(mode).arg("-w").arg("-t").arg("60");
        match run(&mut stop, "pg_ctl stop") {
            Ok(()) => tracing::info!("private Postgres cluster stopped"),
            Err(err) if !self.status_running() => {
                tracing::debug!(error = %err, "Postgres was already stopped")
            }
            Err(err) => {
                tracing::warn!(error = %err, "stopping the private Postgres cluster failed")
            }
        }
    }

    fn initdb(&self) -> anyhow::Result<()> {
        tracing::info!(data = %self.data.display(), "creating a private Postgres cluster");
        let mut initdb = self.as_owner(&self.bins.initdb);
        initdb
            .arg("-D")
            .arg(&self.data)
            .arg("-U")
            .arg(SUPERUSER)
            .arg("--auth=trust")
            .arg("--encoding=UTF8")
            .arg("--locale=C");
        run(&mut initdb, "initdb")
    }

    /// Unix socket only, in our own directory; rewritten at every start so a moved data dir works.
    fn write_settings(&self) -> anyhow::Result<()> {
        let conf = self.data.join("postgresql.conf");
        let text = std::fs::read_to_string(&conf)
            .with_context(|| format!("reading {}", conf.display()))?;
        let include = "include_if_exists = 'verity.conf'";
        if !text.contains(include) {
            std::fs::write(&conf, format!("{text}\n{include}\n"))
                .with_context(|| format!("writing {}", conf.display()))?;
        }
        let socket = self.socket_dir.to_string_lossy().replace('\'', "''");
        let settings =
            format!("listen_addresses = ''\nunix_socket_directories = '{socket}'\nport = {PORT}\n");
        let path = self.data.join("verity.conf");
        std::fs::write(&path, settings).with_context(|| format!("writing {}", path.display()))?;
        if let Some(user) = &self.run_as {
            run(Command::new("chown").arg(format!("{user}:")).arg(&path).arg(&conf), "chown")?;
        }
        Ok(())
    }

    /// Removes a `postmaster.pid` whose process is not a running postgres (a crash or reboot).
    fn clear_stale_pid(&self) -> anyhow::Result<()> {
        let pid_file = self.data.join("postmaster.pid");
        let Ok(text) = std::fs::read_to_string(&pid_file) else { return Ok(()) };
        let pid = text.lines().next().unwrap_or("").trim();
        let alive = !pid.is_empty()
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres");
        if !alive && Path::new("/proc/self").exists() {
            tracing::warn!(pid, "removing a stale postmaster.pid");
            std::fs::remove_file(&pid_file)
                .with_context(|| format!("removing {}", pid_file.display()))?;
        }
        Ok(())
    }

    fn status_running(&self) -> bool {
        let mut status = self.pg_ctl();
        status.arg("status");
        status.output().is_ok_and(|o| o.status.success())
    }

    fn pg_ctl(&self) -> Command {
        let mut command = self.as_owner(&self.bins.pg_ctl);
        command.arg("-D").arg(&self.data);
        command
    }

    /// `program`, run as the cluster's owner (`runuser -u USER --` when we are root).
    fn as_owner(&self, program: &Path) -> Command {
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.arg("-u").arg(user).arg("--").arg(program);
                command.current_dir("/");
                command
            }
            None => Command::new(program),
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `DATABASE_URL` of the `verity` database of the private cluster made in `dir` (e.g. for
/// `verity models import` next to a running `verity up`).
pub fn database_url_for(dir: &Path) -> String {
    socket_options(&dir.join("run"), DATABASE).to_url_lossy().to_string()
}

fn socket_options(socket_dir: &Path, database: &str) -> PgConnectOptions {
    PgConnectOptions::new().socket(socket_dir).port(PORT).username(SUPERUSER).database(database)
}

/// Runs `command`, failing with its output when it exits non-zero.
fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command.output().with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        return Err(anyhow!(
            "{what} failed ({}): {}{}",
            output.status,
            stderr.trim(),
            stdout.trim()
        ));
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// initdb refuses to run as root: the cluster belongs to `postgres` (or `nobody`).
fn unprivileged_user() -> anyhow::Result<String> {
    for user in ["postgres", "nobody"] {
        if Command::new("id").arg("-u").arg(user).output().is_ok_and(|o| o.status.success()) {
            return Ok(user.to_string());
        }
    }
    bail!("running as root, and neither a `postgres` nor a `nobody` user exists to own the private Postgres cluster")
}

/// Lets the cluster's owner reach `dir`: every ancestor must be searchable by others.
fn make_traversable(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for ancestor in dir.ancestors().skip(1) {
        let meta = std::fs::metadata(ancestor)
            .with_context(|| format!("reading {}", ancestor.display()))?;
        let mode = meta.permissions().mode();
        if mode & 0o001 == 0 {
            // Verity's own data dir (the cluster's parent) gets search-only access for others.
            if dir.parent() == Some(ancestor) {
                std::fs::set_permissions(ancestor, std::fs::Permissions::from_mode(mode | 0o011))
                    .with_context(|| format!("making {} searchable", ancestor.display()))?;
            } else {
                bail!(
                    "the private Postgres cluster runs as an unprivileged user, which cannot reach {} (mode {:o}); \
                     choose a --data-dir elsewhere or set DATABASE_URL",
                    ancestor.display(),
                    mode & 0o777
                );
            }
        }
    }
    Ok(())
}
